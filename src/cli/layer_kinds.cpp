#include "cli/layer_kinds.h"

namespace dil::cli {

std::string layer_kind(const ModelConfig& c, int L) {
  int r = c.ratio(L);
  if (c.arch == Arch::V4) return r == 0 ? "SWA" : r == 4 ? "CSA" : "HCA";
  switch (c.role(L)) {
    case LayerRole::Swa: return "SWA";
    case LayerRole::Full: return "Full-r" + std::to_string(r);
    case LayerRole::Reuse: return "Reuse-r" + std::to_string(r);
    case LayerRole::Reindex: return "Reindex-r" + std::to_string(r);
  }
  return "?";
}

std::vector<int> default_layers(const ModelConfig& c) {
  if (c.arch == Arch::V4) return {1, 3, 4};  // SWA (hash-routed), HCA, CSA
  return {0, 2, 3, 20, 21, 24};              // SWA, Full r2, Reuse r2, Full r1 (candidates), Reuse r1, Reindex
}

}  // namespace dil::cli
