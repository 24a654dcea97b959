// Fast numerics' mHC (model-spec §3.3) at HBM speed, and the dispatch of the fused pre and of
// hc_post between the fast and the exact kernels (mhc.cu).
//
// hc_pre "fused_fast" (bf16 streams X [T, 4, D], bf16 xn, fn with 24 rows or 4 for the head;
// hc_mix "fast_f32" is its steps 1 and 2):
//   1. hc_dots: the mixes X . fn^T on tensor cores, split over K: CTA per (128 tokens, K
//      slice), fn split once per call into three exact bf16 pieces, staged in shared memory, X rows read once from
//      global memory into mma.sync fragments, the sums promoted to f32 every 64 columns; the sum
//      of squares of X on CUDA cores from the same registers; partial sums [S, T, m + 1] (last:
//      sum of squares). 24 dots of 16,384 per token are 12 FMA per byte of X, more than the
//      H200's CUDA cores give per byte of HBM (~8): only tensor cores keep this pass memory-bound.
//   2. hc_scalars: warp per token, partials summed (lanes over slices, then a shuffle tree),
//      rho, sigmoids and Sinkhorn in the reference's f32 order, a Sinkhorn entry per lane
//      (mhc.cuh hc_token_scalars_warp4).
//   3. hc_collapse_norm: CTA per token, X read once more with 16-byte loads, the collapse in
//      f32 rounded to bf16 (the official hc_pre's y.to(bf16)), the RMSNorm of that row
//      (sum of squares in f32), xn written in bf16.
// Bytes: X twice (2 x 8 D bytes per token), xn once; fn (1.5 MB at V4-Flash) from L2 per
// 128-token tile. Tolerance (registry.cpp, derived in tests/cuda/test_mhc_fast.cpp): the
// accumulation of the dots (tensor cores within a chunk, f32 across), carried through the
// sigmoids, Sinkhorn and the bf16 roundings.
// hc_post "vec_f32" (bf16 F, X, out, n = 4): thread per (token, 8 columns), f32 FMA, 16-byte
// loads and stores.
#include "kernels/cuda/mhc.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ops.cuh"

namespace dil::cuda {
namespace {

constexpr int kN = 4;          // streams the fast kernels are written for (V4 / V4.1 hc_mult)
constexpr int kTcTok = 128;    // tokens per hc_dots CTA: 4 warps x two m16 tiles
constexpr int kTcK = 64;       // columns per chunk: one promotion of the tensor-core sums
constexpr int kTcStride = 96;  // bf16 per shared row of fn pieces: 192 B, conflict-free 16-byte reads
constexpr int kKc = 64;        // the fast kernels' column granularity (D % kKc == 0)
constexpr int kMaxGroups = 4;  // 8-column groups per thread in hc_collapse_norm: D <= 8192

__device__ __forceinline__ float lo_bf16(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi_bf16(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
// Element e (0..7) of 8 packed bf16 values.
__device__ __forceinline__ float bf16_at(const uint4& v, int e) {
  const uint32_t w = e < 2 ? v.x : e < 4 ? v.y : e < 6 ? v.z : v.w;
  return (e & 1) ? hi_bf16(w) : lo_bf16(w);
}
__device__ __forceinline__ uint4 pack_bf16(const float* v) {  // v[8], each already exact in bf16 or rounded here
  return make_uint4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]), pack_bf16x2(v[4], v[5]), pack_bf16x2(v[6], v[7]));
}

// The three bf16 pieces of an f32 weight: f = hi + mid + lo exactly (hi and mid RNE to 8
// significant bits, each residual exact in f32; what is left after mid has at most 8 bits, so lo
// holds it exactly; no underflow at mHC weight magnitudes, bf16 having f32's exponent range).
// Products of a bf16 x with each piece are exact in f32, so the tensor cores see f's full value.
__device__ __forceinline__ void split3_bf16(float f, uint16_t& hi, uint16_t& mid, uint16_t& lo) {
  const float h = d_round_bf16(f), r = f - h, m = d_round_bf16(r);
  hi = bf16_bits(h), mid = bf16_bits(m), lo = bf16_bits(r - m);
}
__device__ __forceinline__ uint32_t word_at(const uint4& v, int w) { return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w; }

// pieces [3, m, nd] bf16 = split3_bf16 of fn [m, nd] f32, once per call (fn is 1.5 MB at
// V4-Flash): done per CTA it was the larger half of hc_dots' instructions.
__global__ void hc_split_fn_kernel(const float* fn, int64_t n4, uint16_t* pieces) {
  pdl_enter();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n4; i += int64_t(gridDim.x) * blockDim.x) {
    const float4 f = reinterpret_cast<const float4*>(fn)[i];
    const float fv[4] = {f.x, f.y, f.z, f.w};
    uint16_t pc[3][4];
#pragma unroll
    for (int e = 0; e < 4; ++e) split3_bf16(fv[e], pc[0][e], pc[1][e], pc[2][e]);
#pragma unroll
    for (int s = 0; s < 3; ++s)
      reinterpret_cast<uint2*>(pieces + s * n4 * 4)[i] =
          make_uint2(pc[s][0] | (uint32_t(pc[s][1]) << 16), pc[s][2] | (uint32_t(pc[s][3]) << 16));
  }
}

// part[s, t, r] = sum over columns k of slice s of fn[r, k] X[t, k] (r < M), part[s, t, M] =
// sum of X[t, k]^2. X [T, nd] bf16, P [3, M, nd] bf16 fn's pieces (hc_split_fn_kernel); nd and
// ks multiples of kTcK. CTA = 4 warps x 32 tokens (two m16 tiles each); per chunk of kTcK columns
// the CTA stages the pieces' chunk in shared memory, each warp loads its X rows straight from
// global memory as 16-byte segments and runs mma.sync m16n8k16 for the three pieces (the column
// order inside a segment is permuted identically for A and B: a dot product does not care), into
// a chunk accumulator that is added to the f32 total once per chunk (DeepGEMM's promotion, here
// against the tensor cores' truncating accumulation; test_mhc_fast.cpp derives the bound). The
// sum of squares runs on CUDA cores from the same registers, per chunk then into the total.
// Deterministic and independent of the other tokens of the step.
template <int M>
__global__ void __launch_bounds__(128, 3) hc_dots_kernel(const bf16_t* X, const uint16_t* P, int64_t T, int64_t nd,
                                                      int64_t ks, float* part) {
  pdl_enter();
  constexpr int NT = (M + 7) / 8, R = NT * 8;  // n tiles of 8 mixes; rows M..R-1 are zeros
  __shared__ __align__(16) uint16_t fs[3][R][kTcStride];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, q = lane & 3;
  const int64_t t0 = int64_t(blockIdx.x) * kTcTok + warp * 32;
  const int64_t k_begin = int64_t(blockIdx.y) * ks, k_end = min(nd, k_begin + ks);
  for (int p = M * kTcStride + tid; p < R * kTcStride; p += 128)
    for (int s = 0; s < 3; ++s) (&fs[s][0][0])[p] = 0;
  // This thread's four X rows: i = 2 mt + hh is row t0 + 16 mt + 8 hh + g; 8 columns from 8 q.
  const bf16_t* xr[4];
  bool ok[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t t = t0 + 16 * (i >> 1) + 8 * (i & 1) + g;
    ok[i] = t < T;
    xr[i] = X + (ok[i] ? t : 0) * nd + 8 * q;
  }
  float acc[2][NT][4], ss[4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) ss[i] = 0.f;
  // Software pipeline: chunk i + 1's X rows and pieces are loaded into registers while chunk i
  // is multiplied, so each CTA keeps its next 16 KB of X in flight behind its tensor-core work.
  constexpr int PQ = (3 * M * (kTcK / 8) + 127) / 128;  // 16-byte piece segments per thread per chunk
  uint4 xv[4][2], xn[4][2];                             // [row][half]: columns k0 + 32 h + 8 q .. + 7
  uint4 pr[PQ];
  auto load = [&](int64_t k0, uint4 (&x)[4][2]) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        x[i][h] = ok[i] ? *reinterpret_cast<const uint4*>(xr[i] + k0 + 32 * h) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int f = 0; f < PQ; ++f) {
      const int p = tid + 128 * f, sr = p / (kTcK / 8), c = (p % (kTcK / 8)) * 8;  // sr = piece * M + row
      if (p < 3 * M * (kTcK / 8)) pr[f] = *reinterpret_cast<const uint4*>(P + int64_t(sr) * nd + k0 + c);
    }
  };
  load(k_begin, xv);
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kTcK) {
    __syncthreads();  // the previous chunk's pieces are read
#pragma unroll
    for (int f = 0; f < PQ; ++f) {
      const int p = tid + 128 * f, sr = p / (kTcK / 8), c = (p % (kTcK / 8)) * 8;
      if (p < 3 * M * (kTcK / 8)) *reinterpret_cast<uint4*>(&fs[sr / M][sr % M][c]) = pr[f];
    }
    const bool more = k0 + kTcK < k_end;
    if (more) load(k0 + kTcK, xn);
    __syncthreads();
    float cc[2][NT][4], sc[4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) cc[mt][nt][e] = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      sc[i] = 0.f;
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float x = bf16_at(xv[i][h], e);
          sc[i] = fmaf(x, x, sc[i]);
        }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int s = 0; s < 3; ++s) {
        uint4 b[NT];  // words 2 kk, 2 kk + 1: b0, b1 of k-step kk (fn row nt * 8 + g)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) b[nt] = *reinterpret_cast<const uint4*>(&fs[s][nt * 8 + g][32 * h + 8 * q]);
#pragma unroll
        for (int kk = 0; kk < 2; ++kk)
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            const uint32_t a[4] = {word_at(xv[2 * mt][h], 2 * kk), word_at(xv[2 * mt + 1][h], 2 * kk),
                                   word_at(xv[2 * mt][h], 2 * kk + 1), word_at(xv[2 * mt + 1][h], 2 * kk + 1)};
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) mma_bf16(cc[mt][nt], a, word_at(b[nt], 2 * kk), word_at(b[nt], 2 * kk + 1));
          }
      }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mt][nt][e] += cc[mt][nt][e];
#pragma unroll
    for (int i = 0; i < 4; ++i) ss[i] += sc[i];
    if (more)
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) xv[i][h] = xn[i][h];
  }
  float* out = part + int64_t(blockIdx.y) * T * (M + 1);
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 2 * mt + (e >> 1), col = nt * 8 + 2 * q + (e & 1);
        const int64_t t = t0 + 16 * mt + 8 * (e >> 1) + g;
        if (ok[i] && col < M) out[t * (M + 1) + col] = acc[mt][nt][e];
      }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float v = ss[i];
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    if (q == 0 && ok[i]) out[(t0 + 16 * (i >> 1) + 8 * (i & 1) + g) * (M + 1) + M] = v;
  }
}

// Warp per token: the S partial sums (lanes over slices, then a shuffle tree), rho as the
// reference forms it from the sum of squares, then the scalar tail across the lanes.
template <int M>
__global__ void hc_scalars_kernel(const float* part, int S, int64_t T, int64_t nd, const float* base,
                                  const float* scale, int iters, float norm_eps, float eps, float* pre, float* post,
                                  float* comb) {
  pdl_enter();
  const int lane = threadIdx.x & 31;
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (t >= T) return;  // whole warps leave together
  float v[M + 1];
#pragma unroll
  for (int r = 0; r <= M; ++r) v[r] = 0.f;
#pragma unroll 4  // four slices' loads in flight per lane (S = 256 at decode sizes)
  for (int s = lane; s < S; s += 32) {
    const float* p = part + (int64_t(s) * T + t) * (M + 1);
#pragma unroll
    for (int r = 0; r <= M; ++r) v[r] += p[r];
  }
#pragma unroll
  for (int r = 0; r <= M; ++r) v[r] = warp_sum(v[r]);  // butterfly: the same sums in every lane
  const float rho = float(1.0 / sqrt(double(v[M]) / double(nd) + double(norm_eps)));
  float mix[M];
#pragma unroll
  for (int r = 0; r < M; ++r) mix[r] = v[r] * rho;
  hc_token_scalars_warp4<M>(mix, base, scale, iters, eps, pre + t * kN, post ? post + t * kN : nullptr,
                            comb ? comb + t * kN * kN : nullptr);
}

// CTA per token: u = bf16(sum_j cpre[j] X[t, j, :]) (f32, j ascending), then
// xn = bf16(w * (u * rs)), rs = f32(1 / sqrt(sum(u^2) / D + eps)) (the CPU rms_norm's order).
// X [T, 4, D], xn [T, D] bf16; D a multiple of 8, at most 8 * 256 * kMaxGroups.
template <class TW>
__global__ void __launch_bounds__(256) hc_collapse_norm_kernel(const bf16_t* X, const float* cpre, int64_t D,
                                                               const TW* w, float eps, bf16_t* xn) {
  pdl_enter();
  __shared__ float red[32];
  const int64_t t = blockIdx.x;
  float p[kN];
#pragma unroll
  for (int j = 0; j < kN; ++j) p[j] = cpre[t * kN + j];
  const bf16_t* x = X + t * kN * D;
  uint4 ub[kMaxGroups];
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < kMaxGroups; ++i) {
    const int64_t c = (int64_t(threadIdx.x) + 256 * i) * 8;
    if (c >= D) continue;
    uint4 v[kN];
#pragma unroll
    for (int j = 0; j < kN; ++j) v[j] = *reinterpret_cast<const uint4*>(x + j * D + c);
    float u[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      float acc = p[0] * bf16_at(v[0], e);
#pragma unroll
      for (int j = 1; j < kN; ++j) acc = fmaf(p[j], bf16_at(v[j], e), acc);
      u[e] = d_round_bf16(acc);
      ss = fmaf(u[e], u[e], ss);  // exact products (bf16 squared), f32 sums
    }
    ub[i] = pack_bf16(u);
  }
  ss = block_sum(ss, red);
  const float rs = float(1.0 / sqrt(double(ss) / double(D) + double(eps)));
#pragma unroll
  for (int i = 0; i < kMaxGroups; ++i) {
    const int64_t c = (int64_t(threadIdx.x) + 256 * i) * 8;
    if (c >= D) continue;
    float y[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) y[e] = ld_act(w[c + e]) * (bf16_at(ub[i], e) * rs);
    *reinterpret_cast<uint4*>(xn + t * D + c) = pack_bf16(y);
  }
}

// out[t, k, c] = post[t, k] F[t, c] + sum_j comb[t, j, k] X[t, j, c] in f32 FMA (post term
// first, j ascending), rounded once to bf16. Thread per (token, 8 columns); reads all four
// streams before writing, so out may alias X.
__global__ void hc_post_vec_kernel(const bf16_t* F, const bf16_t* X, const float* post, const float* comb,
                                   bf16_t* out, int64_t D, int64_t T) {
  pdl_enter();
  const int64_t groups = D / 8, total = T * groups;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / groups, c = (i % groups) * 8;
    uint4 xv[kN];
#pragma unroll
    for (int j = 0; j < kN; ++j) xv[j] = *reinterpret_cast<const uint4*>(X + (t * kN + j) * D + c);
    const uint4 fv = *reinterpret_cast<const uint4*>(F + t * D + c);
    float cb[kN * kN], pk[kN];  // this token's mixes (16-byte rows: comb and post are arena-aligned)
#pragma unroll
    for (int q = 0; q < kN * kN / 4; ++q) {
      const float4 v = *reinterpret_cast<const float4*>(comb + t * kN * kN + 4 * q);
      cb[4 * q] = v.x, cb[4 * q + 1] = v.y, cb[4 * q + 2] = v.z, cb[4 * q + 3] = v.w;
    }
    const float4 pv = *reinterpret_cast<const float4*>(post + t * kN);
    pk[0] = pv.x, pk[1] = pv.y, pk[2] = pv.z, pk[3] = pv.w;
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      float y[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float acc = pk[k] * bf16_at(fv, e);
#pragma unroll
        for (int j = 0; j < kN; ++j) acc = fmaf(cb[j * kN + k], bf16_at(xv[j], e), acc);
        y[e] = acc;
      }
      *reinterpret_cast<uint4*>(out + (t * kN + k) * D + c) = pack_bf16(y);
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// The K split of hc_dots: three resident 128-thread CTAs per SM (__launch_bounds__: 168 registers) of an H200 (132 SMs) over
// the token tiles; slices are whole chunks of kTcK columns.
int64_t dots_slice(int64_t T, int64_t nd) {
  const int64_t tiles = ceil_div(T, kTcTok), chunks = nd / kTcK;
  const int64_t want = std::max<int64_t>(1, std::min<int64_t>(chunks, 3 * 132 / tiles));
  return ceil_div(chunks, want) * kTcK;
}

// The mixes of the fast path (hc_dots + hc_scalars): hc_mix "fast_f32" and the first half of
// the fused pre.
template <int M>
void mix_fast(Ctx& c, const Tensor& X, const HcArgs& a, Tensor pre, Tensor post, Tensor comb) {
  const int64_t T = X.size(0), D = X.size(2), nd = kN * D;
  const int64_t ks = dots_slice(T, nd);
  const int S = int(ceil_div(nd, ks));
  Buffer part = c.scratch(size_t(S) * size_t(T) * (M + 1) * 4);  // [S, T, M + 1] f32
  float* pp = static_cast<float*>(part.data());
  Buffer pieces = c.scratch(size_t(3) * M * size_t(nd) * 2);  // [3, M, nd] bf16
  uint16_t* pc = static_cast<uint16_t*>(pieces.data());
  const int64_t n4 = M * nd / 4;
  launch_pdl(c, "hc_split_fn_kernel", hc_split_fn_kernel, dim3(unsigned(std::min<int64_t>(ceil_div(n4, 256), 132 * 8))), dim3(256), 0, a.fn.ptr<float>(),
                                                                                                  n4, pc);
  launch_pdl(c, "hc_dots_kernel", hc_dots_kernel<M>, dim3(unsigned(ceil_div(T, kTcTok)), unsigned(S)), dim3(128), 0,
      X.ptr<const bf16_t>(), pc, T, nd, ks, pp);
  // Warps per CTA: one at decode sizes, so that the few tokens' warps spread over as many SMs
  // (each warp's slice loads touch 32 lines; 8 warps on one SM made a 64-token step 26 us of L1).
  const int wpb = int(std::clamp<int64_t>(T / 264, 1, 8));
  launch_pdl(c, "hc_scalars_kernel", hc_scalars_kernel<M>, dim3(unsigned(ceil_div(T, wpb))), dim3(unsigned(32 * wpb)), 0,
      pp, S, T, nd, a.base.ptr<float>(), a.scale.ptr<float>(), a.sinkhorn_iters, a.norm_eps, a.hc_eps,
      pre.ptr<float>(), M == kN ? nullptr : post.ptr<float>(), M == kN ? nullptr : comb.ptr<float>());
}

template <int M>
void fused_fast(Ctx& c, const Tensor& X, const HcArgs& a, const Tensor& cpre, const Tensor& norm_w, Tensor pre,
                Tensor post, Tensor comb, Tensor xn) {
  const int64_t T = X.size(0), D = X.size(2);
  mix_fast<M>(c, X, a, pre, post, comb);
  const float* cp = cpre.empty() ? pre.ptr<float>() : cpre.ptr<float>();
  with_act(norm_w, "hc_pre norm weight", [&](auto tw) {
    using TW = decltype(tw);
    launch_pdl(c, "hc_collapse_norm_kernel", hc_collapse_norm_kernel<TW>, dim3(unsigned(T)), dim3(256), 0, X.ptr<const bf16_t>(), cp, D, norm_w.ptr<TW>(),
                                                                   a.norm_eps, xn.ptr<bf16_t>());
  });
}

// Whether the fast kernels take this call (else the exact kernels run it: the plan's
// requirement is the numerics and dtype; these are the shapes they are written for).
bool mix_fits(const Tensor& X, const HcArgs& a) {
  if (X.dtype != DType::BF16 || X.ndim != 3 || X.size(1) != kN || a.n != kN || a.fn.ndim != 2) return false;
  const int64_t m = a.fn.size(0), D = X.size(2);
  return (m == kN || m == kN * (2 + kN)) && D % kKc == 0 && a.fn.size(1) == kN * D && a.fn.dtype == DType::F32 &&
         aligned16(X.data) && aligned16(a.fn.data);
}
bool fused_fits(const Tensor& X, const HcArgs& a, const Tensor& cpre, const Tensor& norm_w, const Tensor& xn) {
  return mix_fits(X, a) && xn.dtype == DType::BF16 && X.size(2) <= 8 * 256 * kMaxGroups && !norm_w.empty() &&
         norm_w.numel() == X.size(2) && aligned16(xn.data) && (cpre.empty() || cpre.numel() == X.size(0) * kN);
}

template <int M>
void check_mix_outputs(const Tensor& X, const Tensor& pre, const Tensor& post, const Tensor& comb) {
  const int64_t T = X.size(0);
  check_f32(pre, "hc_mix pre");
  DIL_CHECK(pre.numel() == T * kN, "hc_mix: pre ", pre.shape_str(), " for X ", X.shape_str());
  if (M == kN) return;
  check_f32(post, "hc_mix post");
  check_f32(comb, "hc_mix comb");
  DIL_CHECK(post.numel() == T * kN && comb.numel() == T * kN * kN, "hc_mix: post ", post.shape_str(), " comb ",
            comb.shape_str());
}

}  // namespace

void hc_pre(Ctx& c, const Tensor& X, const HcArgs& a, const Tensor& collapse_pre, const Tensor& norm_w, Tensor pre,
            Tensor post, Tensor comb, Tensor xn, const std::string& impl) {
  const int64_t T = X.size(0);
  DIL_CHECK(xn.numel() == T * (X.ndim == 3 ? X.size(2) : 0), "hc_pre: X ", X.shape_str(), " xn ", xn.shape_str());
  DIL_CHECK(collapse_pre.empty() || collapse_pre.numel() == pre.numel(), "hc_pre: collapse_pre ",
            collapse_pre.shape_str(), " pre ", pre.shape_str());
  if (impl == "fused_fast" && fused_fits(X, a, collapse_pre, norm_w, xn)) {
    if (a.fn.size(0) == kN) {
      check_mix_outputs<kN>(X, pre, post, comb);
      if (T > 0) fused_fast<kN>(c, X, a, collapse_pre, norm_w, pre, post, comb, xn);
    } else {
      check_mix_outputs<kN*(2 + kN)>(X, pre, post, comb);
      if (T > 0) fused_fast<kN*(2 + kN)>(c, X, a, collapse_pre, norm_w, pre, post, comb, xn);
    }
    return;
  }
  DIL_CHECK(impl == "composed" || impl == "fused_fast", "hc_pre: unknown implementation ", impl);
  // The exact kernels in sequence, u [T, D] in xn's dtype (the unfused model's rounding).
  hc_mix(c, X, a, pre, post, comb);
  Buffer ub = c.scratch(xn.nbytes());
  Tensor u = xn;
  u.data = ub.data();
  hc_collapse(c, X, collapse_pre.empty() ? pre : collapse_pre, u);
  rms_norm(c, u, norm_w, a.norm_eps, xn);
}

void hc_mix(Ctx& c, const Tensor& X, const HcArgs& a, Tensor pre, Tensor post, Tensor comb, const std::string& impl) {
  if (impl == "fast_f32" && mix_fits(X, a)) {
    const int64_t T = X.size(0);
    if (a.fn.size(0) == kN) {
      check_mix_outputs<kN>(X, pre, post, comb);
      if (T > 0) mix_fast<kN>(c, X, a, pre, post, comb);
    } else {
      check_mix_outputs<kN*(2 + kN)>(X, pre, post, comb);
      if (T > 0) mix_fast<kN*(2 + kN)>(c, X, a, pre, post, comb);
    }
    return;
  }
  DIL_CHECK(impl == "default" || impl == "fast_f32", "hc_mix: unknown implementation ", impl);
  hc_mix(c, X, a, pre, post, comb);
}

void hc_post(Ctx& c, const Tensor& F, const Tensor& X, const Tensor& post, const Tensor& comb, Tensor out,
             const std::string& impl) {
  const bool fits = X.dtype == DType::BF16 && F.dtype == DType::BF16 && out.dtype == DType::BF16 && X.ndim == 3 &&
                    X.size(1) == kN && X.size(2) % 8 == 0 && aligned16(F.data) && aligned16(X.data) &&
                    aligned16(out.data) && aligned16(post.data) && aligned16(comb.data);
  if (impl != "vec_f32" || !fits) {
    DIL_CHECK(impl == "default" || impl == "vec_f32", "hc_post: unknown implementation ", impl);
    hc_post_exact(c, F, X, post, comb, out);
    return;
  }
  const int64_t T = X.size(0), D = X.size(2);
  DIL_CHECK(F.numel() == T * D && out.numel() == X.numel() && post.numel() == T * kN && comb.numel() == T * kN * kN,
            "hc_post: F ", F.shape_str(), " X ", X.shape_str(), " out ", out.shape_str());
  check_f32(post, "hc_post post");
  check_f32(comb, "hc_post comb");
  if (T == 0) return;
  launch_pdl(c, "hc_post_vec_kernel", hc_post_vec_kernel, dim3(stride_grid(T * D / 8)), dim3(256), 0, F.ptr<const bf16_t>(), X.ptr<const bf16_t>(),
                                                                   post.ptr<float>(), comb.ptr<float>(),
                                                                   out.ptr<bf16_t>(), D, T);
}

}  // namespace dil::cuda
