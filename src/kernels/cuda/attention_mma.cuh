// Shared by the sparse-attention kernels (attention.cu: the exact FP64 path, attention_mma.cu:
// tensor cores): the launch parameters and the addressing of a query's KV candidates (window
// rows, then compressed rows by index or all visible ones). T is the storage type of q, the
// rows and out (float | bf16_t): AttnArgs gives them one activation dtype.
#pragma once
#include "kernels/cuda/kv_packed.cuh"
#include "kernels/cuda/ops.cuh"

namespace dil::cuda {

template <class T>
struct AttnParams {
  const T* q;            // [T, H, d]
  const T* kv_new;       // [T, d]
  const uint8_t* ring;   // [n_slots, W] rows of ring_rb bytes: d values of T, or packed in ring_fmt
  const uint8_t* comp;   // [n_blocks, rpb] rows of comp_rb bytes (T or comp_fmt), or null
  int64_t ring_rb, comp_rb;  // bytes per row
  KvRow ring_fmt, comp_fmt;  // d == 0: plain rows of T
  const int32_t* comp_idx;  // [T, K] or null
  const float* sink;     // [H]
  T* out;                // [T, H, d]
  const int32_t *q_start, *start_pos, *slot, *tok_pos, *tok_seq, *block_table;
  int H, d, W, ring_len, ratio, rpb, K, max_blocks;
  float scale;
  const int32_t* len;  // [n_seqs] chunk lengths (non_causal)
  int non_causal;      // AttnArgs::non_causal (window only)
};

// A KV candidate: a row of d values of T (kind 0: kv_new, or a plain cache) or a packed row
// (kind 1: ring_fmt, 2: comp_fmt); p null: no visible row.
struct KvRef {
  const void* p;
  int kind;
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

// Candidate c of token t (sequence s at position p, n_win window rows): its row, or null for a
// compressed row that is not visible (index -1, past the visible rows, no block).
template <class T>
__device__ inline KvRef attn_row(const AttnParams<T>& P, int t, int s, int p, int n_win, int c) {
  if (c < n_win) {
    int j = p - n_win + 1 + c;
    int sp = P.start_pos[s];
    if (j >= sp) return {P.kv_new + int64_t(P.q_start[s] + (j - sp)) * P.d, 0};
    return {P.ring + (int64_t(P.slot[s]) * P.ring_len + (j % P.ring_len)) * P.ring_rb, P.ring_fmt.d ? 1 : 0};
  }
  c -= n_win;
  int r = P.comp_idx ? P.comp_idx[int64_t(t) * P.K + c] : c;
  int visible = (p + 1) / P.ratio;
  if (r < 0 || r >= visible) return {nullptr, 0};
  int b = P.block_table[s * P.max_blocks + r / P.rpb];
  if (b < 0) return {nullptr, 0};
  return {P.comp + (int64_t(b) * P.rpb + r % P.rpb) * P.comp_rb, P.comp_fmt.d ? 2 : 0};
}

// Dims [4 k4, 4 k4 + 4) of a candidate's row as f32 (exact: bf16 widened, packed dequantized);
// zeros for no row. Plain rows are 16-byte (f32) / 8-byte (bf16) aligned: d is a multiple of 32.
template <class T>
__device__ __forceinline__ float4 attn_row4(const AttnParams<T>& P, KvRef r, int k4) {
  if (!r.p) return make_float4(0.f, 0.f, 0.f, 0.f);
  if (r.kind) {
    float v[4];
    const KvRow f = r.kind == 1 ? P.ring_fmt : P.comp_fmt;  // by value: no local copy of the parameters
    kv_unpack<4>(f, static_cast<const uint8_t*>(r.p), 4 * k4, v);
    return make_float4(v[0], v[1], v[2], v[3]);
  }
  if constexpr (std::is_same_v<T, float>) {
    return reinterpret_cast<const float4*>(r.p)[k4];
  } else {
    const uint2 v = reinterpret_cast<const uint2*>(r.p)[k4];
    return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u), __uint_as_float(v.y << 16),
                       __uint_as_float(v.y & 0xffff0000u));
  }
}

// Dims [8 seg, 8 seg + 8) of a packed row as 8 bf16 (exact: every packed value has at most 6
// significant bits and a normal exponent; kv_unpack8_bf16).
template <class T>
__device__ __forceinline__ uint4 attn_row8_packed(const AttnParams<T>& P, KvRef r, int seg) {
  const KvRow f = r.kind == 1 ? P.ring_fmt : P.comp_fmt;  // by value: no local copy of the parameters
  return kv_unpack8_bf16(f, static_cast<const uint8_t*>(r.p), seg);
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
