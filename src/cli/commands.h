// Subcommands of `deepinfer-lab`. Each lives in its own cmd_<name>.cpp and returns an exit code.
#pragma once

namespace dil::cli {
struct Command {
  const char* name;
  const char* help;
  int (*run)(int argc, char** argv);  // argv[0] is the subcommand name
};
// The table is defined in main.cpp; add a line there for a new command.
int cmd_inspect(int argc, char** argv);
int cmd_logits(int argc, char** argv);
int cmd_generate(int argc, char** argv);
int cmd_kv_report(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_render(int argc, char** argv);
int cmd_serve(int argc, char** argv);
int cmd_quality(int argc, char** argv);
}  // namespace dil::cli
