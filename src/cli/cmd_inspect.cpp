// deepinfer-lab inspect --model DIR | --config FILE [--quiet]
//                      [--plan [--device cpu|cuda] [--numerics MODE] [--kernels op=impl,...] [--layers L,...]]
// Lists tensors (name, dtype, shape), the parameter count and the validation result; with
// --config, the tensors a real checkpoint of that config must hold. --plan: the kernel plan
// instead (every op of every layer kind, per numerics mode: all three unless --numerics), for
// the backend --device names; no device is needed.
#include <cstdio>
#include <filesystem>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/ids.h"
#include "cli/plan_report.h"
#include "model/model.h"
#include "model/schema.h"

namespace dil::cli {

namespace {
int64_t logical_params(DType t, int64_t numel, const std::string& name) {
  if (name.size() > 6 && name.compare(name.size() - 6, 6, ".scale") == 0) return 0;  // scales are not parameters
  return t == DType::I8 ? numel * 2 : numel;  // FP4 packs two per byte
}
std::string shape_of(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}
}  // namespace

int cmd_inspect(int argc, char** argv) {
  Args args(argc, argv, {"quiet", "plan"});
  const bool quiet = args.has("quiet");
  if (args.has("plan")) {
    const ModelConfig cfg = load_model_config(args.has("config") ? args.get("config") : args.need("model"));
    const BackendKind kind = parse_backend_kind(args.get("device", "cpu"));
    std::vector<Numerics> modes{Numerics::Reference, Numerics::Official, Numerics::Fast};
    if (args.has("numerics")) modes = {parse_numerics(args.get("numerics"))};
    BackendOptions o;
    if (args.has("kernels")) parse_kernel_overrides(args.get("kernels"), &o);
    std::vector<int> layers;
    if (args.has("layers")) layers = parse_int_list(args.get("layers"));
    std::printf("%s", plan_report(cfg, kind, modes, o, layers).c_str());
    return 0;
  }
  if (args.has("config")) {
    ModelConfig cfg = load_config(args.get("config"));
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
  std::string dir = args.need("model");
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

}  // namespace dil::cli
