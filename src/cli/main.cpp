// deepinfer-lab: one binary, one subcommand per task.
#include <cstdio>
#include <cstring>
#include <exception>
#include <iterator>

#include "cli/commands.h"
#include "core/check.h"

namespace dil::cli {
namespace {
const Command kCommands[] = {
    {"inspect", "list a checkpoint's (or a config's expected) tensors and validate them", cmd_inspect},
    {"logits", "run the forward over token ids and write every position's logits (.npy)", cmd_logits},
    {"generate", "greedy generation from token ids", cmd_generate},
    {"kv-report", "KV cache bytes per token / per sequence slot of a model config", cmd_kv_report},
    {"bench", "prefill / decode / ceilings benchmarks on dummy weights", cmd_bench},
    {"tokenize", "encode/decode JSON lines with a tokenizer.json", cmd_tokenize},
    {"render", "render chat messages to the model's prompt string (or --parse completions)", cmd_render},
    {"quality", "held-out perplexity and greedy continuations of a trained checkpoint; --compare two runs", cmd_quality},
    {"serve", "OpenAI-compatible HTTP server (default: the bundled tiny-v4 model on the CPU)", cmd_serve},
};

int usage() {
  std::fprintf(stderr, "usage: deepinfer-lab <command> [options]\n\ncommands:\n");
  for (const auto& c : kCommands) std::fprintf(stderr, "  %-10s %s\n", c.name, c.help);
  return 2;
}
}  // namespace
}  // namespace dil::cli

int main(int argc, char** argv) {
  using namespace dil::cli;
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) return usage();
  for (const auto& c : kCommands) {
    if (std::strcmp(argv[1], c.name) == 0) {
      try {
        return c.run(argc - 1, argv + 1);
      } catch (const dil::Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
      }
    }
  }
  std::fprintf(stderr, "unknown command '%s'\n", argv[1]);
  return usage();
}
