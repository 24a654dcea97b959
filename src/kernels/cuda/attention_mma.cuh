// Shared by the two sparse-attention kernels (attention.cu: the exact SIMT path,
// attention_mma.cu: BF16-split tensor cores): the launch parameters and the addressing of a
// query's KV candidates (window rows, then compressed rows by index or all visible ones).
#pragma once
#include "kernels/cuda/ops.cuh"

namespace dil::cuda {

struct AttnParams {
  const float* q;        // [T, H, d]
  const float* kv_new;   // [T, d]
  const float* ring;     // [n_slots, W, d]
  const float* comp;     // [n_blocks, rpb, d] or null
  const int32_t* comp_idx;  // [T, K] or null
  const float* sink;     // [H]
  float* out;            // [T, H, d]
  const int32_t *q_start, *start_pos, *slot, *tok_pos, *tok_seq, *block_table;
  int H, d, W, ring_len, ratio, rpb, K, max_blocks;
  float scale;
};

__device__ inline const float* attn_row(const AttnParams& P, int t, int s, int p, int n_win, int c) {
  if (c < n_win) {
    int j = p - n_win + 1 + c;
    int sp = P.start_pos[s];
    if (j >= sp) return P.kv_new + int64_t(P.q_start[s] + (j - sp)) * P.d;
    return P.ring + (int64_t(P.slot[s]) * P.ring_len + (j % P.ring_len)) * P.d;
  }
  c -= n_win;
  int r = P.comp_idx ? P.comp_idx[int64_t(t) * P.K + c] : c;
  int visible = (p + 1) / P.ratio;
  if (r < 0 || r >= visible) return nullptr;
  int b = P.block_table[s * P.max_blocks + r / P.rpb];
  if (b < 0) return nullptr;
  return P.comp + (int64_t(b) * P.rpb + r % P.rpb) * P.d;
}

// Fills everything but the kernel choice; checks shapes.
AttnParams make_attn_params(const AttnArgs& a, const StepMeta& m);

// The tensor-core path (attention_mma.cu; registry.cpp: head dim 512, heads a multiple of 16).
void sparse_attention_mma(Ctx& c, const AttnParams& P, int T);

}  // namespace dil::cuda
