// deepinfer-lab: one binary, one subcommand per task (src/cli/app.h has the conventions).
#include <iostream>

#include "cli/commands.h"

int main(int argc, char** argv) {
  using namespace dil::cli;
  auto top = make_top_app("DeepInfer-Lab: DeepSeek V4 / V4.1 inference (CPU reference and CUDA sm_90a)");
  std::vector<Declared> commands;
  add_inspect(*top, &commands);
  add_logits(*top, &commands);
  add_generate(*top, &commands);
  add_kv_report(*top, &commands);
  add_bench(*top, &commands);
  add_tokenize(*top, &commands);
  add_render(*top, &commands);
  add_serve(*top, &commands);
  add_kernels_doc(*top, &commands);
  add_quality(*top, &commands);
  top->add_flag_callback(
      "--options-json",
      [&top] {
        std::cout << describe_options(*top).dump(1) << std::endl;
        throw CLI::Success();
      },
      "print every command's options with their defaults as JSON (for tests and tools), then exit");
  return parse_and_run(*top, commands, ProgramArgs{argc, argv});
}
