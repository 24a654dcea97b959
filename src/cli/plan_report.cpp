#include "cli/plan_report.h"

#include "model/model.h"

namespace dil::cli {

std::string plan_report(const ModelConfig& cfg, BackendKind kind, const std::vector<Numerics>& modes,
                        const BackendOptions& o, const std::vector<int>& layers) {
  std::string out;
  for (Numerics n : modes) {
    const KernelPlan p =
        resolve_plan(kernel_registry(kind), backend_kind_name(kind), model_op_sites(cfg, n, layers), n, o);
    out += p.table() + "summary (" + numerics_name(n) + "): " + p.summary() + "\n\n";
  }
  return out;
}

}  // namespace dil::cli
