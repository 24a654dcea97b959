// The fast-numerics GEMV (`gemv` in registry.cpp): out[r, n] = sum_k x[r, k] W[n, k] for a few
// activation rows r (linear: T <= kGvMaxRows; routed experts: tiles of <= kGvMoeRows rows of one
// expert), streaming every weight byte once at HBM speed. The layout, for the weight formats
// BF16, FP8 e4m3 with E8M0 blocks (bk a multiple of 16: V4 128x128, V4.1 32x32) and FP4 e2m1
// with E8M0 per 32:
// - A CTA of 8 warps; each warp owns kGvRowsPerWarp weight rows and one of KS slices of K
//   (KS in {1, 2, 4, 8}, chosen by the launcher so that small weights still fill the GPU).
//   Lanes walk K in 16-byte chunks (8 BF16, 16 FP8 or 32 FP4 weights), lane l taking chunks
//   l, l + 32, ...: every warp load is 512 contiguous bytes of a row, and kGvUnroll chunks of
//   every row (kGvRowsPerWarp x kGvUnroll 16-byte loads per lane) are in flight at once.
// - The activation rows (bf16: already FP8-QDQ'd where the op quantizes, exact in bf16) are
//   staged in shared memory once per CTA, permuted so that the 16-byte pieces a warp reads for
//   its 32 chunks are contiguous (no bank conflicts), and reused by the warp's rows from
//   registers.
// - Decoding: BF16 by a shift; FP8 by Hopper's cvt.rn.f16x2.e4m3x2 (exact) then f16 -> f32; FP4
//   by re-biasing each e2m1 nibble into an e4m3 byte (value x 2^-6, exact) and the same cvt.
//   Products are exact in f32 (bf16 x <= 8 significant bits of a weight); each chunk's sum is
//   accumulated in f32 (fmaf, k ascending within the chunk), multiplied by its block scale
//   (a power of two: exact; FP4's 2^6 likewise) and added into the lane's f32 accumulator; the
//   32 lanes are reduced by warp shuffles (xor tree) and the KS slices in slice order.
// So the result is the exact sum rounded by at most depth = V + ceil(C / 32) + 5 + KS f32
// additions per term (V values per chunk, C chunks per row): the bound tests/cuda/test_gemv.cpp
// derives and checks.
#pragma once
#include <cuda_fp16.h>

#include "kernels/cuda/hopper.cuh"
#include "kernels/cuda/moe_mma.cuh"
#include "kernels/cuda/ops.cuh"

namespace dil::cuda {

constexpr int kGvWarps = 8, kGvThreads = 32 * kGvWarps, kGvRowsPerWarp = 4, kGvUnroll = 2;
constexpr int kGvMaxRows = 8;  // linear: activation rows per launch (template R in {1, 2, 4, 8})
constexpr int kGvMoeRows = 4;  // routed experts: sorted rows per tile (R in {1, 2, 4} per tile)
constexpr int64_t kGvMaxK = 8192;  // kGvMaxRows x K bf16 in shared memory: 128 KB

// Values of one 16-byte chunk for a weight kind (Weight::Kind as int: 1 BF16, 2 FP8, 3 FP4).
template <int FMT>
constexpr int gv_values() {
  return FMT == 1 ? 8 : FMT == 2 ? 16 : 32;
}

// Two e4m3 bytes (low byte first) -> their values as f32 (exact: e4m3 fits f16).
__device__ __forceinline__ float2 gv_e4m3x2(uint32_t two) {
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(uint16_t(two)));
  __half2 v = *reinterpret_cast<__half2*>(&h);
  return __half22float2(v);
}

// bf16 pair (low half first) -> f32.
__device__ __forceinline__ float gv_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float gv_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// Decodes value group g (8 consecutive values of the chunk, g < V/8) of a 16-byte chunk into
// wv[0..7] (k order), unscaled: BF16 exact, FP8 the e4m3 values, FP4 e2m1 x 2^-6.
template <int FMT>
__device__ __forceinline__ void gv_decode8(const uint4& q, int g, float wv[8]) {
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
  if constexpr (FMT == 1) {  // 8 bf16 in the chunk: g == 0
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      wv[2 * i] = gv_lo(words[i]);
      wv[2 * i + 1] = gv_hi(words[i]);
    }
  } else if constexpr (FMT == 2) {  // 16 e4m3: group g is words 2g, 2g + 1
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t w = words[2 * g + i];
      const float2 a = gv_e4m3x2(w & 0xffffu), b = gv_e4m3x2(w >> 16);
      wv[4 * i] = a.x;
      wv[4 * i + 1] = a.y;
      wv[4 * i + 2] = b.x;
      wv[4 * i + 3] = b.y;
    }
  } else {  // 32 e2m1: group g is word g, nibble j (low first) = value j
    uint32_t lo, hi;  // nibbles 0, 2, 4, 6 and 1, 3, 5, 7 as e4m3 bytes (value x 2^-6)
    d_e2m1x8_e4m3(words[g], lo, hi);
    const float2 l0 = gv_e4m3x2(lo & 0xffffu), l1 = gv_e4m3x2(lo >> 16);
    const float2 h0 = gv_e4m3x2(hi & 0xffffu), h1 = gv_e4m3x2(hi >> 16);
    wv[0] = l0.x;
    wv[2] = l0.y;
    wv[4] = l1.x;
    wv[6] = l1.y;
    wv[1] = h0.x;
    wv[3] = h0.y;
    wv[5] = h1.x;
    wv[7] = h1.y;
  }
}

// Shared-memory position (in bf16 elements, within one activation row) of value group g of
// chunk c, for a row of C chunks: groups of the same index are contiguous across chunks.
__device__ __forceinline__ int64_t gv_xpos(int64_t c, int g, int64_t C) { return (int64_t(g) * C + c) * 8; }

// Stages rows [0, R) of the CTA's activations into xs (bf16, permuted as gv_xpos; rows >= nrows
// zero). Row r is read at x + row_of(r) * ldx. vec: 16-byte aligned rows (else element copies).
template <int FMT, class RowOf>
__device__ __forceinline__ void gv_stage(uint16_t* xs, const uint16_t* x, int64_t ldx, RowOf row_of, int nrows,
                                         int R, int64_t K, bool vec) {
  constexpr int V = gv_values<FMT>();
  const int C = int(K) / V, groups = int(K) / 8;  // 32-bit index math: R <= 8, K <= 8192
  for (int i = threadIdx.x; i < R * groups; i += blockDim.x) {
    const int r = i / groups;
    const int q = i % groups;  // values [8q, 8q + 8) of the row
    const int c = (8 * q) / V;
    const int g = ((8 * q) % V) / 8;
    uint16_t* dst = xs + r * int(K) + gv_xpos(c, g, C);
    if (r >= nrows) {
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      continue;
    }
    const uint16_t* src = x + int64_t(row_of(r)) * ldx + 8 * q;
    if (vec) {
      *reinterpret_cast<uint4*>(dst) = __ldg(reinterpret_cast<const uint4*>(src));
    } else {
      uint32_t v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = uint32_t(src[2 * j]) | (uint32_t(src[2 * j + 1]) << 16);
      *reinterpret_cast<uint4*>(dst) = make_uint4(v[0], v[1], v[2], v[3]);
    }
  }
}

// gv_stage with the act_quant FP8 QDQ of x in blocks of A (fp8_qdq's values: the block's amax,
// s = d_act_scale(amax), d_act_round(v, s) * s, exact in bf16), in one pass: warp w (of the
// first kGvWarps: a CTA may have more) takes blocks w, w + kGvWarps, ... (4 of them in flight),
// each lane A / 32 consecutive values of a block (one 8-value group), the amax by a warp max
// (exact in any order). Rows [T, R) zero. Every CTA of a GEMV stages x, so the per-value work is
// kept short: 32-bit indices (T <= 8, K <= 8192), and v / s as v x (1 / s) with 1 / s taken once
// per block: s is a power of two in [2^-22, 2^120] or inf (d_act_scale), so 1 / s is exact and
// the product is the same once-rounded quotient (inf: 0, giving v / inf's 0 or NaN likewise).
template <int FMT, int A>
__device__ __forceinline__ void gv_stage_qdq(uint16_t* xs, const uint16_t* x, int64_t ldx, int T, int R, int64_t K,
                                             bool vec) {
  constexpr int PL = A / 32, U = 4, V = gv_values<FMT>();
  static_assert(A % 32 == 0 && PL <= 8, "one 8-value group per lane and block");
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int Ki = int(K), nblk = Ki / A, total = warp < kGvWarps ? T * nblk : 0, C = Ki / V;
  for (int rb0 = warp; rb0 < total; rb0 += kGvWarps * U) {
    uint16_t v[U][PL];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int rb = rb0 + u * kGvWarps;
      const uint16_t* src = x + int64_t(rb / nblk) * ldx + (rb % nblk) * A + lane * PL;
      if (rb >= total) {
#pragma unroll
        for (int p = 0; p < PL; ++p) v[u][p] = 0;
      } else if (PL == 4 && vec) {  // 8-byte aligned: rows 16-byte aligned, blocks of 128
        const uint2 w = __ldg(reinterpret_cast<const uint2*>(src));
        v[u][0] = uint16_t(w.x), v[u][1 % PL] = uint16_t(w.x >> 16);
        v[u][2 % PL] = uint16_t(w.y), v[u][3 % PL] = uint16_t(w.y >> 16);
      } else {
#pragma unroll
        for (int p = 0; p < PL; ++p) v[u][p] = src[p];
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int rb = rb0 + u * kGvWarps;
      if (rb >= total) break;  // warp-uniform
      float amax = 0.f;
#pragma unroll
      for (int p = 0; p < PL; ++p) amax = fmaxf(amax, fabsf(__uint_as_float(uint32_t(v[u][p]) << 16)));
      const float sc = d_act_scale(warp_max(amax)), inv = 1.0f / sc;
      const int r = rb / nblk, k0 = (rb % nblk) * A + lane * PL;  // first value of the lane
      uint16_t* dst = xs + r * Ki + gv_xpos(k0 / V, (k0 % V) / 8, C) + k0 % 8;
#pragma unroll
      for (int p = 0; p < PL; ++p) {
        const float q = d_round_e4m3(fminf(fmaxf(__uint_as_float(uint32_t(v[u][p]) << 16) * inv, -448.f), 448.f));
        dst[p] = uint16_t(__float_as_uint(d_round_bf16(q * sc)) >> 16);
      }
    }
  }
  for (int i = threadIdx.x; i < (R - T) * int(K); i += blockDim.x) xs[T * K + i] = 0;
}

// One weight row as the warp reads it: its bytes, and its E8M0 scale row (null: BF16).
struct GvRow {
  const uint8_t* w = nullptr;   // row start; null: a padding row (not read, result unused)
  const uint8_t* s = nullptr;   // scale row start (FP8: block row n / bn; FP4: row n)
};

// The warp's part of out for its kGvRowsPerWarp rows over chunks [c0, c1) (lane-strided):
// acc[i][r] += the f32 sums of row i with activation row r (R rows staged in xs).
// cps: log2 of the chunks per scale column (FP8 log2(bk / 16), a power of two; FP4 0): a shift,
// where a division of the 64-bit chunk index cost ~60 instructions per chunk and row.
template <int FMT, int R>
__device__ __forceinline__ void gv_warp(const uint16_t* xs, int64_t K, const GvRow (&rows)[kGvRowsPerWarp], int64_t c0,
                                        int64_t c1, int cps, float (&acc)[kGvRowsPerWarp][R]) {
  constexpr int V = gv_values<FMT>(), G = V / 8;
  const int64_t C = K / V;
  const int lane = threadIdx.x & 31;
  for (int64_t cb = c0 + lane; cb < c1; cb += 32 * kGvUnroll) {
    uint4 q[kGvRowsPerWarp][kGvUnroll];
    float sc[kGvRowsPerWarp][kGvUnroll];
    // All loads of the step first (kGvRowsPerWarp x kGvUnroll 16-byte loads in flight).
#pragma unroll
    for (int u = 0; u < kGvUnroll; ++u) {
      const int64_t c = cb + 32 * u;
#pragma unroll
      for (int i = 0; i < kGvRowsPerWarp; ++i) {
        const bool ok = c < c1 && rows[i].w;
        q[i][u] = ok ? __ldg(reinterpret_cast<const uint4*>(rows[i].w) + c) : make_uint4(0, 0, 0, 0);
        if constexpr (FMT != 1) sc[i][u] = ok ? d_e8m0_fast(__ldg(rows[i].s + (c >> cps))) : 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < kGvUnroll; ++u) {
      const int64_t c = cb + 32 * u;
      if (c >= c1) break;  // warp-uniform only at the tail; lanes past it skip
      float part[kGvRowsPerWarp][R];
#pragma unroll
      for (int i = 0; i < kGvRowsPerWarp; ++i)
#pragma unroll
        for (int r = 0; r < R; ++r) part[i][r] = 0.f;
#pragma unroll
      for (int g = 0; g < G; ++g) {
        // The 8 activation values of group g for every row, from shared memory.
        uint4 xv[R];
#pragma unroll
        for (int r = 0; r < R; ++r) xv[r] = *reinterpret_cast<const uint4*>(xs + int64_t(r) * K + gv_xpos(c, g, C));
#pragma unroll
        for (int i = 0; i < kGvRowsPerWarp; ++i) {
          float wv[8];
          gv_decode8<FMT>(q[i][u], g, wv);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const uint32_t xw[4] = {xv[r].x, xv[r].y, xv[r].z, xv[r].w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              part[i][r] = fmaf(gv_lo(xw[j]), wv[2 * j], part[i][r]);
              part[i][r] = fmaf(gv_hi(xw[j]), wv[2 * j + 1], part[i][r]);
            }
          }
        }
      }
#pragma unroll
      for (int i = 0; i < kGvRowsPerWarp; ++i)
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if constexpr (FMT == 1) acc[i][r] += part[i][r];
          else if constexpr (FMT == 2) acc[i][r] = fmaf(part[i][r], sc[i][u], acc[i][r]);
          else acc[i][r] = fmaf(part[i][r] * 64.f, sc[i][u], acc[i][r]);  // e2m1 = decoded x 2^6
        }
    }
  }
  // Reduce over the lanes (the same xor tree in every lane: all hold the sum).
#pragma unroll
  for (int i = 0; i < kGvRowsPerWarp; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[i][r] = warp_sum(acc[i][r]);
}

// L2 prefetch of the first kGvUnroll steps of the warp's chunks [c0, c1) of its rows (what
// gv_warp loads first), one 16-byte chunk address per lane and row and step.
__device__ __forceinline__ void gv_prefetch(const GvRow (&rows)[kGvRowsPerWarp], int64_t c0, int64_t c1) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int u = 0; u < kGvUnroll; ++u) {
    const int64_t c = c0 + lane + 32 * u;
#pragma unroll
    for (int i = 0; i < kGvRowsPerWarp; ++i)
      if (c < c1 && rows[i].w) sm90::prefetch_l2(rows[i].w + 16 * c);
  }
}

// The weight row pointers of weight row n of w (n < w.n).
__device__ __forceinline__ GvRow gv_row(const WView& w, int64_t n) {
  GvRow g;
  if (w.kind == 1) {
    g.w = static_cast<const uint8_t*>(w.w) + n * w.k * 2;
  } else if (w.kind == 2) {
    g.w = static_cast<const uint8_t*>(w.w) + n * w.k;
    g.s = w.scale + (n / w.bn) * w.scale_cols;
  } else {
    g.w = static_cast<const uint8_t*>(w.w) + n * (w.k >> 1);
    g.s = w.scale + n * w.scale_cols;
  }
  return g;
}
__device__ __forceinline__ int gv_cps(const WView& w) { return w.kind == 2 ? __ffs(w.bk / 16) - 1 : 0; }
// Whether a launcher can take FP8 K blocks of bk: 16 x a power of two (V4 128, V4.1 32).
inline bool gv_block_ok(int64_t bk) { return bk >= 16 && bk % 16 == 0 && ((bk / 16) & (bk / 16 - 1)) == 0; }

// ---- launchers (gemv_fast.cu, moe_gemv.cu) ----

// Slices of K per weight row (KS) for a weight of n_rows rows with C chunks per row: the
// smallest that gives at least two CTAs per SM (132 SMs), at most 8, and never slices of
// fewer than 32 chunks (one per lane).
int gv_ksplit(int64_t n_rows, int64_t chunks);

// Weight groups of one launch (grouped_linear): group g reads x + g * x_stride, weight rows
// [g * w.n, (g + 1) * w.n) of the view's weight, writes out + g * out_stride.
struct GvGroups {
  int n = 1;
  int64_t x_stride = 0, out_stride = 0;  // elements
};

// Whether gemv_fast can apply the act_quant QDQ of blocks of `act` itself, while staging x: FP8
// weights (kind 2), act 32 or 128 dividing K.
inline bool gv_stages_qdq(int kind, int64_t k, int act) {
  return kind == 2 && (act == 32 || act == 128) && k % act == 0;
}

// linear in fast numerics, T <= kGvMaxRows rows: x [T, K] bf16, row stride ldx; out [T, N]
// (ldo) f32 or bf16, rounded once. act > 0 (gv_stages_qdq, one group): the kernel stages x
// FP8-QDQ'd in blocks of act (the official act_quant, as fp8_qdq computes it: exact in bf16);
// 0: as given. With groups: every group's [T, N] in the one launch (w.n = N rows per group).
template <class TO>
void gemv_fast(Ctx& c, const bf16_t* x, int64_t ldx, int64_t T, const WView& w, TO* out, int64_t ldo,
               const GvGroups& groups = {}, int act = 0);

// The same product (same per-row arithmetic and bound) by streaming (gemv_stream.cu): each CTA
// owns a contiguous range of weight rows and a dedicated producer warp brings them through a ring
// of shared-memory stages by bulk copies (the first stages issued before the kernel waits for its
// inputs), so HBM sees a steady stream instead of one round trip per row block.
template <class TO>
void gemv_stream(Ctx& c, const bf16_t* x, int64_t ldx, int64_t T, const WView& w, TO* out, int64_t ldo,
                 const GvGroups& groups = {}, int act = 0);

// Routed experts at decode sizes (moe.cu, impl "gemv"): over the tile map of kGvMoeRows-row
// tiles, (1) h = SwiGLU(w1 x, w3 x) * route_w for every sorted row (w1 and w3 rows of the same
// columns in one pass; g, u, h rounded to bf16 when round_bf16), written f32 [rows, I]; the
// caller FP8-QDQs h into hb; (2) y = w2 h (hb bf16 [rows, I], sorted order) f32 [rows, D].
// xq: the tokens [T, D] bf16 (QDQ'd), gathered through sorted_tok.
struct GvMoeArgs {
  const bf16_t* xq;
  const int32_t* sorted_tok;   // [rows] token of each sorted row
  const int32_t* sorted_pair;  // [rows] t * k + slot
  const float* route_w;        // [T * k]
  const WView *w1, *w2, *w3;   // device tables [E]
  MoeTileMap map;
  int max_tiles;
  int64_t D, I;
  float limit;
  bool round_bf16;
};
void moe_gemv_w13(Ctx& c, const GvMoeArgs& a, float* h);
void moe_gemv_w2(Ctx& c, const GvMoeArgs& a, const bf16_t* hb, float* y);

}  // namespace dil::cuda
