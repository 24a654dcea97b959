// Lightning-indexer scores in fast numerics on FP8 tensor cores, equal bit for bit to the CPU's
// fast specification (src/kernels/cpu/indexer.cpp, fast_score):
//   B_b(h)  = f32 of the exact sum of q[h, c] * k[c] over the 32 dims of block b
//   d_h     = ((B_0 + B_1) + B_2) + B_3                                  (f32 adds)
//   term_h  = f32(w_h * max(d_h, 0))
//   p_g     = sum over m-tiles mt ascending of (term_{16mt+g} + term_{16mt+g+8}), g = 0..7
//   score   = ((p_0 + p_1) + (p_2 + p_3)) + ((p_4 + p_5) + (p_6 + p_7))
// (the head order is the one the MMA fragments hold: lane group g has heads g and g+8 of each
// 16-head tile; the butterfly over g is the last line).
//
// Why FP8 is exact here: fast (and official) numerics FP4-QDQ q and keys per 32 dims: e2m1
// values {0, .5, 1, 1.5, 2, 3, 4, 6} times a power-of-two block scale. Scaled by one power of
// two per row (2^-S, S = exponent of the row's largest |x| minus 8, so the largest maps into
// [256, 448]), every value converts exactly to e4m3 as long as the row's block exponents span
// at most 14 binades (the smallest nonzero 0.5 * 2^e must stay >= 2^-9, e4m3's subnormal
// step). Products of e4m3 values are exact, and one k32 MMA covers one 32-dim block, whose
// products are integer multiples of g = 2^(eq + ek - 2) bounded by 36 * 4g = 144g, so the block
// sum is an integer multiple of g below 32 * 144g = 4608g < 2^13 g: exact in any summation
// order and in the tensor core's accumulator (which keeps at least 13 significant bits). Each
// block's MMA therefore starts from zero and returns B_b * 2^-(Sq + Sk) exactly; the rest is the
// specification's f32 arithmetic on CUDA cores, with the power-of-two scales folded into the
// head weight (w_h * 2^Sq, checked exact) and applied to the score at the end (2^Sk), which
// changes no rounding while no intermediate leaves the normal range (|S| <= 60 is required).
// Rows that do not convert exactly (wider spans, or values that are not FP4-QDQ'd at all) are
// flagged while staging and their scores recomputed on CUDA cores by the specification itself
// (spec_score), so the result never depends on the e4m3 conversion.
//
// Layout: CTA = (up to 8 consecutive tokens of one sequence, 512 entries in 4 stages of 128).
// Keys are read in place from the paged cache: cp.async copies the next stage's bf16 rows to
// shared memory while the current stage runs, then each warp converts rows to e4m3 with
// their scale. Warp w holds all heads of one token (q fragments in registers, loaded once for
// the 4 stages) and walks the stage's 16 key n-tiles; with fewer tokens than warps (decode,
// Reindex) the token's n-tiles are split over 8 / tokens warps. A Reindex CTA holds one token
// and stages the rows of its candidate blocks.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <vector>

#include "kernels/cuda/indexer_fast.cuh"
#include "kernels/cuda/indexer_fp8.cuh"
#include "kernels/cuda/kv_packed.cuh"
#include "kernels/cuda/mma.cuh"

namespace dil::cuda {
namespace {
using namespace idxfast;

constexpr int kDi = 128, kNb = kDi / kBlk;
constexpr int kWarps = 8, kThreads = kWarps * 32, kMaxTok = kWarps;
constexpr int kTile = 128;            // key rows per stage
constexpr int kStages = 4;            // stages per CTA
constexpr int kKeyStride = kDi + 16;  // bytes per e4m3 row: words g*36 + t hit 32 distinct banks

__device__ __forceinline__ float4 load4(const float* p, int i) { return reinterpret_cast<const float4*>(p)[i]; }
__device__ __forceinline__ float4 load4(const bf16_t* p, int i) {
  const uint2 u = reinterpret_cast<const uint2*>(p)[i];
  return make_float4(d_bf16_to_f32(uint16_t(u.x & 0xffffu)), d_bf16_to_f32(uint16_t(u.x >> 16)),
                     d_bf16_to_f32(uint16_t(u.y & 0xffffu)), d_bf16_to_f32(uint16_t(u.y >> 16)));
}

// A 128-value row held 4 per lane (dims 4*lane..4*lane+3) as e4m3 codes of x * 2^-S (byte i
// of the word: dim 4*lane + i, up to a swap inside pairs that q and keys share), S and whether
// every value converted exactly (and |S| <= kMaxScale). Warp-collective.
__device__ __forceinline__ uint32_t row_e4m3(float4 v, int& S, bool& fits) {
  float m = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  S = m > 0.f ? int((__float_as_uint(m) >> 23) & 0xffu) - 127 - 8 : 0;
  const bool ok = S >= -kMaxScale && S <= kMaxScale;
  const float inv = pow2f(ok ? -S : 0);
  const float2 lo = make_float2(__fmul_rn(v.x, inv), __fmul_rn(v.y, inv));
  const float2 hi = make_float2(__fmul_rn(v.z, inv), __fmul_rn(v.w, inv));
  const __nv_fp8x2_storage_t a = __nv_cvt_float2_to_fp8x2(lo, __NV_SATFINITE, __NV_E4M3);
  const __nv_fp8x2_storage_t b = __nv_cvt_float2_to_fp8x2(hi, __NV_SATFINITE, __NV_E4M3);
  const float2 ra = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(a, __NV_E4M3)));
  const float2 rb = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(b, __NV_E4M3)));
  const bool exact = ok && ra.x == lo.x && ra.y == lo.y && rb.x == hi.x && rb.y == hi.y;
  fits = __all_sync(0xffffffffu, exact);
  return uint32_t(a) | (uint32_t(b) << 16);
}

// q -> e4m3 with a scale per (token, head), the scale folded into the head weight. grid T,
// one warp per head.
template <class TQ, class TW>
__global__ void __launch_bounds__(kThreads) q_prep_kernel(const TQ* q, const TW* w, int Hi, uint32_t* q8, float* wq,
                                                          int32_t* tok_flag) {
  pdl_enter();
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int h = warp; h < Hi; h += kWarps) {
    const int64_t th = t * Hi + h;
    int S;
    bool fits;
    const uint32_t code = row_e4m3(load4(q + th * kDi, lane), S, fits);
    q8[th * (kDi / 4) + lane] = code;
    if (lane == 0) {
      const float wf = ld_act(w[th]);
      const float wv = fits ? __fmul_rn(wf, pow2f(S)) : wf;
      fits = fits && __fmul_rn(wv, pow2f(-S)) == wf;  // the fold is exact
      wq[th] = wv;
      if (!fits) tok_flag[t] = 1;
    }
  }
}

__device__ __forceinline__ void cpa16(void* smem, const void* gmem, bool valid) {
  const unsigned s = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}
// 16 bytes to shared memory of which the first n (0..16) are read from gmem, the rest zeroed.
__device__ __forceinline__ void cpa16n(void* smem, const void* gmem, int n) {
  const unsigned s = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
constexpr int kPackedSlot = 96;  // bytes of raw per packed key row: a 68-byte row at offset 0..12, 5 chunks
// Dims 4 lane .. 4 lane + 3 of a packed key row (Fp4B32: 2 bytes of e2m1, the ue8m0 of their
// 32-dim block) as f32, the values load4 reads from a bf16 row holding the same keys.
__device__ __forceinline__ float4 packed4(const KvRow& f, const uint8_t* row, int lane) {
  const uint32_t w = uint32_t(row[2 * lane]) | (uint32_t(row[2 * lane + 1]) << 8);
  const float sc = d_e8m0_fast(row[f.d / 2 + lane / 8]);
  return make_float4(kv_e2m1(w) * sc, kv_e2m1(w >> 4) * sc, kv_e2m1(w >> 8) * sc, kv_e2m1(w >> 12) * sc);
}
__device__ __forceinline__ void cpa_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cpa_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

struct StageSmem {
  uint16_t raw[kTile * kDi];               // bf16 (or packed) rows of the next stage (cp.async target)
  uint8_t ks[kTile * kKeyStride];          // e4m3 rows of the current stage
  int64_t phys[2][kTile];                  // physical key row (block * rpb + row) of each entry (double-buffered)
  int row[2][kTile];                       // logical row of each entry, -1: none
  int kscale[kTile], krow[kTile];          // current stage: S and logical row
  int kfits[kTile];
  int tn_vis[kMaxTok], tflag[kMaxTok];
};

// Where fetch put packed key row lr (physical row phys) in raw: its slot plus the row's global
// offset mod 16.
template <class TQ, class TW>
__device__ __forceinline__ const uint8_t* packed_row_at(const FastParams<TQ, TW, bf16_t>& P, const uint16_t* raw, int lr,
                                                        int64_t phys) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(P.keys_packed + phys * P.krb);
  return reinterpret_cast<const uint8_t*>(raw) + lr * kPackedSlot + int(a & 15u);
}

template <int MT, class TQ, class TW>
__global__ void __launch_bounds__(kThreads, 2) idx_fp8_kernel(FastParams<TQ, TW, bf16_t> P) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  StageSmem& s = *reinterpret_cast<StageSmem*>(smem_raw);
  const int2 grp = P.groups[blockIdx.y];
  const int t0 = grp.x, tc = grp.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tig = lane & 3;
  const int seq = P.tok_seq[t0];
  int nv_max = 0;
  for (int i = 0; i < tc; ++i) nv_max = max(nv_max, (P.tok_pos[t0 + i] + 1) / P.ratio);
  const bool restricted = P.cand != nullptr;
  const int cb = P.cand_block;
  const int n_entries = restricted ? P.cand_topk * cb : nv_max;
  const int e_begin = int(blockIdx.x) * P.stages * kTile;
  if (e_begin >= n_entries) return;
  if (tid < tc) {
    s.tn_vis[tid] = (P.tok_pos[t0 + tid] + 1) / P.ratio;
    s.tflag[tid] = P.tok_flag[t0 + tid];
  }
  // Entry -> (logical row, physical key offset) of stage st, into buffer st & 1 (threads < kTile).
  auto meta = [&](int st) {
    if (tid >= kTile) return;
    const int e = e_begin + st * kTile + tid;
    int r = -1;
    if (e < n_entries) {
      if (restricted) {
        const int b = P.cand[int64_t(t0) * P.cand_topk + e / cb];
        r = b >= 0 ? b * cb + e % cb : -1;
        if (r >= nv_max) r = -1;
      } else {
        r = e;
      }
    }
    int64_t pr = 0;
    if (r >= 0) pr = int64_t(P.block_table[int64_t(seq) * P.max_blocks + r / P.rpb]) * P.rpb + r % P.rpb;
    s.row[st & 1][tid] = r;
    s.phys[st & 1][tid] = pr;
  };
  // cp.async of stage st's rows, absent rows zero-filled: bf16 rows in 16 chunks of 16 B. Packed
  // rows (krb = 68 B, only 4-byte aligned) as the 16-byte-aligned span around them, 5 chunks
  // into a 96-byte slot of raw at the same offset mod 16 (packed_row_at); the last chunk reads
  // only up to the row's end (src-size), so nothing past the cache is touched. The span's
  // first bytes belong to the previous row (the cache's base is 16-byte aligned, so row 0 has
  // offset 0).
  const bool packed = P.keys_packed != nullptr;
  auto fetch = [&](int st) {
    if (packed) {
      uint8_t* raw = reinterpret_cast<uint8_t*>(s.raw);
      for (int i = tid; i < kTile * 5; i += kThreads) {
        const int lr = i / 5, ch = i % 5;
        const bool ok = s.row[st & 1][lr] >= 0;
        const uintptr_t a = reinterpret_cast<uintptr_t>(P.keys_packed + (ok ? s.phys[st & 1][lr] : 0) * P.krb);
        const int off = int(a & 15u);
        const int n = !ok ? 0 : ch < 4 ? 16 : off + P.krb - 64;
        cpa16n(raw + lr * kPackedSlot + ch * 16, reinterpret_cast<const void*>(a - uintptr_t(off) + uintptr_t(16 * ch)), n);
      }
    } else {
      for (int i = tid; i < kTile * (kDi / 8); i += kThreads) {
        const int lr = i / (kDi / 8), ch = i % (kDi / 8);
        const bool ok = s.row[st & 1][lr] >= 0;
        const bf16_t* src = P.keys + (ok ? s.phys[st & 1][lr] * kDi : 0) + ch * 8;
        cpa16(s.raw + lr * kDi + ch * 8, src, ok);
      }
    }
    cpa_commit();
  };
  int n_st = 0;
  while (n_st < P.stages && e_begin + n_st * kTile < n_entries) ++n_st;
  meta(0);
  __syncthreads();
  fetch(0);

  // Warp roles and the token's q fragments (m16n8k32 A layout) and folded weights.
  const int wpt = max(1, kWarps / tc), tok = warp / wpt, nt0 = warp % wpt;
  const bool active = tok < tc;
  const int64_t t = t0 + (active ? tok : 0);
  uint32_t qa[MT][kNb][4];
  float wA[MT], wB[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int h0 = mt * 16 + g, h1 = h0 + 8;
    const uint32_t* q0 = P.q8 + (t * P.Hi + h0) * (kDi / 4);
    const uint32_t* q1 = P.q8 + (t * P.Hi + h1) * (kDi / 4);
#pragma unroll
    for (int b = 0; b < kNb; ++b) {
      qa[mt][b][0] = active ? q0[b * 8 + tig] : 0u;
      qa[mt][b][1] = active ? q1[b * 8 + tig] : 0u;
      qa[mt][b][2] = active ? q0[b * 8 + 4 + tig] : 0u;
      qa[mt][b][3] = active ? q1[b * 8 + 4 + tig] : 0u;
    }
    wA[mt] = active ? P.wq[t * P.Hi + h0] : 0.f;
    wB[mt] = active ? P.wq[t * P.Hi + h1] : 0.f;
  }

  for (int st = 0; st < n_st; ++st) {
    const int e0 = e_begin + st * kTile;
    cpa_wait_all();
    __syncthreads();  // stage st's rows landed; stage st-1's MMAs and fallbacks are done
    // Convert: warp w takes rows w, w+8, ...
    for (int lr = warp; lr < kTile; lr += kWarps) {
      const int r = s.row[st & 1][lr];
      int S = 0;
      bool fits = true;
      uint32_t code = 0;
      if (r >= 0) {
        const float4 v = packed ? packed4(P.kfmt, packed_row_at(P, s.raw, lr, s.phys[st & 1][lr]), lane)
                                : load4(reinterpret_cast<const bf16_t*>(s.raw + lr * kDi), lane);
        code = row_e4m3(v, S, fits);
      }
      reinterpret_cast<uint32_t*>(s.ks + lr * kKeyStride)[lane] = code;
      if (lane == 0) {
        s.kscale[lr] = S;
        s.krow[lr] = r;
        s.kfits[lr] = fits;
      }
    }
    if (st + 1 < n_st) meta(st + 1);
    __syncthreads();  // e4m3 rows ready, raw free, next meta visible
    if (st + 1 < n_st) fetch(st + 1);

    const int my_nv = active ? s.tn_vis[tok] : 0;
    const bool my_flag = active && s.tflag[tok];
    if (active) {
      for (int nt = nt0; nt < kTile / 8; nt += wpt) {
        float d[MT][4];
        const uint8_t* kr = s.ks + (nt * 8 + g) * kKeyStride + tig * 4;
#pragma unroll
        for (int b = 0; b < kNb; ++b) {
          const uint32_t b0 = *reinterpret_cast<const uint32_t*>(kr + b * kBlk);
          const uint32_t b1 = *reinterpret_cast<const uint32_t*>(kr + b * kBlk + 16);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            float acc[4] = {0.f, 0.f, 0.f, 0.f};  // one block per MMA, from zero: exact
            mma_e4m3(acc, qa[mt][b], b0, b1);
#pragma unroll
            for (int i = 0; i < 4; ++i) d[mt][i] = b == 0 ? acc[i] : __fadd_rn(d[mt][i], acc[i]);
          }
        }
        // term = w' * relu(d); heads g and g+8 of each tile, tiles ascending; keys 2*tig + j.
        float p0 = 0.f, p1 = 0.f;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const float a0 = __fmul_rn(wA[mt], d[mt][0] > 0.f ? d[mt][0] : 0.f);
          const float a1 = __fmul_rn(wA[mt], d[mt][1] > 0.f ? d[mt][1] : 0.f);
          const float c0 = __fmul_rn(wB[mt], d[mt][2] > 0.f ? d[mt][2] : 0.f);
          const float c1 = __fmul_rn(wB[mt], d[mt][3] > 0.f ? d[mt][3] : 0.f);
          const float pr0 = __fadd_rn(a0, c0), pr1 = __fadd_rn(a1, c1);
          p0 = mt == 0 ? pr0 : __fadd_rn(p0, pr0);
          p1 = mt == 0 ? pr1 : __fadd_rn(p1, pr1);
        }
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) {  // over g: ((p0+p1)+(p2+p3)) + ((p4+p5)+(p6+p7))
          p0 = __fadd_rn(p0, __shfl_xor_sync(0xffffffffu, p0, o));
          p1 = __fadd_rn(p1, __shfl_xor_sync(0xffffffffu, p1, o));
        }
        if (g == 0) {
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int lr = nt * 8 + 2 * tig + j, e = e0 + lr, r = s.krow[lr];
            float* out = P.scores + t * P.ld;
            if (r < 0 || r >= my_nv) {
              if (restricted && e < n_entries) out[e] = __int_as_float(0x7fc00000);
            } else if (!my_flag && s.kfits[lr]) {
              out[restricted ? e : r] = __fmul_rn(j ? p1 : p0, pow2f(s.kscale[lr]));
            }
          }
        }
      }
    }
    // Rows or tokens that are not exact in e4m3: the specification on CUDA cores.
    for (int i = tid; i < tc * kTile; i += kThreads) {
      const int tk = i / kTile, lr = i % kTile, r = s.krow[lr];
      if (r < 0 || r >= s.tn_vis[tk] || (!s.tflag[tk] && s.kfits[lr])) continue;
      const int64_t tt = t0 + tk;
      const int64_t pr = int64_t(P.block_table[int64_t(seq) * P.max_blocks + r / P.rpb]) * P.rpb + r % P.rpb;
      P.scores[tt * P.ld + (restricted ? e0 + lr : r)] =
          spec_score(P.q + tt * P.Hi * kDi, P.w + tt * P.Hi, P.key(pr), P.Hi, kDi);
    }
  }
}

// fast_simt: one thread per (token, entry), the specification for any shape.
template <class TQ, class TW, class TK>
__global__ void idx_fast_simt_kernel(FastParams<TQ, TW, TK> P) {
  pdl_enter();
  const int64_t t = blockIdx.y;
  const int e = int(blockIdx.x) * blockDim.x + threadIdx.x;
  const int n_vis = (P.tok_pos[t] + 1) / P.ratio, seq = P.tok_seq[t];
  int r = e;
  if (P.cand) {
    const int cb = P.cand_block;
    if (e >= P.cand_topk * cb) return;
    const int b = P.cand[t * P.cand_topk + e / cb];
    r = b >= 0 ? b * cb + e % cb : -1;
    if (r < 0 || r >= n_vis) {
      P.scores[t * P.ld + e] = __int_as_float(0x7fc00000);
      return;
    }
  } else if (e >= n_vis) {
    return;
  }
  const int64_t pr = int64_t(P.block_table[int64_t(seq) * P.max_blocks + r / P.rpb]) * P.rpb + r % P.rpb;
  P.scores[t * P.ld + e] = spec_score(P.q + t * P.Hi * P.di, P.w + t * P.Hi, P.key(pr), P.Hi, P.di);
}

constexpr int kGroupThreads = 1024;

// groups[g] = (first token, count): each sequence's tokens [q_start, q_start + len) in runs of
// `per`, sequences in order (what the host loop it replaces produced). One CTA: the sequences in
// rounds of kGroupThreads, an exclusive block scan of their group counts per round.
__global__ void __launch_bounds__(kGroupThreads) token_groups_kernel(const int32_t* __restrict__ q_start,
                                                                     const int32_t* __restrict__ len, int n_seqs,
                                                                     int per, int2* __restrict__ groups) {
  pdl_enter();
  __shared__ int warp_sum[kGroupThreads / 32];
  __shared__ int base;
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  if (threadIdx.x == 0) base = 0;
  __syncthreads();
  for (int s0 = 0; s0 < n_seqs; s0 += kGroupThreads) {
    const int s = s0 + int(threadIdx.x);
    const int n = s < n_seqs ? len[s] : 0, g = (n + per - 1) / per;
    int incl = g;  // inclusive scan: lanes, then warps
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(~0u, incl, o);
      if (l >= o) incl += v;
    }
    if (l == 31) warp_sum[w] = incl;
    __syncthreads();
    if (w == 0) {
      int t = warp_sum[l];
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(~0u, t, o);
        if (l >= o) t += v;
      }
      warp_sum[l] = t;
    }
    __syncthreads();
    const int at = base + incl - g + (w > 0 ? warp_sum[w - 1] : 0);
    for (int j = 0; j < g; ++j) groups[at + j] = make_int2(q_start[s] + j * per, min(per, n - j * per));
    __syncthreads();  // every thread has read base and warp_sum
    if (threadIdx.x == kGroupThreads - 1) base = at + g;
    __syncthreads();
  }
}

}  // namespace

bool indexer_fp8_shape(const IndexerArgs& a) {
  const int64_t Hi = a.q.size(1), di = a.q.size(2);
  const bool keys_ok = a.keys_pack.packed() ? a.keys.dtype == DType::U8 : a.keys.dtype == DType::BF16;
  return di == kDi && (Hi == 16 || Hi == 32 || Hi == 64) && keys_ok && a.q.dtype == DType::BF16;
}

void indexer_scores_fast(Ctx& c, const IndexerArgs& a, const StepMeta& m, int64_t ld, float* scores, FastScorer how) {
  const bool mma = how != FastScorer::Simt;
  const int T = int(a.q.size(0)), Hi = int(a.q.size(1)), di = int(a.q.size(2));
  const bool restricted = !a.cand_in.empty();
  int max_pos = 0;
  for (int32_t p : m.h_tok_pos) max_pos = std::max(max_pos, int(p));
  const int64_t n_entries = restricted ? int64_t(a.cand_topk) * a.cand_block : (max_pos + 1) / a.ratio;
  if (T == 0 || n_entries == 0) return;
  const bool packed = a.keys_pack.packed();
  DIL_CHECK(!packed || (a.keys.dtype == DType::U8 && a.keys_pack.format == kvpack::Format::Fp4B32 &&
                        a.keys_pack.d == di && a.keys.size(2) == int64_t(kvpack::row_bytes(a.keys_pack))),
            "indexer: packed keys ", a.keys.shape_str(), " ", dtype_name(a.keys.dtype), " for di ", di);
  DIL_CHECK(!packed || reinterpret_cast<uintptr_t>(a.keys.data) % 16 == 0,
            "indexer: packed keys must start 16-byte aligned (mma_fp8 copies 16-byte spans)");
  auto fill = [&](auto& P) {
    P.Hi = Hi;
    P.di = di;
    P.tok_seq = m.tok_seq.ptr<int32_t>();
    P.tok_pos = m.tok_pos.ptr<int32_t>();
    P.block_table = m.block_table.ptr<int32_t>();
    P.ratio = a.ratio;
    P.rpb = a.rows_per_block;
    P.max_blocks = m.max_blocks;
    P.scores = scores;
    P.ld = ld;
    P.cand = restricted ? a.cand_in.ptr<int32_t>() : nullptr;
    P.cand_topk = a.cand_topk;
    P.cand_block = a.cand_block;
    // Packed keys (IndexerArgs::keys_pack): U8 [n_blocks, rpb, row bytes], read through P.key.
    if (packed) {
      P.keys = nullptr;
      P.keys_packed = a.keys.ptr<const uint8_t>();
      P.kfmt = KvRow{a.keys_pack.format, a.keys_pack.d, a.keys_pack.rope};
      P.krb = int(a.keys.size(2));
    }
  };
  if (!mma) {
    with_act(a.q, "indexer q", [&](auto tq) {
      using TQ = decltype(tq);
      with_act(a.w, "indexer w", [&](auto tw) {
        using TW = decltype(tw);
        auto go = [&](auto tk) {
          using TK = decltype(tk);
          FastParams<TQ, TW, TK> P{};
          P.keys = a.keys.ptr<const TK>();
          fill(P);
          P.q = a.q.ptr<const TQ>();
          P.w = a.w.ptr<const TW>();
          dim3 grid(unsigned(ceil_div(n_entries, 128)), unsigned(T));
          launch_pdl(c, "idx_fast_simt_kernel", idx_fast_simt_kernel<TQ, TW, TK>, dim3(grid), dim3(128), 0, P);
        };
        if (packed) go(bf16_t{});  // TK unused: the keys are read through keys_packed
        else with_act(a.keys, "indexer keys", go);
      });
    });
    return;
  }
  const bool wg = how == FastScorer::Wgmma;
  const char* name = wg ? "indexer wgmma_fp8" : "indexer mma_fp8";
  DIL_CHECK(indexer_fp8_shape(a), name, ": unsupported q ", a.q.shape_str(), " keys ", dtype_name(a.keys.dtype));
  DIL_CHECK(!wg || !restricted, name, ": Reindex steps (cand_in) run mma_fp8");
  // Work groups: up to `per` consecutive tokens of one sequence (one token in Reindex, whose
  // tokens have rows of their own), in token order. Their count comes from the host's copy of
  // the lengths, their contents are written on the device from m.q_start / m.len (no upload
  // in the middle of the forward).
  const int per = restricted ? 1 : wg ? wgmma_group_tokens(Hi) : kMaxTok;
  int64_t n_groups = 0;
  for (int s = 0; s < m.n_seqs; ++s) n_groups += (m.h_len[size_t(s)] + per - 1) / per;
  DIL_CHECK(n_groups <= 65535, name, ": ", n_groups, " token groups");
  Buffer gb = c.scratch(size_t(std::max<int64_t>(n_groups, 1)) * sizeof(int2));
  launch_pdl(c, "token_groups_kernel", token_groups_kernel, dim3(1), dim3(kGroupThreads), 0, m.q_start.ptr<int32_t>(), m.len.ptr<int32_t>(), m.n_seqs,
                                                          per, static_cast<int2*>(gb.data()));
  Buffer qb = c.scratch(size_t(T) * Hi * kDi), wb = c.scratch(size_t(T) * Hi * 4), fb = c.scratch(size_t(T) * 4);
  uint32_t* q8 = static_cast<uint32_t*>(qb.data());  // [T, Hi, 32] words of 4 e4m3
  float* wq = static_cast<float*>(wb.data());         // [T, Hi]
  int32_t* tok_flag = static_cast<int32_t*>(fb.data());  // [T]
  DIL_CUDA(cudaMemsetAsync(tok_flag, 0, size_t(T) * 4, c.stream));
  DIL_CHECK(a.q.dtype == DType::BF16, name, ": q ", dtype_name(a.q.dtype), " (bf16 activations)");
  {
    using TQ = bf16_t;
    with_act(a.w, "indexer w", [&](auto tw) {
      using TW = decltype(tw);
      launch_pdl(c, "q_prep_kernel", q_prep_kernel<TQ, TW>, dim3(unsigned(T)), dim3(kThreads), 0, a.q.ptr<const TQ>(), a.w.ptr<const TW>(), Hi, q8,
                                                                     wq, tok_flag);
      FastParams<TQ, TW, bf16_t> P{};
      P.keys = a.keys.ptr<const bf16_t>();
      fill(P);
      P.q = a.q.ptr<const TQ>();
      P.w = a.w.ptr<const TW>();
      P.q8 = q8;
      P.wq = wq;
      P.tok_flag = tok_flag;
      P.groups = static_cast<const int2*>(gb.data());
      if (wg) {
        launch_idx_wgmma(P, n_entries, n_groups, c.stream);
        return;
      }
      const size_t sm = sizeof(StageSmem);
      auto go = [&](auto kern) {
        DIL_CUDA(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(sm)));
        // kStages key tiles per CTA, fewer where the step's groups would not fill one resident
        // wave (decode: one group per sequence; at batch 1 and 8K context 4 CTAs took 43 us).
        // Rows are scored independently of the CTA that holds them: the same scores.
        const int64_t wave = c.resident(kern, kThreads, sm);
        P.stages = kStages;
        while (P.stages > 1 && ceil_div(n_entries, int64_t(P.stages) * kTile) * n_groups < wave) P.stages /= 2;
        const dim3 grid(unsigned(ceil_div(n_entries, int64_t(P.stages) * kTile)), unsigned(n_groups));
        kern<<<grid, kThreads, sm, c.stream>>>(P);
      };
      switch (Hi) {
        case 16: go(idx_fp8_kernel<1, TQ, TW>); break;
        case 32: go(idx_fp8_kernel<2, TQ, TW>); break;
        default: go(idx_fp8_kernel<4, TQ, TW>); break;
      }
      DIL_LAUNCH_CHECK("idx_fp8_kernel");
    });
  }
}

}  // namespace dil::cuda
