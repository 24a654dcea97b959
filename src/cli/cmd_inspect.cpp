// deepinfer-lab inspect --model DIR | --config FILE [--quiet]
// Lists tensors (name, dtype, shape), the parameter count and the validation result; with
// --config, the tensors a real checkpoint of that config must hold.
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "core/check.h"
#include "model/schema.h"

namespace dil::cli {

namespace {

struct InspectOptions {
  std::string model;   // a checkpoint folder
  std::string config;  // or a config.json alone
  bool quiet = false;
};

int64_t logical_params(DType t, int64_t numel, const std::string& name) {
  if (name.size() > 6 && name.compare(name.size() - 6, 6, ".scale") == 0) return 0;  // scales are not parameters
  return t == DType::I8 ? numel * 2 : numel;  // FP4 packs two per byte
}
std::string shape_of(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

int run_inspect(const InspectOptions& o) {
  const bool quiet = o.quiet;
  if (!o.config.empty()) {
    ModelConfig cfg = load_config(o.config);
    auto specs = expected_tensors(cfg, true);
    size_t bytes = 0;
    int64_t params = 0;
    for (const auto& s : specs) {
      int64_t numel = 1;
      for (auto d : s.shape) numel *= d;
      bytes += s.nbytes();
      params += logical_params(s.dtype, numel, s.name);
      if (!quiet) std::printf("%-70s %-8s %s\n", s.name.c_str(), std::string(dtype_name(s.dtype)).c_str(), shape_of(s.shape).c_str());
    }
    std::printf("expected tensors: %zu  total bytes: %zu  parameters: %lld\n", specs.size(), bytes, (long long)params);
    return 0;
  }
  const std::string& dir = o.model;
  ModelConfig cfg = load_config((std::filesystem::path(dir) / "config.json").string());
  SafeTensors st = SafeTensors::open(dir);
  bool with_mtp = false;
  int64_t params = 0;
  for (const auto& [name, e] : st.entries()) {
    with_mtp |= name.rfind("mtp.", 0) == 0;
    params += logical_params(e.dtype, e.numel(), name);
    if (!quiet) std::printf("%-70s %-8s %s\n", name.c_str(), std::string(dtype_name(e.dtype)).c_str(), shape_of(e.shape).c_str());
  }
  ValidationReport rep = validate_checkpoint(st, expected_tensors(cfg, with_mtp));
  std::printf("tensors: %zu  total bytes: %zu  parameters: %lld\n", st.entries().size(), st.total_bytes(), (long long)params);
  if (rep.ok()) {
    std::printf("validation: OK (%zu tensors match config.json)\n", rep.n_tensors);
    return 0;
  }
  std::printf("validation: FAILED (%zu problems)\n", rep.errors.size());
  for (const auto& e : rep.errors) std::printf("  %s\n", e.c_str());
  return 1;
}

}  // namespace

void add_inspect(CLI::App& top, std::vector<Declared>* out) {
  auto o = std::make_shared<InspectOptions>();
  CLI::App* c = top.add_subcommand("inspect", "list a checkpoint's (or a config's expected) tensors and validate them");
  auto* model = c->add_option("--model", o->model, "checkpoint folder (config.json + safetensors)");
  auto* config = c->add_option("--config", o->config, "a config.json: list the tensors its checkpoint must hold");
  model->excludes(config);
  add_switch(c, "--quiet", o->quiet, "print the totals and the validation result only");
  require(c, {"--model", "--config"});
  out->push_back({c, [o](const ProgramArgs&) { return run_inspect(*o); }});
}

}  // namespace dil::cli
