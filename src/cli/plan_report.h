// `inspect --plan` and the plan line of load summaries: the kernel plan of a model config on a
// backend kind, resolved without a device (the registries are plain C++).
#pragma once
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"

namespace dil::cli {

// One table per numerics mode (backend/plan.h KernelPlan::table); throws dil::Error with the
// unmet requirements when nothing can run a site.
std::string plan_report(const ModelConfig& cfg, BackendKind kind, const std::vector<Numerics>& modes,
                        const BackendOptions& o, const std::vector<int>& layers = {});

}  // namespace dil::cli
