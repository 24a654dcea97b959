// Linear (FP8/FP4/BF16 dequant + act quant), RMSNorm, RoPE and mHC of the CPU reference
// against the formulas of model-spec §2.1, §3.1 and §3.3, recomputed here in double.
#include <gtest/gtest.h>

#include "kernels/cpu/cpu_backend.h"
#include "test_util.h"

namespace dil {
namespace {

using test::view;

// out[t, o] = sum_k x[t, k] * W[o, k], double in ascending k, one rounding.
std::vector<float> ref_gemm(const std::vector<float>& x, const std::vector<double>& W, int64_t T, int64_t out,
                            int64_t in) {
  std::vector<float> y(size_t(T * out));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double acc = 0;
      for (int64_t k = 0; k < in; ++k) acc += double(x[t * in + k]) * W[o * in + k];
      y[t * out + o] = float(acc);
    }
  return y;
}

TEST(Linear, Fp8HandWeight) {
  CpuBackend be;
  // [3, 5] e4m3 codes with 2x2 blocks -> scales [2, 3].
  // 0x38 = 1, 0x40 = 2, 0xB8 = -1, 0x3C = 1.5, 0x30 = 0.5, 0x01 = 2^-9, 0x7E = 448, 0xC4 = -3.
  std::vector<uint8_t> q = {0x38, 0x40, 0xB8, 0x3C, 0x30,  //
                            0x01, 0x7E, 0xC4, 0x38, 0x40,  //
                            0x3C, 0x30, 0x38, 0xB8, 0xC4};
  const double val[15] = {1, 2, -1, 1.5, 0.5, std::ldexp(1.0, -9), 448, -3, 1, 2, 1.5, 0.5, 1, -1, -3};
  std::vector<uint8_t> sc = {127, 128, 125,  //
                             130, 126, 127};
  Weight w;
  w.kind = Weight::Kind::FP8;
  w.w = Tensor(q.data(), DType::F8E4M3, {3, 5});
  w.scale = Tensor(sc.data(), DType::E8M0, {2, 3});
  w.block_out = w.block_in = 2;
  w.out = 3;
  w.in = 5;
  std::vector<double> W(15);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 5; ++j) W[i * 5 + j] = val[i * 5 + j] * std::ldexp(1.0, sc[(i / 2) * 3 + j / 2] - 127);
  std::vector<float> x = test::random_vec(2 * 5, 11, 3.0f), y(6);
  be.linear(view(x, {2, 5}), w, 0, view(y, {2, 3}));
  EXPECT_EQ(y, ref_gemm(x, W, 2, 3, 5));
  // act_block 2: x quantized per 2 columns (last block ragged: 1 column) before the GEMM.
  be.linear(view(x, {2, 5}), w, 2, view(y, {2, 3}));
  EXPECT_EQ(y, ref_gemm(test::ref_act_quant(x, 5, 5, 2), W, 2, 3, 5));
  EXPECT_NE(y, ref_gemm(x, W, 2, 3, 5));
}

TEST(Linear, Fp4HandWeightAndBatchInvariance) {
  CpuBackend be;
  const double kMag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  const int out = 2, in = 64;
  std::vector<uint8_t> bytes(out * in / 2);
  std::vector<uint8_t> sc = {127, 129, 124, 126};  // [2, 2] E8M0 per 32 columns
  std::vector<double> W(out * in);
  for (int i = 0; i < out; ++i)
    for (int j = 0; j < in; ++j) {
      const int code = (i * 7 + j * 3 + 1) % 16;
      bytes[i * in / 2 + j / 2] |= uint8_t(j % 2 == 0 ? code : code << 4);  // low nibble = even column
      W[i * in + j] = (code & 8 ? -1 : 1) * kMag[code & 7] * std::ldexp(1.0, sc[i * 2 + j / 32] - 127);
    }
  Weight w;
  w.kind = Weight::Kind::FP4;
  w.w = Tensor(bytes.data(), DType::I8, {out, in / 2});
  w.scale = Tensor(sc.data(), DType::E8M0, {out, in / 32});
  w.out = out;
  w.in = in;
  const int T = 4;
  std::vector<float> x = test::random_vec(T * in, 12, 2.0f), y(T * out);
  be.linear(view(x, {T, in}), w, 0, view(y, {T, out}));
  EXPECT_EQ(y, ref_gemm(x, W, T, out, in));
  be.linear(view(x, {T, in}), w, 32, view(y, {T, out}));
  EXPECT_EQ(y, ref_gemm(test::ref_act_quant(x, in, in, 32), W, T, out, in));
  // Row 2 alone gives the same bits as inside the batch.
  std::vector<float> x2(x.begin() + 2 * in, x.begin() + 3 * in), y2(out);
  be.linear(view(x2, {1, in}), w, 32, view(y2, {1, out}));
  EXPECT_EQ(y2[0], y[2 * out]);
  EXPECT_EQ(y2[1], y[2 * out + 1]);
}

TEST(Linear, Bf16AndGrouped) {
  CpuBackend be;
  const int out = 4, in = 6, T = 3;
  std::vector<float> wf = test::random_vec(out * in, 13);
  std::vector<uint16_t> wb(wf.size());
  std::vector<double> W(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) {
    wb[i] = f32_to_bf16(wf[i]);
    W[i] = bf16_to_f32(wb[i]);
  }
  Weight w;
  w.kind = Weight::Kind::BF16;
  w.w = Tensor(wb.data(), DType::BF16, {out, in});
  std::vector<float> x = test::random_vec(T * in, 14), y(T * out);
  be.linear(view(x, {T, in}), w, 128, view(y, {T, out}));  // act_block ignored for BF16 weights
  EXPECT_EQ(y, ref_gemm(x, W, T, out, in));
  // Grouped: G = 2 groups of N = 2 rows, K = 6: out[t, g, n] = W[g*2+n] . x[t, g].
  std::vector<float> xg = test::random_vec(T * 2 * in, 15), yg(T * 2 * 2);
  be.grouped_linear(view(xg, {T, 2, in}), w, 2, view(yg, {T, 2, 2}));
  for (int t = 0; t < T; ++t)
    for (int g = 0; g < 2; ++g)
      for (int n = 0; n < 2; ++n) {
        double acc = 0;
        for (int k = 0; k < in; ++k) acc += double(xg[(t * 2 + g) * in + k]) * W[(g * 2 + n) * in + k];
        EXPECT_EQ(yg[(t * 2 + g) * 2 + n], float(acc));
      }
}

TEST(RmsNorm, WeightedAndUnweighted) {
  CpuBackend be;
  const int R = 3, d = 16;
  std::vector<float> x = test::random_vec(R * d, 16, 5.0f), y(R * d), w = test::random_vec(d, 17);
  be.rms_norm(view(x, {R, d}), Tensor(), 1e-6f, view(y, {R, d}));
  for (int r = 0; r < R; ++r) {
    double ss = 0;
    for (int c = 0; c < d; ++c) ss += double(y[r * d + c]) * y[r * d + c];
    EXPECT_NEAR(ss / d, 1.0, 1e-6);
  }
  std::vector<float> yw(R * d);
  be.rms_norm(view(x, {R, d}), view(w, {d}), 1e-6f, view(yw, {R, d}));
  for (int r = 0; r < R; ++r) {
    double ss = 0;
    for (int c = 0; c < d; ++c) ss += double(x[r * d + c]) * x[r * d + c];
    const double rs = 1.0 / std::sqrt(ss / d + 1e-6);
    for (int c = 0; c < d; ++c) EXPECT_NEAR(yw[r * d + c], w[c] * x[r * d + c] * rs, 1e-6 * std::fabs(w[c] * x[r * d + c] * rs) + 1e-12);
  }
}

TEST(Rope, LastDimsInterleavedAndInverse) {
  CpuBackend be;
  const int R = 2, H = 3, d = 12, rd = 4;
  std::vector<float> f = {1.0f, 0.01f};
  RopeTable tab{view(f, {2}), rd};
  std::vector<int32_t> pos = {3, 1000};
  std::vector<float> x = test::random_vec(R * H * d, 18), y = x;
  be.rope(view(y, {R, H, d}), view(pos, {R}), tab, false);
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < H; ++h) {
      const float* a = &x[(r * H + h) * d];
      const float* b = &y[(r * H + h) * d];
      for (int c = 0; c < d - rd; ++c) EXPECT_EQ(b[c], a[c]);
      for (int i = 0; i < rd / 2; ++i) {
        const double phi = double(float(pos[r]) * f[i]);
        const double x0 = a[d - rd + 2 * i], x1 = a[d - rd + 2 * i + 1];
        EXPECT_NEAR(b[d - rd + 2 * i], x0 * std::cos(phi) - x1 * std::sin(phi), 1e-6);
        EXPECT_NEAR(b[d - rd + 2 * i + 1], x0 * std::sin(phi) + x1 * std::cos(phi), 1e-6);
      }
    }
  be.rope(view(y, {R, H, d}), view(pos, {R}), tab, true);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-6);
}

// The spec's hc_pre mixes and Sinkhorn (model-spec §3.3), straightforwardly in double.
struct HcRef { std::vector<double> pre, post, comb; };
HcRef ref_hc(const float* X, const std::vector<float>& fn, const std::vector<float>& base,
             const std::vector<float>& scale, int n, int64_t D, int iters, double norm_eps, double eps) {
  const int64_t nD = n * D, M = int64_t(fn.size()) / nD;
  double ss = 0;
  for (int64_t i = 0; i < nD; ++i) ss += double(X[i]) * X[i];
  const double rho = 1.0 / std::sqrt(ss / nD + norm_eps);
  std::vector<double> mix(M);
  for (int64_t i = 0; i < M; ++i) {
    double acc = 0;
    for (int64_t k = 0; k < nD; ++k) acc += double(fn[i * nD + k]) * X[k];
    mix[i] = acc * rho;
  }
  auto sig = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  HcRef r;
  for (int j = 0; j < n; ++j) r.pre.push_back(sig(mix[j] * scale[0] + base[j]) + eps);
  if (M == n) return r;
  for (int j = 0; j < n; ++j) r.post.push_back(2 * sig(mix[n + j] * scale[1] + base[n + j]));
  std::vector<double> c(n * n);
  for (int i = 0; i < n * n; ++i) c[i] = mix[2 * n + i] * scale[2] + base[2 * n + i];
  auto rows = [&](bool softmax) {
    for (int j = 0; j < n; ++j) {
      double mx = -1e300, s = 0;
      for (int k = 0; k < n; ++k) mx = std::max(mx, c[j * n + k]);
      if (softmax)
        for (int k = 0; k < n; ++k) c[j * n + k] = std::exp(c[j * n + k] - mx);
      for (int k = 0; k < n; ++k) s += c[j * n + k];
      for (int k = 0; k < n; ++k) c[j * n + k] = softmax ? c[j * n + k] / s + eps : c[j * n + k] / (s + eps);
    }
  };
  auto cols = [&] {
    for (int k = 0; k < n; ++k) {
      double s = 0;
      for (int j = 0; j < n; ++j) s += c[j * n + k];
      for (int j = 0; j < n; ++j) c[j * n + k] /= (s + eps);
    }
  };
  rows(true);
  cols();
  for (int it = 1; it < iters; ++it) {
    rows(false);
    cols();
  }
  r.comb = c;
  return r;
}

TEST(Hc, MixSinkhornCollapsePost) {
  CpuBackend be;
  const int n = 4, T = 3;
  const int64_t D = 5, nD = n * D, M = n * (2 + n);
  std::vector<float> X = test::random_vec(T * nD, 19, 2.0f), fn = test::random_vec(M * nD, 20, 0.5f),
                     base = test::random_vec(M, 21), scale = {1.3f, 0.7f, 2.1f};
  HcArgs a;
  a.fn = view(fn, {M, nD});
  a.base = view(base, {M});
  a.scale = view(scale, {3});
  std::vector<float> pre(T * n), post(T * n), comb(T * n * n);
  be.hc_mix(view(X, {T, n, D}), a, view(pre, {T, n}), view(post, {T, n}), view(comb, {T, n, n}));
  for (int t = 0; t < T; ++t) {
    HcRef r = ref_hc(&X[t * nD], fn, base, scale, n, D, a.sinkhorn_iters, a.norm_eps, a.hc_eps);
    for (int j = 0; j < n; ++j) {
      EXPECT_NEAR(pre[t * n + j], r.pre[j], 1e-6);
      EXPECT_NEAR(post[t * n + j], r.post[j], 1e-6);
    }
    for (int i = 0; i < n * n; ++i) EXPECT_NEAR(comb[t * n * n + i], r.comb[i], 1e-6);
    for (int j = 0; j < n; ++j) {  // doubly stochastic: columns exactly normalised last
      double rs = 0, cs = 0;
      for (int k = 0; k < n; ++k) {
        rs += comb[t * n * n + j * n + k];
        cs += comb[t * n * n + k * n + j];
      }
      EXPECT_NEAR(cs, 1.0, 1e-5);
      EXPECT_NEAR(rs, 1.0, 1e-2);  // 20 iterations leave rows near 1 (values checked above)
    }
  }
  // Token 1 alone gives the same bits.
  std::vector<float> X1(X.begin() + nD, X.begin() + 2 * nD), pre1(n), post1(n), comb1(n * n);
  be.hc_mix(view(X1, {1, n, D}), a, view(pre1, {1, n}), view(post1, {1, n}), view(comb1, {1, n, n}));
  EXPECT_TRUE(test::same_bits(comb1, std::vector<float>(comb.begin() + n * n, comb.begin() + 2 * n * n)));
  EXPECT_TRUE(test::same_bits(pre1, std::vector<float>(pre.begin() + n, pre.begin() + 2 * n)));
  // Collapse and post.
  std::vector<float> u(T * D), F = test::random_vec(T * D, 22), Xo(T * nD);
  be.hc_collapse(view(X, {T, n, D}), view(pre, {T, n}), view(u, {T, D}));
  be.hc_post(view(F, {T, D}), view(X, {T, n, D}), view(post, {T, n}), view(comb, {T, n, n}), view(Xo, {T, n, D}));
  for (int t = 0; t < T; ++t)
    for (int64_t c = 0; c < D; ++c) {
      double acc = 0;
      for (int j = 0; j < n; ++j) acc += double(pre[t * n + j]) * X[(t * n + j) * D + c];
      EXPECT_NEAR(u[t * D + c], acc, 1e-6 * std::fabs(acc) + 1e-12);
      for (int k = 0; k < n; ++k) {
        double v = double(post[t * n + k]) * F[t * D + c];
        for (int j = 0; j < n; ++j) v += double(comb[(t * n + j) * n + k]) * X[(t * n + j) * D + c];
        EXPECT_NEAR(Xo[(t * n + k) * D + c], v, 1e-6 * std::fabs(v) + 1e-12);
      }
    }
  // In place (out aliasing X) gives the same bits.
  std::vector<float> Xi = X;
  be.hc_post(view(F, {T, D}), view(Xi, {T, n, D}), view(post, {T, n}), view(comb, {T, n, n}), view(Xi, {T, n, D}));
  EXPECT_TRUE(test::same_bits(Xi, Xo));
  // Expand.
  std::vector<float> Xe(T * nD);
  be.hc_expand(view(F, {T, D}), n, view(Xe, {T, n, D}));
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < n; ++j)
      for (int64_t c = 0; c < D; ++c) EXPECT_EQ(Xe[(t * n + j) * D + c], F[t * D + c]);
}

// The fused pre (Backend::hc_pre) is the three ops in sequence, bit for bit, with the collapse
// rounded to xn's dtype in between (bf16: fast numerics), with its own pre or a given one (V4.1).
TEST(Hc, FusedPreIsMixCollapseNorm) {
  CpuBackend be;
  const int n = 4, T = 3;
  const int64_t D = 8, nD = n * D, M = n * (2 + n);
  std::vector<float> X = test::random_vec(T * nD, 31, 2.0f), fn = test::random_vec(M * nD, 32, 0.5f),
                     base = test::random_vec(M, 33), scale = {1.3f, 0.7f, 2.1f}, w = test::random_vec(D, 34),
                     cpre = test::random_vec(T * n, 35);
  HcArgs a;
  a.fn = view(fn, {M, nD});
  a.base = view(base, {M});
  a.scale = view(scale, {3});
  for (DType dt : {DType::F32, DType::BF16})
    for (bool given : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (given ? " collapse_pre" : ""));
      std::vector<float> pre(T * n), post(T * n), comb(T * n * n), pre2(T * n), post2(T * n), comb2(T * n * n);
      std::vector<float> xn(T * D), u2(T * D), xn2(T * D);  // bf16 results stored widened (round-tripped)
      std::vector<uint16_t> xnb(T * D), ub(T * D), xnb2(T * D);
      auto row = [&](std::vector<float>& f, std::vector<uint16_t>& b) {
        return dt == DType::F32 ? view(f, {T, D}) : Tensor(b.data(), DType::BF16, {T, D});
      };
      Tensor cp = given ? view(cpre, {T, n}) : Tensor();
      be.hc_pre(view(X, {T, n, D}), a, cp, view(w, {D}), view(pre, {T, n}), view(post, {T, n}), view(comb, {T, n, n}),
                row(xn, xnb));
      be.hc_mix(view(X, {T, n, D}), a, view(pre2, {T, n}), view(post2, {T, n}), view(comb2, {T, n, n}));
      be.hc_collapse(view(X, {T, n, D}), given ? cp : view(pre2, {T, n}), row(u2, ub));
      be.rms_norm(row(u2, ub), view(w, {D}), a.norm_eps, row(xn2, xnb2));
      EXPECT_TRUE(test::same_bits(pre, pre2));
      EXPECT_TRUE(test::same_bits(post, post2));
      EXPECT_TRUE(test::same_bits(comb, comb2));
      if (dt == DType::F32) EXPECT_TRUE(test::same_bits(xn, xn2));
      else EXPECT_EQ(xnb, xnb2);
    }
}

TEST(Hc, HeadMixHasPreOnly) {
  CpuBackend be;
  const int n = 4, T = 2;
  const int64_t D = 6, nD = n * D;
  std::vector<float> X = test::random_vec(T * nD, 23, 2.0f), fn = test::random_vec(n * nD, 24, 0.5f),
                     base = test::random_vec(n, 25), scale = {0.9f};
  HcArgs a;
  a.fn = view(fn, {n, nD});
  a.base = view(base, {n});
  a.scale = view(scale, {1});
  std::vector<float> pre(T * n);
  be.hc_mix(view(X, {T, n, D}), a, view(pre, {T, n}), Tensor(), Tensor());
  for (int t = 0; t < T; ++t) {
    HcRef r = ref_hc(&X[t * nD], fn, base, scale, n, D, a.sinkhorn_iters, a.norm_eps, a.hc_eps);
    for (int j = 0; j < n; ++j) EXPECT_NEAR(pre[t * n + j], r.pre[j], 1e-6);
  }
}

}  // namespace
}  // namespace dil
