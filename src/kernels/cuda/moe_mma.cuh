// Tensor-core grouped GEMM of the routed experts (moe_mma.cu), used by moe_experts for the
// large-batch case when the expert weights are FP4 and the activations are FP8-QDQ'd: both
// operands are then exact in BF16 (e4m3 x 2^j and e2m1 x 2^j), so mma.sync BF16 products are
// exact and only the f32 accumulation rounds. The tile map is the SIMT path's, built with
// kMmaBM-row tiles of one expert's sorted rows; same output layout, no host sync.
#pragma once
#include <vector>

#include "kernels/cuda/ops.cuh"

namespace dil::cuda {

// Rows per tile (the tile map's tile size on this path), output columns per block, k per stage.
constexpr int kMmaBM = 128, kMmaBN = 128, kMmaBK = 32, kMmaThreads = 256;

// The tile map built by moe_experts (device pointers).
struct MoeTileMap {
  const int32_t* offsets;  // [E + 1] first sorted row of each expert
  const int32_t* tile_e;   // [max_tiles] expert of each row tile
  const int32_t* tile_r0;  // [max_tiles] first sorted row of the tile
  const int32_t* n_tiles;  // [1]
};

// True when every weight of the list can go through moe_mma_fp4: FP4 with K a multiple of 32
// (one E8M0 scale per k stage) and 8-byte aligned rows.
bool moe_mma_fits(const std::vector<Weight>& ws);

// out[r, :N] (ldo) = X[row(r), :K] . W_e^T for every sorted row r of every tile, X in BF16
// bits (ldx elements per row, rows gathered through `gather` or read in sorted order when
// null), W_e = experts[tile_e] FP4. f32 accumulation on tensor cores.
void moe_mma_fp4(Ctx& c, const uint16_t* x, int64_t ldx, const int32_t* gather, const WView* experts,
                 const MoeTileMap& map, int max_tiles, float* out, int64_t ldo, int64_t N, int64_t K);

}  // namespace dil::cuda
