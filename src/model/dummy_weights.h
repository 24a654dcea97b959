// `--load-format dummy`: random weights in the official checkpoint formats (FP8 e4m3 with E8M0
// block scales, packed FP4 e2m1 with E8M0 1x32 scales, BF16, F32, I64 tables) for any config,
// without a file. Values are random (never zeros) with magnitudes that keep activations in a
// realistic range (weights ~ N(0, 1/in), norm weights ~ 1), so routing and top-k selections
// spread like a real model's and no NaN/Inf appears.
#pragma once
#include <cstdint>
#include <vector>

#include "core/safetensors.h"
#include "model/config.h"

namespace dil {

// Every tensor of the schema, restricted to the backbone layers in `layers` (empty: all), with
// the MTP/DSpark blocks when `with_mtp`. Generated on the host with all hardware threads.
// Routed experts outside [expert_lo, expert_hi) are left out (expert parallelism: a rank
// generates only the experts it holds; expert_hi < 0: all). Every expert's values do not depend
// on which others are generated.
SafeTensors make_dummy_checkpoint(const ModelConfig& cfg, const std::vector<int>& layers, uint64_t seed,
                                  int expert_lo = 0, int expert_hi = -1, bool with_mtp = false);

}  // namespace dil
