// The tensor-core scoring path of the lightning indexer (indexer_mma.cu), used by
// indexer_topk (indexer.cu) when the inputs allow it.
#pragma once
#include "kernels/cuda/ops.cuh"

namespace dil::cuda {

// True when the shape has a kernel (head dim 128, 16/32/64 heads); the kernel plan chooses the
// path, this only double-checks what it chose.
bool indexer_mma_shape(const IndexerArgs& a);
// scores [T, n_max] f32: token t's visible rows [0, (pos+1)/ratio) (with cand_in: only the rows of
// its candidate blocks, the rest unwritten), the reference's values bit
// for bit (the rest of each row is not written).
void indexer_scores_mma(Ctx& c, const IndexerArgs& a, const StepMeta& m, int n_max, float* scores);

}  // namespace dil::cuda
