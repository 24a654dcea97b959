// The fast-numerics scorer of the lightning indexer (indexer_fp8.cu), used by indexer_topk
// (indexer.cu) for the plan's wgmma_fp8, mma_fp8 and fast_simt implementations. Both compute the CPU's
// fast specification (src/kernels/cpu/indexer.cpp, fast_score) bit for bit.
#pragma once
#include "kernels/cuda/ops.cuh"

namespace dil::cuda {

// True when mma_fp8 has a kernel for the shape (head dim 128, 16 / 32 / 64 heads, bf16 q and keys);
// the plan chooses, this double-checks.
bool indexer_fp8_shape(const IndexerArgs& a);
// scores [T, ld] f32. V4 layout (cand_in empty): entry r = visible row r of token t, for
// r < (pos+1)/ratio (the rest untouched). Reindex (cand_in): entry j < cand_topk*cand_block is
// row cand_in[t, j / cand_block] * cand_block + j % cand_block, NaN where that slot has no
// visible row. Simt: one thread per entry (fast_simt); Mma: FP8 mma.sync (mma_fp8); Wgmma: FP8
// warpgroup MMA (wgmma_fp8, indexer_wgmma.cu; not Reindex).
enum class FastScorer { Simt, Mma, Wgmma };
void indexer_scores_fast(Ctx& c, const IndexerArgs& a, const StepMeta& m, int64_t ld, float* scores, FastScorer how);

}  // namespace dil::cuda
