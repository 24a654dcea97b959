// The options of `deepinfer-lab serve`, declared once for the server binary and for
// tests/server/fake_serve (the same flags over a fake engine). Their defaults are the library
// structs' (EngineOptions, ServerOptions, LaunchRequest) plus the few serve adds here.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "dil/engine.h"
#include "dist/launch.h"
#include "server/server.h"

namespace dil::cli {

struct ServeOptions {
  std::string model;  // empty: the bundled models/tiny-v4 (default_model_dir)
  EngineOptions engine;
  server::ServerOptions server;  // model_name empty: the model folder's name
  int dp = 1;                    // data-parallel ranks (one process per GPU)
  int ep = 0;                    // expert-parallel ranks; 0: = dp (the only supported value)
  LaunchRequest launch;          // nproc is dp / nnodes
  std::string layers;            // --layers: "all" or a comma-separated list (engine.layers)
};

// Adds the `serve` subcommand with every option bound to `o` (which must outlive parsing).
CLI::App* declare_serve(CLI::App& top, ServeOptions& o, const std::string& description);

// After parsing: the model folder (the bundled one when --model is not given), the served
// name, and the rank layout checks (dil::Error).
void finish_serve_options(ServeOptions& o);

// models/tiny-v4 beside the binary, one level up (build/ in the repo), or under the current
// directory; dil::Error when none holds it.
std::string default_model_dir();

}  // namespace dil::cli
