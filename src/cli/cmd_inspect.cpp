// deepinfer-lab inspect --model DIR | --config FILE [--quiet]
//                      [--plan [--device cpu|cuda] [--numerics MODE] [--kernels op=impl,...] [--layers L,...]]
// Lists tensors (name, dtype, shape), the parameter count and the validation result; with
// --config, the tensors a real checkpoint of that config must hold. --plan: the kernel plan
// instead (every op of every layer kind, per numerics mode: all three unless --numerics), for
// the backend --device names; no device is needed.
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "cli/ids.h"
#include "cli/plan_report.h"
#include "cli/shared_options.h"
#include "core/check.h"
#include "model/model.h"
#include "model/schema.h"

namespace dil::cli {

namespace {

struct InspectOptions {
  std::string model;   // a checkpoint folder
  std::string config;  // or a config.json alone
  bool quiet = false;
  bool plan = false;          // print the kernel plan instead of the tensors
  std::string device = "cpu";  // the backend the plan is for
  std::string numerics;        // one mode (empty: every mode)
  std::string kernels;         // forced implementations, op=impl,...
  std::string layers;          // a layer subset (empty: all)
};

int run_plan(const InspectOptions& o) {
  const ModelConfig cfg = load_model_config(o.config.empty() ? o.model : o.config);
  std::vector<Numerics> modes{Numerics::Reference, Numerics::Official, Numerics::Fast};
  if (!o.numerics.empty()) modes = {parse_numerics(o.numerics)};
  BackendOptions bo;
  if (!o.kernels.empty()) parse_kernel_overrides(o.kernels, &bo);
  const std::vector<int> layers = o.layers.empty() ? std::vector<int>{} : parse_int_list(o.layers);
  std::printf("%s", plan_report(cfg, parse_backend_kind(o.device), modes, bo, layers).c_str());
  return 0;
}

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
  if (o.plan) return run_plan(o);
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
  add_switch(c, "--plan", o->plan, "print the kernel plan (which implementation runs every op of every layer kind, "
                                   "per numerics mode) instead of the tensors; needs no device");
  add_device_option(c, o->device)->description("the backend the --plan is for");
  c->add_option("--numerics", o->numerics, std::string("--plan for one numerics mode (") + numerics_choices() +
                                               "; empty: every mode)")
      ->check(parsed_by([](const std::string& s) { parse_numerics(s); }));
  c->add_option("--kernels", o->kernels, "--plan with forced implementations, op=impl[,op=impl...]")
      ->check(parsed_by([](const std::string& s) {
        BackendOptions b;
        parse_kernel_overrides(s, &b);
      }));
  c->add_option("--layers", o->layers, "--plan for a layer subset, comma-separated (empty: all)")
      ->check(parsed_by([](const std::string& s) { parse_int_list(s); }));
  require(c, {"--model", "--config"});
  out->push_back({c, [o](const ProgramArgs&) { return run_inspect(*o); }});
}

}  // namespace dil::cli
