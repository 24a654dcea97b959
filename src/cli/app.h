// The command line of `deepinfer-lab` on CLI11: the conventions every command shares.
//
// - Each command keeps its options in one struct whose member initialisers (or the library
//   structs it embeds: EngineOptions, ServerOptions, LaunchRequest, ModelOptions) are the only
//   copy of every default; options are bound to its fields, and `--help` shows the field's
//   value at declaration time as the default.
// - `--help` on any command exits 0 and lists every option with "(default: X)" or
//   "(required)"; an unknown or malformed option, or a missing required one, exits 2 with a
//   message naming it. Errors while running (bad checkpoint, ...) exit 1.
// - Required options are checked after CLI11's own checks (see require()), so that an unknown
//   option (a typo of a required one, say) is reported as such rather than as "X is required".
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dil::cli {

// The program's argv as main received it: commands that start several ranks re-execute it.
struct ProgramArgs {
  int argc = 0;
  char** argv = nullptr;
};

// One runnable (leaf) command: its CLI11 app and what runs once it is parsed. `run` captures
// the command's options struct, which it owns.
struct Declared {
  CLI::App* app = nullptr;
  std::function<int(const ProgramArgs&)> run;
};

// The top-level app with the house help format and default capture. Subcommands added to it
// inherit both.
std::unique_ptr<CLI::App> make_top_app(const std::string& description);

// `sub` needs one of `names` (one name: that option is required). Shown in --help, checked
// after parsing (exit 2: "--x is required" / "one of --a, --b is required").
void require(CLI::App* sub, std::vector<std::string> names);

// A boolean flag whose default ("on"/"off") is the field's current value.
CLI::Option* add_switch(CLI::App* app, const std::string& name, bool& field, const std::string& help);

// Parses argv and runs the chosen command. Returns the exit status: 0 for --help, 2 for a
// usage error, else the command's status (1 for a dil::Error it throws).
int parse_and_run(CLI::App& top, const std::vector<Declared>& commands, const ProgramArgs& prog);

// Every command (the top level, groups such as `bench` and every leaf) with every visible
// option: [{"command": "bench prefill", "options": [{"names": [...], "type": "INT",
// "default": "3", "flag": false, "required": false}]}]. `deepinfer-lab --options-json` prints
// it; the CLI test compares it with each command's --help.
nlohmann::json describe_options(const CLI::App& top);

}  // namespace dil::cli
