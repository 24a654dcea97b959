// Options that several commands declare the same way: the numerics mode, the device, the
// launch options of multi-rank runs. Each helper binds to a field of the caller's options
// struct (whose value is the default) and validates through the library's own parser, so a
// bad value exits 2 naming the option.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>

#include "dist/launch.h"
#include "model/model.h"

namespace dil::cli {

// --numerics MODE, MODE one of kNumericsModes, parsed by dil::parse_numerics. A new mode is
// one more line in kNumericsModes (shared_options.cpp) once parse_numerics knows it.
CLI::Option* add_numerics_option(CLI::App* app, Numerics& field);
// The same option for structs that keep the mode by name (EngineOptions::numerics).
CLI::Option* add_numerics_option(CLI::App* app, std::string& field);

// --device cpu|cuda (dil::parse_backend_kind).
CLI::Option* add_device_option(CLI::App* app, std::string& field);

// --nnodes, --node-rank, --master-addr, --master-port, --dist-timeout, and --nproc when
// `with_nproc` (serve sets the ranks per machine from --dp instead). The defaults are
// LaunchRequest's.
void add_launch_options(CLI::App* app, LaunchRequest& req, bool with_nproc);

// Checks a value with a parser that throws dil::Error: the error becomes CLI11's
// ValidationError naming the option (exit 2).
CLI::Validator parsed_by(std::function<void(const std::string&)> parse);

}  // namespace dil::cli
