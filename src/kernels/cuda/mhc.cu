// Manifold hyper-connections (model-spec §3.3): hc_mix (RMS-scaled projections of the
// flattened residual streams, sigmoids, Sinkhorn), collapse, post, expand. The residual streams
// X, the sublayer output F and the collapsed / expanded rows are f32 or bf16 activations
// (backend.h: fast numerics keeps the streams in bf16, as the official hc_post); every kernel is
// a template over their storage types (float | bf16_t), computing on the widened values and
// rounding each output once. pre / post / comb stay f32.
#include "kernels/cuda/mhc.cuh"
#include "kernels/cuda/ops.cuh"

namespace dil::cuda {
namespace {

constexpr int kMaxMix = 32;  // m = n*(2+n) = 24 for n = 4

// One block per token: the m dot products of length n*D and the mean square in double
// (rounded once, as the reference), then the scalar tail (sigmoids, Sinkhorn) in thread 0 in
// exactly the reference's f32 order (the library is built without FMA contraction).
template <class TX>
__global__ void hc_mix_kernel(const TX* X, const float* fn, const float* base, const float* scale, int n, int m,
                              int64_t nd, int iters, float norm_eps, float eps, float* pre, float* post,
                              float* comb) {
  __shared__ double red[32];
  __shared__ float mix[kMaxMix];
  const TX* x = X + blockIdx.x * nd;
  double ss = 0.0;
  for (int64_t i = threadIdx.x; i < nd; i += blockDim.x) {
    const double v = ld_act(x[i]);
    ss += v * v;
  }
  ss = block_sum_d(ss, red);
  const float rho = float(1.0 / sqrt(ss / double(nd) + double(norm_eps)));
  // Warp w owns rows w, w + 8, ...: the m dot products run side by side instead of one
  // block-wide reduction (two barriers) each, which left decode-sized steps (a few blocks)
  // waiting on 2m barriers. Still double, rounded once.
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n_warps = blockDim.x >> 5;
  for (int r = warp; r < m; r += n_warps) {
    const float* f = fn + r * nd;
    double acc = 0.0;
    for (int64_t i = lane; i < nd; i += 32) acc += double(f[i]) * double(ld_act(x[i]));
    acc = warp_sum_d(acc);
    if (lane == 0) mix[r] = float(acc) * rho;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  const int64_t t = blockIdx.x;
  hc_token_scalars(mix, base, scale, n, m, iters, eps, pre + t * n, post ? post + t * n : nullptr,
                   comb ? comb + t * n * n : nullptr);
}

// out[t, c] = sum_j pre[t, j] * X[t, j, c] (double, j ascending, rounded once to f32, then to out's dtype)
template <class TX, class TO>
__global__ void hc_collapse_kernel(const TX* X, const float* pre, TO* out, int n, int64_t D, int64_t T) {
  int64_t total = T * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t t = i / D, c = i % D;
    double acc = 0.0;
    for (int j = 0; j < n; ++j) acc += double(pre[t * n + j]) * double(ld_act(X[(t * n + j) * D + c]));
    st_act(out + i, float(acc));
  }
}

// out[t, k, c] = post[t, k] * F[t, c] + sum_j comb[t, j, k] * X[t, j, c]. One thread per
// (t, c) reads all n streams before writing, so out may alias X (same dtype).
template <class TF, class TX, class TO>
__global__ void hc_post_kernel(const TF* F, const TX* X, const float* post, const float* comb, TO* out, int n,
                               int64_t D, int64_t T) {
  int64_t total = T * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t c = i % D, t = i / D;
    float xs[8];
    for (int j = 0; j < n; ++j) xs[j] = ld_act(X[(t * n + j) * D + c]);
    float f = ld_act(F[t * D + c]);
    for (int k = 0; k < n; ++k) {
      double acc = double(post[t * n + k]) * f;
      for (int j = 0; j < n; ++j) acc += double(comb[(t * n + j) * n + k]) * xs[j];
      st_act(out + (t * n + k) * D + c, float(acc));
    }
  }
}

template <class TE, class TX>
__global__ void hc_expand_kernel(const TE* e, TX* X, int n, int64_t D, int64_t T) {
  int64_t total = T * n * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t c = i % D, t = i / (D * n);
    st_act(X + i, ld_act(e[t * D + c]));
  }
}

}  // namespace

void hc_mix(Ctx& c, const Tensor& X, const HcArgs& a, Tensor pre, Tensor post, Tensor comb) {
  int n = a.n;
  int64_t T = X.size(0), nd = X.numel() / (T ? T : 1);
  int m = int(a.fn.size(0));
  DIL_CHECK(m <= kMaxMix && n <= 8 && (m == n || m == n * (2 + n)), "hc_mix: fn rows ", m, " n ", n);
  DIL_CHECK(a.fn.size(1) == nd, "hc_mix: fn ", a.fn.shape_str(), " vs X ", X.shape_str());
  check_f32(a.fn, "hc_mix fn");
  check_f32(pre, "hc_mix pre");
  if (m != n) {
    check_f32(post, "hc_mix post");
    check_f32(comb, "hc_mix comb");
  }
  if (T == 0) return;
  with_act(X, "hc_mix X", [&](auto tx) {
    using TX = decltype(tx);
    hc_mix_kernel<TX><<<unsigned(T), 256, 0, c.stream>>>(
        X.ptr<const TX>(), a.fn.ptr<float>(), a.base.ptr<float>(), a.scale.ptr<float>(), n, m, nd, a.sinkhorn_iters,
        a.norm_eps, a.hc_eps, pre.ptr<float>(), post.empty() ? nullptr : post.ptr<float>(),
        comb.empty() ? nullptr : comb.ptr<float>());
  });
  DIL_LAUNCH_CHECK("hc_mix_kernel");
}

void hc_collapse(Ctx& c, const Tensor& X, const Tensor& pre, Tensor out) {
  int64_t T = X.size(0), n = X.size(1), D = X.size(2);
  DIL_CHECK(out.numel() == T * D && pre.numel() == T * n, "hc_collapse: X ", X.shape_str(), " pre ", pre.shape_str(),
            " out ", out.shape_str());
  check_f32(pre, "hc_collapse pre");
  if (T == 0) return;
  with_act(X, "hc_collapse X", [&](auto tx) {
    using TX = decltype(tx);
    with_act(out, "hc_collapse out", [&](auto to) {
      using TO = decltype(to);
      hc_collapse_kernel<TX, TO><<<stride_grid(T * D), 256, 0, c.stream>>>(X.ptr<const TX>(), pre.ptr<float>(),
                                                                           out.ptr<TO>(), int(n), D, T);
    });
  });
  DIL_LAUNCH_CHECK("hc_collapse_kernel");
}

void hc_post_exact(Ctx& c, const Tensor& F, const Tensor& X, const Tensor& post, const Tensor& comb, Tensor out) {
  int64_t T = X.size(0), n = X.size(1), D = X.size(2);
  DIL_CHECK(n <= 8, "hc_post: n ", n);
  DIL_CHECK(F.numel() == T * D && out.numel() == X.numel() && post.numel() == T * n && comb.numel() == T * n * n,
            "hc_post: F ", F.shape_str(), " X ", X.shape_str(), " out ", out.shape_str());
  DIL_CHECK(out.data != X.data || out.dtype == X.dtype, "hc_post: in place needs one dtype");
  check_f32(post, "hc_post post");
  check_f32(comb, "hc_post comb");
  if (T == 0) return;
  with_act(F, "hc_post F", [&](auto tf) {
    using TF = decltype(tf);
    with_act(X, "hc_post X", [&](auto tx) {
      using TX = decltype(tx);
      with_act(out, "hc_post out", [&](auto to) {
        using TO = decltype(to);
        hc_post_kernel<TF, TX, TO><<<stride_grid(T * D), 256, 0, c.stream>>>(
            F.ptr<const TF>(), X.ptr<const TX>(), post.ptr<float>(), comb.ptr<float>(), out.ptr<TO>(), int(n), D, T);
      });
    });
  });
  DIL_LAUNCH_CHECK("hc_post_kernel");
}

void hc_expand(Ctx& c, const Tensor& e, int n, Tensor X) {
  int64_t T = e.size(0), D = e.size(1);
  DIL_CHECK(X.numel() == T * n * D, "hc_expand: X ", X.shape_str(), " for e ", e.shape_str(), " n ", n);
  if (T == 0) return;
  with_act(e, "hc_expand e", [&](auto te) {
    using TE = decltype(te);
    with_act(X, "hc_expand X", [&](auto tx) {
      using TX = decltype(tx);
      hc_expand_kernel<TE, TX><<<stride_grid(T * n * D), 256, 0, c.stream>>>(e.ptr<const TE>(), X.ptr<TX>(), n, D, T);
    });
  });
  DIL_LAUNCH_CHECK("hc_expand_kernel");
}

}  // namespace dil::cuda
