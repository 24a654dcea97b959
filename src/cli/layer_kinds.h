// Layer kinds of a config, shared by the commands that run a layer subset on dummy weights
// (bench, trace): the kind names the profiler and the kernel plan use, and one layer of each kind.
#pragma once
#include <string>
#include <vector>

#include "model/config.h"

namespace dil::cli {

// "SWA" | "CSA" | "HCA" (V4); "SWA" | "Full-r2" | "Reuse-r1" | "Reindex-r1" ... (V4.1).
std::string layer_kind(const ModelConfig& c, int L);
// One layer of every kind of the released configs, with the sources their V4.1 layers read:
// V4 1, 3, 4 (SWA hash-routed, HCA, CSA); V4.1 0, 2, 3, 20, 21, 24 (SWA, Full r2, Reuse r2,
// Full r1 with the candidate blocks, Reuse r1, Reindex).
std::vector<int> default_layers(const ModelConfig& c);

}  // namespace dil::cli
