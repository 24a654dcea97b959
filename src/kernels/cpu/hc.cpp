// Manifold-constrained hyper-connections (mHC) of the CPU reference (model-spec §3.3, §3.4;
// official hc_pre / hc_post / hc_split_sinkhorn).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"

namespace dil {

namespace cpu {
float sigmoid_f(float x) { return float(1.0 / (1.0 + std::exp(-double(x)))); }
}  // namespace cpu

// X [T, n, D] f32 -> pre [T, n], post [T, n], comb [T, n, n] f32 (post/comb unused when fn has
// n rows: the final head). Per token:
//   xf = X[t] flattened [n*D]; rho = f32(1/sqrt(sum(xf^2)/(n*D) + norm_eps)) (double, rounded once);
//   mix_i = f32(fn_i . xf) * rho (dot in double rounded once, then an f32 product);
//   pre_j = sigmoid(mix_j*scale0 + base_j) + hc_eps;  (head: this only)
//   post_j = 2*sigmoid(mix_{n+j}*scale1 + base_{n+j});
//   C[j][k] = mix_{2n+n*j+k}*scale2 + base_{2n+n*j+k};
// then Sinkhorn exactly as official hc_split_sinkhorn, in f32 with sequential sums:
//   C[j,:] = exp(C[j,:] - max_k C[j,k]) / rowsum + eps; C[:,k] /= (colsum_k + eps);
//   (iters-1) x { C[j,:] /= (rowsum_j + eps); C[:,k] /= (colsum_k + eps) }.
// sigmoid and exp are evaluated in double and rounded once to f32.
void CpuBackend::hc_mix(const Tensor& X0, const HcArgs& a, Tensor pre, Tensor post, Tensor comb) {
  cpu::Staged sx(X0, "hc_mix X");  // X f32|bf16
  const Tensor& X = sx.t;
  cpu::check_f32(a.fn, "hc_mix fn");
  cpu::check_f32(a.base, "hc_mix base");
  cpu::check_f32(a.scale, "hc_mix scale");
  cpu::check_f32(pre, "hc_mix pre");
  const int n = a.n;
  const int64_t nD = a.fn.size(1), T = X.numel() / nD, M = a.fn.size(0);
  const bool head = M == n;
  DIL_CHECK(T * nD == X.numel() && nD % n == 0, "hc_mix: X ", X.shape_str(), " fn ", a.fn.shape_str());
  DIL_CHECK(head || M == int64_t(n) * (2 + n), "hc_mix: fn has ", M, " rows for n = ", n);
  DIL_CHECK(a.base.numel() == M && a.scale.numel() >= (head ? 1 : 3), "hc_mix: base/scale sizes");
  DIL_CHECK(pre.numel() == T * n, "hc_mix: pre ", pre.shape_str());
  if (!head) {
    cpu::check_f32(post, "hc_mix post");
    cpu::check_f32(comb, "hc_mix comb");
    DIL_CHECK(post.numel() == T * n && comb.numel() == T * n * n, "hc_mix: post/comb sizes");
  }
  const float *px = X.ptr<float>(), *fn = a.fn.ptr<float>(), *base = a.base.ptr<float>(),
              *scale = a.scale.ptr<float>();
  const float eps = a.hc_eps;
  std::vector<float> mix(static_cast<size_t>(M));  // [M]
  std::vector<float> c(size_t(n) * n);  // [n, n] row-major
  std::vector<float> colsum(static_cast<size_t>(n));  // [n]
  for (int64_t t = 0; t < T; ++t) {
    const float* xf = px + t * nD;
    double ss = 0.0;
    for (int64_t i = 0; i < nD; ++i) ss += double(xf[i]) * xf[i];
    const float rho = float(1.0 / std::sqrt(ss / double(nD) + double(a.norm_eps)));
    for (int64_t i = 0; i < M; ++i) {
      const float* fr = fn + i * nD;
      double acc = 0.0;
      for (int64_t k = 0; k < nD; ++k) acc += double(fr[k]) * xf[k];
      mix[i] = float(acc) * rho;
    }
    for (int j = 0; j < n; ++j) pre.ptr<float>()[t * n + j] = cpu::sigmoid_f(mix[j] * scale[0] + base[j]) + eps;
    if (head) continue;
    for (int j = 0; j < n; ++j)
      post.ptr<float>()[t * n + j] = 2.0f * cpu::sigmoid_f(mix[n + j] * scale[1] + base[n + j]);
    for (int i = 0; i < n * n; ++i) c[i] = mix[2 * n + i] * scale[2] + base[2 * n + i];
    auto col_normalize = [&] {
      for (int k = 0; k < n; ++k) {
        float s = 0.0f;
        for (int j = 0; j < n; ++j) s += c[j * n + k];
        colsum[k] = s;
      }
      for (int j = 0; j < n; ++j)
        for (int k = 0; k < n; ++k) c[j * n + k] = c[j * n + k] / (colsum[k] + eps);
    };
    // Row softmax + eps, then the first column normalisation.
    for (int j = 0; j < n; ++j) {
      float* row = c.data() + j * n;
      const float mx = *std::max_element(row, row + n);
      float s = 0.0f;
      for (int k = 0; k < n; ++k) {
        row[k] = float(std::exp(double(row[k] - mx)));
        s += row[k];
      }
      for (int k = 0; k < n; ++k) row[k] = row[k] / s + eps;
    }
    col_normalize();
    for (int it = 1; it < a.sinkhorn_iters; ++it) {
      for (int j = 0; j < n; ++j) {
        float* row = c.data() + j * n;
        float s = 0.0f;
        for (int k = 0; k < n; ++k) s += row[k];
        for (int k = 0; k < n; ++k) row[k] = row[k] / (s + eps);
      }
      col_normalize();
    }
    std::copy(c.begin(), c.end(), comb.ptr<float>() + t * n * n);
  }
}

// X [T, n, D] f32|bf16, pre [T, n] f32 -> out [T, D] f32|bf16: out[t, c] = sum_j pre[t, j] *
// X[t, j, c] (double accumulation over j ascending, rounded once to f32, then to out's dtype).
void CpuBackend::hc_collapse(const Tensor& X0, const Tensor& pre, Tensor out0) {
  cpu::Staged sx(X0, "hc_collapse X"), so(out0, "hc_collapse out", true);
  const Tensor &X = sx.t, &out = so.t;
  cpu::check_f32(pre, "hc_collapse pre");
  const int64_t T = cpu::n_rows(out), D = cpu::last_dim(out), n = pre.numel() / T;
  DIL_CHECK(n * T == pre.numel() && X.numel() == T * n * D, "hc_collapse: X ", X.shape_str(), " pre ",
            pre.shape_str(), " out ", out.shape_str());
  const float *px = X.ptr<float>(), *pp = pre.ptr<float>();
  float* po = out.ptr<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < D; ++c) {
      double acc = 0.0;
      for (int64_t j = 0; j < n; ++j) acc += double(pp[t * n + j]) * px[(t * n + j) * D + c];
      po[t * D + c] = float(acc);
    }
}

// F [T, D], X [T, n, D], out [T, n, D] f32|bf16, post [T, n], comb [T, n, n] f32 (out may
// alias X: each (t, c) column is read completely before it is written):
// out[t, k, c] = post[t, k] * F[t, c] + sum_j comb[t, j, k] * X[t, j, c]  (comb contracted
// over its FIRST index), double accumulation (post term first, then j ascending), rounded once
// to f32 (then to out's dtype).
void CpuBackend::hc_post(const Tensor& F0, const Tensor& X0, const Tensor& post, const Tensor& comb, Tensor out0) {
  cpu::Staged sf(F0, "hc_post F"), sx(X0, "hc_post X"), so(out0, "hc_post out", true);
  const Tensor &F = sf.t, &X = sx.t, &out = so.t;
  cpu::check_f32(post, "hc_post post");
  cpu::check_f32(comb, "hc_post comb");
  const int64_t T = cpu::n_rows(F), D = cpu::last_dim(F), n = post.numel() / T;
  DIL_CHECK(n * T == post.numel() && comb.numel() == T * n * n && X.numel() == T * n * D &&
                out.numel() == T * n * D,
            "hc_post: F ", F.shape_str(), " X ", X.shape_str(), " out ", out.shape_str());
  const float *pf = F.ptr<float>(), *px = X.ptr<float>(), *pp = post.ptr<float>(), *pc = comb.ptr<float>();
  float* po = out.ptr<float>();
  std::vector<float> col(static_cast<size_t>(n));  // [n] one output column
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < D; ++c) {
      for (int64_t k = 0; k < n; ++k) {
        double acc = double(pp[t * n + k]) * pf[t * D + c];
        for (int64_t j = 0; j < n; ++j) acc += double(pc[(t * n + j) * n + k]) * px[(t * n + j) * D + c];
        col[k] = float(acc);
      }
      for (int64_t k = 0; k < n; ++k) po[(t * n + k) * D + c] = col[k];
    }
}

// e [T, D] -> X [T, n, D] (f32|bf16): every stream a copy of e.
void CpuBackend::hc_expand(const Tensor& e0, int n, Tensor X0) {
  cpu::Staged se(e0, "hc_expand e"), sx(X0, "hc_expand X", true);
  const Tensor &e = se.t, &X = sx.t;
  const int64_t T = cpu::n_rows(e), D = cpu::last_dim(e);
  DIL_CHECK(X.numel() == T * n * D, "hc_expand: X ", X.shape_str(), " for e ", e.shape_str(), " n ", n);
  const float* pe = e.ptr<float>();
  float* px = X.ptr<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < n; ++j) std::copy(pe + t * D, pe + (t + 1) * D, px + (t * n + j) * D);
}

// The fused pre (backend.h): the three ops in sequence, u [T, D] in xn's dtype (the rounding
// the unfused model applied between the collapse and the norm).
void CpuBackend::hc_pre(const Tensor& X, const HcArgs& a, const Tensor& collapse_pre, const Tensor& norm_w,
                        Tensor pre, Tensor post, Tensor comb, Tensor xn) {
  DIL_CHECK(collapse_pre.empty() || collapse_pre.numel() == pre.numel(), "hc_pre: collapse_pre ",
            collapse_pre.shape_str(), " pre ", pre.shape_str());
  hc_mix(X, a, pre, post, comb);
  Buffer ub = alloc(xn.nbytes());
  Tensor u = xn;  // [T, D] xn's dtype
  u.data = ub.data();
  hc_collapse(X, collapse_pre.empty() ? pre : collapse_pre, u);
  rms_norm(u, norm_w, a.norm_eps, xn);
}

}  // namespace dil
