// Fast numerics' mHC (model-spec §3.3) at HBM speed, and the dispatch of the fused pre and of
// hc_post between the fast and the exact kernels (mhc.cu).
//
// hc_pre "fused_fast" (bf16 streams X [T, 4, D], bf16 xn, fn with 24 rows or 4 for the head;
// hc_mix "fast_f32" is its steps 1 and 2):
//   1. hc_dots: the mixes X . fn^T and the sum of squares of X in f32 FMA, split over K: CTA
//      per (64 tokens, K slice), X and fn tiles in shared memory, lanes along tokens (fn read
//      as broadcasts), warps along columns; partial sums [S, T, m + 1] (last: sum of squares).
//   2. hc_scalars: warp per token, partials summed (lanes over slices, then a shuffle tree),
//      rho, sigmoids and Sinkhorn on lane 0 in the reference's f32 order (mhc.cuh).
//   3. hc_collapse_norm: CTA per token, X read once more with 16-byte loads, the collapse in
//      f32 rounded to bf16 (the official hc_pre's y.to(bf16)), the RMSNorm of that row
//      (sum of squares in f32), xn written in bf16.
// Bytes: X twice (2 x 8 D bytes per token), xn once; fn (1.5 MB at V4-Flash) from L2 per
// 64-token tile. Tolerance (registry.cpp, derived in tests/cuda/test_mhc_fast.cpp): the f32
// accumulation of the dots, carried through the sigmoids, Sinkhorn and the bf16 roundings.
// hc_post "vec_f32" (bf16 F, X, out, n = 4): thread per (token, 8 columns), f32 FMA, 16-byte
// loads and stores.
#include "kernels/cuda/mhc.cuh"
#include "kernels/cuda/ops.cuh"

namespace dil::cuda {
namespace {

constexpr int kN = 4;          // streams the fast kernels are written for (V4 / V4.1 hc_mult)
constexpr int kTok = 64;       // tokens per hc_dots CTA: lanes own tokens lane and lane + 32
constexpr int kKc = 64;        // columns per tile: warp w owns columns 8w .. 8w + 7
constexpr int kXs = kTok + 1;  // padded row of the transposed X tile (conflict-free stores)
constexpr int kMaxGroups = 4;  // 8-column groups per thread in hc_collapse_norm: D <= 8192

__device__ __forceinline__ float lo_bf16(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi_bf16(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
// Element e (0..7) of 8 packed bf16 values.
__device__ __forceinline__ float bf16_at(const uint4& v, int e) {
  const uint32_t w = e < 2 ? v.x : e < 4 ? v.y : e < 6 ? v.z : v.w;
  return (e & 1) ? hi_bf16(w) : lo_bf16(w);
}
__device__ __forceinline__ uint32_t bf16_bits(float v) { return __float_as_uint(d_round_bf16(v)) >> 16; }
__device__ __forceinline__ uint4 pack_bf16(const float* v) {  // v[8], each already exact in bf16 or rounded here
  uint4 r;
  r.x = bf16_bits(v[0]) | (bf16_bits(v[1]) << 16);
  r.y = bf16_bits(v[2]) | (bf16_bits(v[3]) << 16);
  r.z = bf16_bits(v[4]) | (bf16_bits(v[5]) << 16);
  r.w = bf16_bits(v[6]) | (bf16_bits(v[7]) << 16);
  return r;
}

template <int M>
constexpr int dots_smem_floats() {
  return kKc * kXs + M * kKc > 8 * (M + 1) * 32 ? kKc * kXs + M * kKc : 8 * (M + 1) * 32;
}

// part[s, t, r] = sum over columns k of slice s of fn[r, k] X[t, k] (r < M), part[s, t, M] =
// sum of X[t, k]^2. X [T, nd] bf16, fn [M, nd] f32; nd and ks multiples of kKc. Per (token,
// r) a lane accumulates its warp's 8 columns of every tile serially (fmaf), then the 8 warps
// are summed in order: deterministic, independent of the other tokens of the step.
template <int M>
__global__ void __launch_bounds__(256) hc_dots_kernel(const bf16_t* X, const float* fn, int64_t T, int64_t nd,
                                                      int64_t ks, float* part) {
  __shared__ __align__(16) float sm[dots_smem_floats<M>()];
  float* xs = sm;               // [kKc][kXs] X tile, transposed, f32
  float* fs = sm + kKc * kXs;   // [M][kKc] fn tile (16-byte aligned: kKc * kXs * 4 % 16 == 0)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t t0 = int64_t(blockIdx.x) * kTok;
  const int64_t k_begin = int64_t(blockIdx.y) * ks, k_end = min(nd, k_begin + ks);
  float a0[M], a1[M];
#pragma unroll
  for (int r = 0; r < M; ++r) a0[r] = a1[r] = 0.f;
  float s0 = 0.f, s1 = 0.f;
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kKc) {
    // X tile: 64 rows x 64 columns bf16, two passes of 256 x 16 bytes; rows past T are zeros.
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      const int row = p * 32 + (tid >> 3), seg = (tid & 7) * 8;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (t0 + row < T) v = *reinterpret_cast<const uint4*>(X + (t0 + row) * nd + k0 + seg);
#pragma unroll
      for (int e = 0; e < 8; ++e) xs[(seg + e) * kXs + row] = bf16_at(v, e);
    }
    for (int q = tid; q < M * (kKc / 4); q += 256) {
      const int r = q / (kKc / 4), c4 = q % (kKc / 4);
      *reinterpret_cast<float4*>(fs + r * kKc + c4 * 4) =
          *reinterpret_cast<const float4*>(fn + int64_t(r) * nd + k0 + c4 * 4);
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int kb = warp * 8 + h * 4;
      float x0[4], x1[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        x0[e] = xs[(kb + e) * kXs + lane];
        x1[e] = xs[(kb + e) * kXs + lane + 32];
        s0 = fmaf(x0[e], x0[e], s0);
        s1 = fmaf(x1[e], x1[e], s1);
      }
#pragma unroll
      for (int r = 0; r < M; ++r) {
        const float4 f = *reinterpret_cast<const float4*>(fs + r * kKc + kb);  // a broadcast
        a0[r] = fmaf(f.x, x0[0], a0[r]);
        a0[r] = fmaf(f.y, x0[1], a0[r]);
        a0[r] = fmaf(f.z, x0[2], a0[r]);
        a0[r] = fmaf(f.w, x0[3], a0[r]);
        a1[r] = fmaf(f.x, x1[0], a1[r]);
        a1[r] = fmaf(f.y, x1[1], a1[r]);
        a1[r] = fmaf(f.z, x1[2], a1[r]);
        a1[r] = fmaf(f.w, x1[3], a1[r]);
      }
    }
    __syncthreads();
  }
  // The 8 warps' sums per (token, r), tokens lane (h = 0) then lane + 32 (h = 1); the buffer
  // aliases the tiles (the loop ended on a barrier).
  float* red = sm;  // [8][M + 1][32]
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (h) __syncthreads();  // round 0's reads are done
#pragma unroll
    for (int r = 0; r < M; ++r) red[(warp * (M + 1) + r) * 32 + lane] = h ? a1[r] : a0[r];
    red[(warp * (M + 1) + M) * 32 + lane] = h ? s1 : s0;
    __syncthreads();
    for (int q = tid; q < (M + 1) * 32; q += 256) {
      const int r = q / 32, l = q % 32;
      float s = 0.f;
      for (int w = 0; w < 8; ++w) s += red[(w * (M + 1) + r) * 32 + l];
      const int64_t t = t0 + h * 32 + l;
      if (t < T) part[(int64_t(blockIdx.y) * T + t) * (M + 1) + r] = s;
    }
  }
}

// Warp per token: the S partial sums (lanes over slices, then a shuffle tree), rho as the
// reference forms it from the sum of squares, then the scalar tail on lane 0.
template <int M>
__global__ void hc_scalars_kernel(const float* part, int S, int64_t T, int64_t nd, const float* base,
                                  const float* scale, int iters, float norm_eps, float eps, float* pre, float* post,
                                  float* comb) {
  const int lane = threadIdx.x & 31;
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (t >= T) return;  // whole warps leave together
  float v[M + 1];
#pragma unroll
  for (int r = 0; r <= M; ++r) v[r] = 0.f;
  for (int s = lane; s < S; s += 32) {
    const float* p = part + (int64_t(s) * T + t) * (M + 1);
#pragma unroll
    for (int r = 0; r <= M; ++r) v[r] += p[r];
  }
#pragma unroll
  for (int r = 0; r <= M; ++r) v[r] = warp_sum(v[r]);
  if (lane != 0) return;
  const float rho = float(1.0 / sqrt(double(v[M]) / double(nd) + double(norm_eps)));
  float mix[M];
#pragma unroll
  for (int r = 0; r < M; ++r) mix[r] = v[r] * rho;
  hc_token_scalars(mix, base, scale, kN, M, iters, eps, pre + t * kN, post ? post + t * kN : nullptr,
                   comb ? comb + t * kN * kN : nullptr);
}

// CTA per token: u = bf16(sum_j cpre[j] X[t, j, :]) (f32, j ascending), then
// xn = bf16(w * (u * rs)), rs = f32(1 / sqrt(sum(u^2) / D + eps)) (the CPU rms_norm's order).
// X [T, 4, D], xn [T, D] bf16; D a multiple of 8, at most 8 * 256 * kMaxGroups.
template <class TW>
__global__ void __launch_bounds__(256) hc_collapse_norm_kernel(const bf16_t* X, const float* cpre, int64_t D,
                                                               const TW* w, float eps, bf16_t* xn) {
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

// The K split of hc_dots: about two full waves of an H200 (132 SMs, two 256-thread CTAs each at
// the kernel's ~123 registers) over the token tiles, rounded down so that the last wave is not
// a sliver; slices are whole tiles of kKc columns.
int64_t dots_slice(int64_t T, int64_t nd) {
  const int64_t tiles = ceil_div(T, kTok), chunks = nd / kKc;
  const int64_t want = std::max<int64_t>(1, std::min<int64_t>(chunks, 2 * 2 * 132 / tiles));
  return ceil_div(chunks, want) * kKc;
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
  hc_dots_kernel<M><<<dim3(unsigned(ceil_div(T, kTok)), unsigned(S)), 256, 0, c.stream>>>(
      X.ptr<const bf16_t>(), a.fn.ptr<float>(), T, nd, ks, pp);
  DIL_LAUNCH_CHECK("hc_dots_kernel");
  hc_scalars_kernel<M><<<unsigned(ceil_div(T, 8)), 256, 0, c.stream>>>(
      pp, S, T, nd, a.base.ptr<float>(), a.scale.ptr<float>(), a.sinkhorn_iters, a.norm_eps, a.hc_eps,
      pre.ptr<float>(), M == kN ? nullptr : post.ptr<float>(), M == kN ? nullptr : comb.ptr<float>());
  DIL_LAUNCH_CHECK("hc_scalars_kernel");
}

template <int M>
void fused_fast(Ctx& c, const Tensor& X, const HcArgs& a, const Tensor& cpre, const Tensor& norm_w, Tensor pre,
                Tensor post, Tensor comb, Tensor xn) {
  const int64_t T = X.size(0), D = X.size(2);
  mix_fast<M>(c, X, a, pre, post, comb);
  const float* cp = cpre.empty() ? pre.ptr<float>() : cpre.ptr<float>();
  with_act(norm_w, "hc_pre norm weight", [&](auto tw) {
    using TW = decltype(tw);
    hc_collapse_norm_kernel<TW><<<unsigned(T), 256, 0, c.stream>>>(X.ptr<const bf16_t>(), cp, D, norm_w.ptr<TW>(),
                                                                   a.norm_eps, xn.ptr<bf16_t>());
  });
  DIL_LAUNCH_CHECK("hc_collapse_norm_kernel");
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

unsigned stride_grid(int64_t n) { return unsigned(std::min<int64_t>(ceil_div(n, 256), 132 * 16)); }

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
  hc_post_vec_kernel<<<stride_grid(T * D / 8), 256, 0, c.stream>>>(F.ptr<const bf16_t>(), X.ptr<const bf16_t>(),
                                                                   post.ptr<float>(), comb.ptr<float>(),
                                                                   out.ptr<bf16_t>(), D, T);
  DIL_LAUNCH_CHECK("hc_post_vec_kernel");
}

}  // namespace dil::cuda
