// Device pieces shared by the fast-numerics indexer scorers (indexer_fp8.cu: mma_fp8 and
// fast_simt; indexer_wgmma.cu: wgmma_fp8): the kernel parameters, key rows read in place from
// the paged cache (bf16 or packed Fp4B32), and the fast specification for one (token, row),
// which every scorer uses for the rows whose e4m3 conversion is not exact.
#pragma once
#include "kernels/cuda/kv_packed.cuh"
#include "kernels/cuda/ops.cuh"

namespace dil::cuda::idxfast {

constexpr int kBlk = 32;        // dims per FP4 block (one k32 MMA)
constexpr int kMaxScale = 60;   // |S| limit of the exact scaling argument (indexer_fp8.cu)

// One key row: di values of TK, or a packed row (fmt.d > 0: the official Fp4B32 keys).
template <class TK>
struct KeyRow {
  const TK* plain;
  const uint8_t* packed;
  KvRow fmt;
  __device__ float at(int c) const { return packed ? kv_unpack_one(fmt, packed, c) : ld_act(plain[c]); }
};

template <class TQ, class TW, class TK>
struct FastParams {
  const TQ* q;                // [T, Hi, di]
  const TW* w;                // [T, Hi]
  const TK* keys;             // [n_blocks, rpb, di] plain keys, or null
  const uint8_t* keys_packed; // [n_blocks, rpb] rows of krb bytes in kfmt (packed keys), or null
  KvRow kfmt;
  int krb;
  __device__ KeyRow<TK> key(int64_t row) const {  // row: block * rpb + row in block
    return keys_packed ? KeyRow<TK>{nullptr, keys_packed + row * krb, kfmt} : KeyRow<TK>{keys + row * di, nullptr, kfmt};
  }
  const uint32_t* q8;         // [T, Hi, 128] e4m3 (4 per word) of q * 2^-Sq
  const float* wq;            // [T, Hi] w * 2^Sq
  const int32_t* tok_flag;    // [T] nonzero: a head of the token is not exact in e4m3
  const int2* groups;         // [n_groups] (first token, token count)
  const int32_t *tok_seq, *tok_pos, *block_table;
  int Hi, di, ratio, rpb, max_blocks;
  float* scores;              // [T, ld]
  int64_t ld;
  const int32_t* cand;        // Reindex: [T, cand_topk] block ids, or null
  int cand_topk, cand_block;
  int stages;                 // mma_fp8 (idx_fp8_kernel): key tiles per CTA
};

__device__ __forceinline__ float pow2f(int e) { return __uint_as_float(uint32_t(127 + e) << 23); }  // |e| <= 126

// The specification for one (token, row): q [Hi, di], w [Hi], k [di] (indexer_fp8.cu's file
// comment). Not inlined: it is the rare path of the MMA kernels, whose registers go to fragments.
template <class TQ, class TW, class TK>
__device__ __noinline__ float spec_score(const TQ* q, const TW* w, KeyRow<TK> k, int Hi, int di) {
  auto term = [&](int h) -> float {
    if (h >= Hi) return 0.f;
    float d = 0.f;
    for (int b = 0; b * kBlk < di; ++b) {
      double s = 0.0;
      for (int c = b * kBlk; c < min(di, (b + 1) * kBlk); ++c)
        s = __dadd_rn(s, __dmul_rn(double(ld_act(q[int64_t(h) * di + c])), double(k.at(c))));
      const float B = __double2float_rn(s);
      d = b == 0 ? B : __fadd_rn(d, B);
    }
    return __fmul_rn(ld_act(w[h]), d > 0.f ? d : 0.f);
  };
  float p[8];
  for (int mt = 0; mt * 16 < Hi; ++mt) {
#pragma unroll
    for (int g = 0; g < 8; ++g) {
      const float pair = __fadd_rn(term(16 * mt + g), term(16 * mt + g + 8));
      p[g] = mt == 0 ? pair : __fadd_rn(p[g], pair);
    }
  }
  return __fadd_rn(__fadd_rn(__fadd_rn(p[0], p[1]), __fadd_rn(p[2], p[3])),
                   __fadd_rn(__fadd_rn(p[4], p[5]), __fadd_rn(p[6], p[7])));
}

// wgmma_fp8 (indexer_wgmma.cu): tokens per work group, whose e4m3 q (Hi rows of 128 bytes per
// token) stays resident in shared memory: 64 KB.
constexpr int wgmma_group_tokens(int Hi) { return 512 / Hi; }
// Scores of P's token groups (P.groups: up to wgmma_group_tokens(P.Hi) tokens each, n_groups of
// them) over their visible rows (at most n_entries), V4 layout; P.q8 / wq / tok_flag prepared.
template <class TW>
void launch_idx_wgmma(const FastParams<bf16_t, TW, bf16_t>& P, int64_t n_entries, int64_t n_groups, cudaStream_t st);

}  // namespace dil::cuda::idxfast
