// Subcommands of `deepinfer-lab`. Each lives in its own cmd_<name>.cpp: an options struct
// (the one copy of its defaults), the declaration of its options on a CLI11 subcommand, and
// what it runs. main.cpp lists them; add a line there for a new command.
#pragma once
#include <vector>

#include "cli/app.h"

namespace dil::cli {
// Each adds its subcommand (bench: its group and three subcommands) to `top` and appends the
// runnable commands to `out`.
void add_inspect(CLI::App& top, std::vector<Declared>* out);
void add_logits(CLI::App& top, std::vector<Declared>* out);
void add_generate(CLI::App& top, std::vector<Declared>* out);
void add_kv_report(CLI::App& top, std::vector<Declared>* out);
void add_bench(CLI::App& top, std::vector<Declared>* out);
void add_tokenize(CLI::App& top, std::vector<Declared>* out);
void add_render(CLI::App& top, std::vector<Declared>* out);
void add_serve(CLI::App& top, std::vector<Declared>* out);
void add_kernels_doc(CLI::App& top, std::vector<Declared>* out);
void add_quality(CLI::App& top, std::vector<Declared>* out);
}  // namespace dil::cli
