// Exact per-row top-k over f32 scores on the device (topk_rows.cu): a plain C++ header (no
// CUDA types) so that the fast indexer (indexer.cu) and the benchmarks (tests/cuda) share it.
//
// Row q of `scores` ([Q, ld] f32, device) ranks its first n entries (n = n_fixed, or
// (tok_pos[q] + 1) / ratio when tok_pos is given). With `cand` (V4.1 Reindex) entry j stands
// for row cand[q, j / cand_block] * cand_block + j % cand_block; entries holding NaN are not
// selectable (the fast scorer writes NaN where a candidate slot has no visible row). The top
// min(k, #selectable) entries are selected exactly as a stable sort on (score desc, row asc)
// would (-0 ties +0), written as rows in descending score order (ties: ascending row), or in
// ascending row order when `ascending`, then -1 padded up to k.
#pragma once
#include <cstdint>

namespace dil::cuda {

struct TopkRows {
  const float* scores = nullptr;  // [Q, ld] f32
  int64_t ld = 0;                 // row stride in elements
  int64_t n_queries = 0;
  int64_t n_fixed = 0;            // entries per row when tok_pos is null
  const int32_t* tok_pos = nullptr;  // [Q] or null
  int ratio = 1;
  const int32_t* cand = nullptr;  // [Q, cand_topk] or null
  int cand_topk = 0, cand_block = 0;
  int k = 512;                    // <= kTopkRowsMaxK
  bool ascending = false;
  int32_t* out = nullptr;         // [Q, k] i32
};

constexpr int kTopkRowsMaxK = 2048;

// Enqueues the selection on `stream` (a cudaStream_t).
void topk_rows(const TopkRows& p, void* stream);

// Benchmark helper: fills x[0, n) with uniform(-1, 1) f32 from a counter hash of (seed, i).
void fill_uniform_f32(float* x, int64_t n, uint32_t seed, void* stream);

}  // namespace dil::cuda
