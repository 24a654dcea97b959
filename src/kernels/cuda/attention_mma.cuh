// Shared by the sparse-attention kernels (attention.cu: the exact FP64 path, attention_mma.cu:
// tensor cores): the launch parameters and the addressing of a query's KV candidates (window
// rows, then compressed rows by index or all visible ones). T is the storage type of q, the
// rows and out (float | bf16_t): AttnArgs gives them one activation dtype.
#pragma once
#include "kernels/cuda/ops.cuh"

namespace dil::cuda {

template <class T>
struct AttnParams {
  const T* q;            // [T, H, d]
  const T* kv_new;       // [T, d]
  const T* ring;         // [n_slots, W, d]
  const T* comp;         // [n_blocks, rpb, d] or null
  const int32_t* comp_idx;  // [T, K] or null
  const float* sink;     // [H]
  T* out;                // [T, H, d]
  const int32_t *q_start, *start_pos, *slot, *tok_pos, *tok_seq, *block_table;
  int H, d, W, ring_len, ratio, rpb, K, max_blocks;
  float scale;
  const int32_t* len;  // [n_seqs] chunk lengths (non_causal)
  int non_causal;      // AttnArgs::non_causal (window only)
};

// The window rows of token t (sequence s at position p): their count, and in *pe the last
// position they end at (attn_row's p). Causal: [max(0, p-W+1), p]. Non-causal: the W positions
// before the chunk and the whole chunk, the same rows for every token of it.
template <class T>
__device__ inline int attn_window(const AttnParams<T>& P, int s, int p, int* pe) {
  if (!P.non_causal) {
    *pe = p;
    return min(p + 1, P.W);
  }
  const int sp = P.start_pos[s];
  *pe = sp + P.len[s] - 1;
  return min(sp, P.W) + P.len[s];
}

// Candidate c of token t (sequence s at position p, n_win window rows): a row pointer, or null
// for a compressed row that is not visible (index -1, past the visible rows, no block).
template <class T>
__device__ inline const T* attn_row(const AttnParams<T>& P, int t, int s, int p, int n_win, int c) {
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

// Fills everything but the kernel choice; checks shapes and that q, kv_new, ring, comp and out
// share the storage type T.
template <class T>
AttnParams<T> make_attn_params(const AttnArgs& a, const StepMeta& m);

// The tensor-core path (attention_mma.cu; registry.cpp: head dim 512, heads a multiple of 16).
// float: official numerics, f32 operands split into BF16 hi + lo (mma_split_bf16); bf16_t:
// fast numerics, BF16 operands and BF16 probabilities (mma_bf16).
template <class T>
void sparse_attention_mma(Ctx& c, const AttnParams<T>& P, int T_tokens);

}  // namespace dil::cuda
