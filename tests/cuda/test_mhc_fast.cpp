// The fast mHC kernels (src/kernels/cuda/mhc_fast.cu: hc_pre fused_fast, hc_mix fast_f32,
// hc_post vec_f32) against the CPU fast specification (CpuBackend::hc_pre = hc_mix,
// hc_collapse into a bf16 row, rms_norm; hc_mix; hc_post), with
// per-element bounds derived here from the data, at T = 1, 17 and 4,096 tokens (V4-Flash
// D = 4096, and the fixtures' D = 256), the sublayer's 24 mixes and the head's 4, with and
// without V4.1's collapse_pre. The DISABLED_ benchmarks (scripts/gpu-check runs them) report
// GB/s against the measured copy bandwidth.
//
// Derivation (u = 2^-24, every bound per token t and element; "ref" = the CPU's value):
// - Dots. fn = hi + mid + lo exactly in bf16 pieces (mhc_fast.cu), so every product the tensor
//   cores form is exact; |hi| + |mid| + |lo| <= |fn| (1 + 2^-8 + 2^-16) < 1.01 |fn|. Tensor-core
//   accumulation model (Fasi, Higham, Mikaitis, Pranesh, "Numerical behavior of NVIDIA tensor
//   cores", PeerJ CS 2021, measured on V100/T4/A100; assumed for Hopper's mma.sync bf16 with f32
//   accumulate, and checked here by the measured worst fraction of the bound): one m16n8k16 step
//   adds its 16 exact products and the accumulator aligned to the largest exponent, truncating
//   below 2^(e_max - 23), and truncates the result: error < 18 * 2^-23 * (|c| + sum |p|) = 36 u
//   (|c| + sum |p|). A chunk of 64 columns chains 12 steps (2 halves x 2 k-steps x 3 pieces) from
//   zero, each |c| bounded by the chunk's sum |p|: <= 12 * 36 * 1.01 u < 440 u of the chunk's
//   sum_k |fn_k x_k|. The chunk sums then go through f32 adds: nD/64 chunks of a slice, the S
//   slices over lanes (ceil(S/32)), the 5-level shuffle tree (S <= nD/64). So |dot' - dot| <= g
//   sum_k |fn_k x_k| with d = 440 + nD/64 + ceil(S/32) + 5 and g = d u / (1 - d u) (the CPU's
//   double sum is exact to ~2^-53 relative). The sum of squares: per chunk 16 f32 FMA steps per
//   thread, 2 quad shuffles, then the same adds: depth 18 + nD/64 + ceil(S/32) + 5 < d, so
//   |ss' - ss| <= g ss.
// - rho = f32(1/sqrt(ss/nD + eps)): relative change <= g/2 from ss, plus each side's rounding
//   of rho (u each): |rho' - rho| <= rho (g/2 + 2u).
// - mix = f32(dot) * rho (f32 product; the CPU rounds its dot to f32 first):
//   |mix' - mix| <= B = rho g sum|fn x| + |mix| (g/2 + 2u) + 4u |mix| (roundings of dot and
//   of the product on both sides).
// - v = mix * s + b (two f32 roundings per side): |v' - v| <= |s| B + 4u (|mix s| + |v|).
// - pre = f32(sigmoid(v)) + eps: sigmoid' <= 1/4, two roundings per side of values <= 1 + eps:
//   |pre' - pre| <= |v' - v| / 4 + 4u. post = 2 sigmoid: |v' - v| / 2 + 8u.
// - comb = Sinkhorn(C), C the 16 logits v: to first order |comb' - comb|_q <= sum_p |J_qp|
//   |C'_p - C_p|, J the Jacobian of the exact Sinkhorn at the reference logits (central
//   differences of the double iteration, h = 2^-12; the second-order remainder at |dC| < 1e-4
//   is below 1e-8, inside the arithmetic term), plus each side's f32 arithmetic against the
//   exact iteration: per iteration each entry sees a row and a column normalisation, 3 + 1
//   roundings each, relative, entries <= 1: (iters + 1) 8u per side, 2 (iters + 1) 8u in all.
// - u = bf16(sum_j p_j x_j) with p the collapse weights (this mix's pre, or collapse_pre,
//   equal on both sides): |u'_f32 - u_f32| <= sum_j |p'_j - p_j| |x_j| + (n + 1) u sum_j |p_j
//   x_j| (the CUDA FMA chain: n roundings; the CPU: one), and the bf16 roundings add at most
//   one bf16 ulp of the larger (RNE of two f32 values a bf16 rounding boundary may separate):
//   |u' - u| <= du = that + ulp_bf16(|u|).
// - rs = f32(1/sqrt(sum u^2 / D + eps)): the CUDA f32 sum of exact squares has depth
//   8 ceil(D/2048) + 10; |rs' - rs| <= rs ((sum_c |u_c| du_c + du_c^2 / 2) / sum u^2 + g2/2 + 2u).
// - xn = bf16(w (u rs)): |y' - y| <= |w| (du rs + (|u| + du) |rs' - rs|) + 4u |y|, then one
//   bf16 ulp of max(|xn'|, |xn|) for the output roundings (parity.h compare_bf16).
// The numeric form in the registry (2e-4 rel / 2^-7 abs + one bf16 ulp) is checked too.
// hc_post vec_f32: |y'_f32 - y_f32| <= (n + 2) u (|post f| + sum_j |comb_jk x_j|) (n + 1 FMA
// steps on CUDA, one rounding on the CPU), then one bf16 ulp.
#include <algorithm>
#include <functional>
#include <map>

#include "parity.h"

namespace dil::test {
namespace {

constexpr double kU = 0x1p-24;

// Exact (double) Sinkhorn of the reference's formula (cpu/hc.cpp) for the Jacobian.
void sinkhorn_d(const double* C0, int n, int iters, double eps, double* out) {
  double c[64];
  for (int j = 0; j < n; ++j) {
    double mx = C0[j * n];
    for (int k = 1; k < n; ++k) mx = std::max(mx, C0[j * n + k]);
    double s = 0;
    for (int k = 0; k < n; ++k) s += c[j * n + k] = std::exp(C0[j * n + k] - mx);
    for (int k = 0; k < n; ++k) c[j * n + k] = c[j * n + k] / s + eps;
  }
  for (int it = 0; it < iters; ++it) {
    if (it > 0)
      for (int j = 0; j < n; ++j) {
        double s = 0;
        for (int k = 0; k < n; ++k) s += c[j * n + k];
        for (int k = 0; k < n; ++k) c[j * n + k] /= s + eps;
      }
    for (int k = 0; k < n; ++k) {
      double s = 0;
      for (int j = 0; j < n; ++j) s += c[j * n + k];
      for (int j = 0; j < n; ++j) c[j * n + k] /= s + eps;
    }
  }
  std::copy(c, c + n * n, out);
}

// Element-wise check of got against ref under bound[i]; prints one PARITY line.
void check_bound(const std::string& op, const std::string& shape, const std::vector<float>& got,
                 const std::vector<float>& ref, const std::vector<double>& bound) {
  ASSERT_EQ(got.size(), ref.size());
  ASSERT_EQ(bound.size(), ref.size());
  size_t bad = 0, differ = 0;
  double worst = 0, max_abs = 0, num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(double(got[i]) - double(ref[i]));
    if (!std::isfinite(got[i]) || d > bound[i]) ++bad;
    if (got[i] != ref[i]) ++differ;
    if (bound[i] > 0) worst = std::max(worst, d / bound[i]);
    max_abs = std::max(max_abs, d);
    num += d * d;
    den += double(ref[i]) * ref[i];
  }
  std::printf("PARITY | %-22s | %-34s | max_abs %.3e | rel_l2 %.3e | derived bound, worst %.2f of it, %zu differ | %s\n",
              op.c_str(), shape.c_str(), max_abs, den > 0 ? std::sqrt(num / den) : 0.0, worst, differ,
              bad == 0 ? "ok" : "FAIL");
  std::fflush(stdout);
  EXPECT_EQ(bad, 0u) << op << " " << shape << ": elements non-finite or over the derived bound";
}

struct Inputs {
  int64_t T, D, M;
  int n = 4, iters = 20;
  float norm_eps = 1e-6f, hc_eps = 1e-6f;
  std::vector<uint16_t> X, w;       // X [T, n, D] bf16; norm weight [D] bf16
  std::vector<float> fn, base, scale, cpre;  // cpre [T, n] or empty
};

// Streams with the model's structure: 4 correlated streams of mixed magnitudes; fn at the
// trained checkpoints' scale (|fn| ~ 0.05), scale ~ 1, base ~ 1.
Inputs make_inputs(int64_t T, int64_t D, bool head, bool with_cpre, uint32_t seed) {
  Inputs in;
  in.T = T, in.D = D, in.M = head ? 4 : 24;
  const int64_t nD = in.n * D;
  std::vector<float> x = random_vec(size_t(T * nD), seed, 2.0f), common = random_vec(size_t(T * D), seed + 1, 2.0f);
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < in.n; ++j)
      for (int64_t c = 0; c < D; ++c) x[size_t((t * in.n + j) * D + c)] += common[size_t(t * D + c)];
  in.X = bf16_of(x);
  in.w = bf16_of(random_vec(size_t(D), seed + 2, 1.0f));
  for (auto& v : in.w) v = f32_to_bf16(1.0f + 0.5f * bf16_to_f32(v));
  in.fn = random_vec(size_t(in.M * nD), seed + 3, 0.05f);
  in.base = random_vec(size_t(in.M), seed + 4, 1.0f);
  in.scale = random_vec(3, seed + 5, 1.0f);
  for (auto& s : in.scale) s = 0.5f + std::fabs(s);
  if (with_cpre) {
    in.cpre = random_vec(size_t(T * in.n), seed + 6, 0.5f);
    for (auto& p : in.cpre) p = 0.6f + p;  // sigmoid + eps range
  }
  return in;
}

class CudaMhcFast : public CudaParity {
 protected:
  void run_case(const Inputs& in, const std::string& sh) {
    const int64_t T = in.T, D = in.D, M = in.M, nD = in.n * D;
    const int n = in.n;
    const bool head = M == n;
    Inputs h = in;  // host copies the CPU views (views are non-const)
    HcArgs ha{view(h.fn, {M, nD}), view(h.base, {M}), view(h.scale, {head ? 1 : 3}), n, in.iters, in.norm_eps,
              in.hc_eps};
    HcArgs ga{devf(h.fn, {M, nD}), devf(h.base, {M}), devf(h.scale, {head ? 1 : 3}), n, in.iters, in.norm_eps,
              in.hc_eps};
    std::vector<float> pre(size_t(T * n)), post(size_t(T * n)), comb(size_t(T * n * n));
    std::vector<uint16_t> xn(size_t(T * D));
    Tensor cw = bview(h.w, {D});
    Tensor ccp = h.cpre.empty() ? Tensor() : view(h.cpre, {T, n});
    cpu->hc_pre(bview(h.X, {T, n, D}), ha, ccp, cw, view(pre, {T, n}), head ? Tensor() : view(post, {T, n}),
                head ? Tensor() : view(comb, {T, n, n}), bview(xn, {T, D}));
    Tensor gX = devb(h.X, {T, n, D}), gw = devb(h.w, {D});
    Tensor gcp = h.cpre.empty() ? Tensor() : devf(h.cpre, {T, n});
    Tensor gpre = poisoned(DType::F32, {T, n}), gpost = poisoned(DType::F32, {T, n}),
           gcomb = poisoned(DType::F32, {T, n, n}), gxn = poisoned(DType::BF16, {T, D});
    gpu->hc_pre(gX, ga, gcp, gw, gpre, head ? Tensor() : gpost, head ? Tensor() : gcomb, gxn);
    const std::vector<float> got_pre = down<float>(gpre), got_xn = downb(gxn);

    // Bounds (the derivation at the top).
    const int64_t S_max = nD / 64;
    const double d = double(440 + nD / 64 + (S_max + 31) / 32 + 5), g = d * kU / (1 - d * kU);
    const double d2 = double(8 * ((D + 2047) / 2048) + 10), g2 = d2 * kU / (1 - d2 * kU);
    std::vector<double> b_pre(size_t(T * n)), b_post(size_t(T * n)), b_comb(size_t(T * n * n)), b_xn(size_t(T * D));
    const double sink_arith = 2.0 * (in.iters + 1) * 8 * kU;
    for (int64_t t = 0; t < T; ++t) {
      const float* fn = h.fn.data();
      std::vector<double> x(static_cast<size_t>(nD));
      for (int64_t k = 0; k < nD; ++k) x[size_t(k)] = bf16_to_f32(h.X[size_t(t * nD + k)]);
      double ss = 0;
      for (double v : x) ss += v * v;
      const float rho = float(1.0 / std::sqrt(ss / double(nD) + double(in.norm_eps)));
      std::vector<double> mix(static_cast<size_t>(M)), B(static_cast<size_t>(M));
      for (int64_t r = 0; r < M; ++r) {
        double dot = 0, dabs = 0;
        for (int64_t k = 0; k < nD; ++k) {
          dot += double(fn[r * nD + k]) * x[size_t(k)];
          dabs += std::fabs(double(fn[r * nD + k]) * x[size_t(k)]);
        }
        mix[size_t(r)] = double(float(dot) * rho);
        B[size_t(r)] = double(rho) * g * dabs + std::fabs(mix[size_t(r)]) * (g / 2 + 6 * kU);
      }
      auto dv = [&](int64_t r, int which) {  // |v' - v| for mix r under scale `which`
        const double s = h.scale[size_t(which)], v = mix[size_t(r)] * s + h.base[size_t(r)];
        return std::fabs(s) * B[size_t(r)] + 4 * kU * (std::fabs(mix[size_t(r)] * s) + std::fabs(v));
      };
      for (int j = 0; j < n; ++j) b_pre[size_t(t * n + j)] = dv(j, 0) / 4 + 4 * kU;
      if (!head) {
        for (int j = 0; j < n; ++j) b_post[size_t(t * n + j)] = dv(n + j, 1) / 2 + 8 * kU;
        double C[16], dC[16];
        for (int q = 0; q < n * n; ++q) {
          C[q] = double(float(mix[size_t(2 * n + q)] * h.scale[2] + h.base[size_t(2 * n + q)]));
          dC[q] = dv(2 * n + q, 2);
        }
        double J[16][16];  // J[q][p] = d comb_q / d C_p
        const double hstep = 0x1p-12;
        for (int p = 0; p < n * n; ++p) {
          double Cp[16], Cm[16], op[16], om[16];
          std::copy(C, C + 16, Cp);
          std::copy(C, C + 16, Cm);
          Cp[p] += hstep;
          Cm[p] -= hstep;
          sinkhorn_d(Cp, n, in.iters, in.hc_eps, op);
          sinkhorn_d(Cm, n, in.iters, in.hc_eps, om);
          for (int q = 0; q < n * n; ++q) J[q][p] = (op[q] - om[q]) / (2 * hstep);
        }
        for (int q = 0; q < n * n; ++q) {
          double b = sink_arith;
          for (int p = 0; p < n * n; ++p) b += std::fabs(J[q][p]) * dC[p];
          b_comb[size_t(t * n * n + q)] = b;
        }
      }
      // The collapse weights and their bound on each side.
      std::vector<double> p(static_cast<size_t>(n)), dp(static_cast<size_t>(n));
      for (int j = 0; j < n; ++j) {
        p[size_t(j)] = h.cpre.empty() ? pre[size_t(t * n + j)] : h.cpre[size_t(t * n + j)];
        dp[size_t(j)] = h.cpre.empty() ? b_pre[size_t(t * n + j)] : 0.0;
      }
      std::vector<double> u(static_cast<size_t>(D)), du(static_cast<size_t>(D));
      double su2 = 0, sdu = 0;
      for (int64_t c = 0; c < D; ++c) {
        double s = 0, sabs = 0, e = 0;
        for (int j = 0; j < n; ++j) {
          const double xv = x[size_t(j * D + c)];
          s += p[size_t(j)] * xv;
          sabs += std::fabs(p[size_t(j)] * xv);
          e += dp[size_t(j)] * std::fabs(xv);
        }
        const double ub = bf16_to_f32(f32_to_bf16(float(s)));
        u[size_t(c)] = ub;
        // The ulp of the larger of the two bf16 values: |u'| <= (|u| + the f32 bound) (1 + 2^-7).
        const double df = e + (n + 1) * kU * sabs;
        du[size_t(c)] = df + ulp_bf16(float((std::fabs(ub) + df) * (1 + 0x1p-7)));
        su2 += ub * ub;
        sdu += std::fabs(ub) * du[size_t(c)] + du[size_t(c)] * du[size_t(c)] / 2;
      }
      const double rs = double(float(1.0 / std::sqrt(su2 / double(D) + double(in.norm_eps))));
      const double drs = rs * (sdu / std::max(su2, 1e-300) + g2 / 2 + 2 * kU);
      for (int64_t c = 0; c < D; ++c) {
        const double wv = bf16_to_f32(h.w[size_t(c)]), y = wv * u[size_t(c)] * rs;
        const double dy = std::fabs(wv) * (du[size_t(c)] * rs + (std::fabs(u[size_t(c)]) + du[size_t(c)]) * drs) +
                          4 * kU * std::fabs(y);
        const float xr = bf16_to_f32(xn[size_t(t * D + c)]), xg = got_xn[size_t(t * D + c)];
        b_xn[size_t(t * D + c)] = dy + ulp_bf16(std::max(std::fabs(xr), std::fabs(xg)));
      }
    }
    check_bound("hc_pre pre", sh, got_pre, pre, b_pre);
    if (!head) {
      check_bound("hc_pre post", sh, down<float>(gpost), post, b_post);
      check_bound("hc_pre comb (sinkhorn)", sh, down<float>(gcomb), comb, b_comb);
    }
    check_bound("hc_pre xn", sh, got_xn, widen(xn), b_xn);
    // The collapse and norm alone, tightly: the CPU's collapse + norm on the GPU's own collapse
    // weights. Only the f32 (vs double) collapse and norm sums differ (~(n + 1) 2^-24 relative,
    // rel 1e-5 with margin), then the bf16 roundings of u and of xn: compare_bf16's L2 model
    // (parity.h) with the u rounding as one more stage, 2^-7 of max|xn| per element (a flip of u
    // and one of xn). A wrong rounding mode or column map shows in L2 at once.
    {
      std::vector<float> p2 = h.cpre.empty() ? got_pre : h.cpre;
      std::vector<uint16_t> u2(size_t(T * D)), xn2(size_t(T * D));
      cpu->hc_collapse(bview(h.X, {T, n, D}), view(p2, {T, n}), bview(u2, {T, D}));
      cpu->rms_norm(bview(u2, {T, D}), cw, in.norm_eps, bview(xn2, {T, D}));
      compare_bf16("hc_pre xn (own pre)", sh, got_xn, widen(xn2), 1e-5, 0x1p-7);
    }
    // hc_mix fast_f32 (V4.1's attention mix after a replay trim): the same kernels' mixes alone,
    // the same bounds.
    Tensor mpre = poisoned(DType::F32, {T, n}), mpost = poisoned(DType::F32, {T, n}),
           mcomb = poisoned(DType::F32, {T, n, n});
    gpu->hc_mix(gX, ga, mpre, head ? Tensor() : mpost, head ? Tensor() : mcomb);
    check_bound("hc_mix fast_f32 pre", sh, down<float>(mpre), pre, b_pre);
    if (!head) {
      check_bound("hc_mix fast_f32 post", sh, down<float>(mpost), post, b_post);
      check_bound("hc_mix fast_f32 comb", sh, down<float>(mcomb), comb, b_comb);
    }
    // The registry's numeric form of the bound (what the trace gates on).
    const Tolerance tol = cuda_tol("hc_pre", "fused_fast");
    compare("hc_pre pre (registry)", sh, got_pre, pre, tol.rel, tol.abs);
    compare_bf16("hc_pre xn (registry)", sh, got_xn, widen(xn), tol.rel, tol.abs);
  }

  static Tolerance cuda_tol(const std::string& op, const std::string& impl) {
    for (const KernelImpl& k : kernel_registry(BackendKind::CUDA))
      if (k.op == op && k.name == impl) return k.tolerance;
    ADD_FAILURE() << "no CUDA implementation " << op << " " << impl;
    return {};
  }
};

TEST_F(CudaMhcFast, FusedPreMatchesTheCpuFastSpecification) {
  gpu->set_numerics(Numerics::Fast);
  ASSERT_EQ(gpu->impl_for(simple_site("hc_pre", DType::BF16, Numerics::Fast), 1).name, "fused_fast");
  ASSERT_EQ(gpu->impl_for(simple_site("hc_mix", DType::BF16, Numerics::Fast), 1).name, "fast_f32");
  struct C {
    int64_t T, D;
    bool head, cpre;
  };
  for (const C& c : {C{1, 4096, false, false}, C{17, 4096, false, false}, C{4096, 4096, false, false},
                     C{17, 4096, true, false}, C{1, 4096, true, false}, C{17, 4096, false, true},
                     C{4096, 4096, false, true}, C{17, 256, false, false}, C{5, 8192, false, true},
                     C{129, 768, true, false}}) {
    const std::string sh = std::string(c.head ? "head" : "sublayer") + (c.cpre ? " cpre" : "") +
                           " T=" + std::to_string(c.T) + " D=" + std::to_string(c.D);
    SCOPED_TRACE(sh);
    run_case(make_inputs(c.T, c.D, c.head, c.cpre, uint32_t(100 + c.T + c.D)), sh);
  }
}

// The composed path (official / reference plans, and fast calls whose shapes the fused
// kernels do not take) equals the three exact kernels: the reference's bounds of hc_mix,
// collapse and norm.
TEST_F(CudaMhcFast, ComposedPreMatchesTheCpu) {
  const int64_t T = 17, D = 256, n = 4, M = 24, nD = n * D;
  Inputs in = make_inputs(T, D, false, false, 7);
  std::vector<float> X = widen(in.X), w = widen(in.w);
  HcArgs ha{view(in.fn, {M, nD}), view(in.base, {M}), view(in.scale, {3}), 4, 20, 1e-6f, 1e-6f};
  HcArgs ga{devf(in.fn, {M, nD}), devf(in.base, {M}), devf(in.scale, {3}), 4, 20, 1e-6f, 1e-6f};
  std::vector<float> pre(size_t(T * n)), post(size_t(T * n)), comb(size_t(T * n * n)), xn(size_t(T * D));
  cpu->hc_pre(view(X, {T, n, D}), ha, Tensor(), view(w, {D}), view(pre, {T, n}), view(post, {T, n}),
              view(comb, {T, n, n}), view(xn, {T, D}));
  gpu->set_numerics(Numerics::Official);
  Tensor gpre = poisoned(DType::F32, {T, n}), gpost = poisoned(DType::F32, {T, n}),
         gcomb = poisoned(DType::F32, {T, n, n}), gxn = poisoned(DType::F32, {T, D});
  gpu->hc_pre(devf(X, {T, n, D}), ga, Tensor(), devf(w, {D}), gpre, gpost, gcomb, gxn);
  const std::string sh = "f32 composed T=17 D=256";
  compare("hc_pre composed pre", sh, down<float>(gpre), pre, 1e-6, 1e-6);
  compare("hc_pre composed comb", sh, down<float>(gcomb), comb, 1e-5, 1e-5);
  compare("hc_pre composed xn", sh, down<float>(gxn), xn, 1e-5, 1e-5);
}

TEST_F(CudaMhcFast, VectorPostMatchesTheCpuFastSpecification) {
  gpu->set_numerics(Numerics::Fast);
  ASSERT_EQ(gpu->impl_for(simple_site("hc_post", DType::BF16, Numerics::Fast), 1).name, "vec_f32");
  const int n = 4;
  for (int64_t T : {1, 17, 4096}) {
    const int64_t D = 4096;
    const std::string sh = "bf16 T=" + std::to_string(T) + " D=4096";
    auto X = bf16_of(random_vec(size_t(T * n * D), 91, 2.0f)), F = bf16_of(random_vec(size_t(T * D), 92, 1.0f));
    auto post = random_vec(size_t(T * n), 93, 1.0f), comb = random_vec(size_t(T * n * n), 94, 0.5f);
    for (auto& p : post) p = 1.0f + p;
    for (auto& c : comb) c = 0.5f + c;
    std::vector<uint16_t> ref(X.size());
    cpu->hc_post(bview(F, {T, D}), bview(X, {T, n, D}), view(post, {T, n}), view(comb, {T, n, n}),
                 bview(ref, {T, n, D}));
    Tensor gX = devb(X, {T, n, D}), gF = devb(F, {T, D}), gp = devf(post, {T, n}), gc = devf(comb, {T, n, n});
    Tensor out = poisoned(DType::BF16, {T, n, D});
    gpu->hc_post(gF, gX, gp, gc, out);
    const std::vector<float> got = downb(out), r = widen(ref);
    std::vector<double> bound(r.size());
    for (int64_t t = 0; t < T; ++t)
      for (int k = 0; k < n; ++k)
        for (int64_t c = 0; c < D; ++c) {
          double s = std::fabs(double(post[size_t(t * n + k)]) * bf16_to_f32(F[size_t(t * D + c)]));
          for (int j = 0; j < n; ++j)
            s += std::fabs(double(comb[size_t((t * n + j) * n + k)]) * bf16_to_f32(X[size_t((t * n + j) * D + c)]));
          const size_t i = size_t((t * n + k) * D + c);
          bound[i] = (n + 2) * kU * s + ulp_bf16(std::max(std::fabs(got[i]), std::fabs(r[i])));
        }
    check_bound("hc_post vec_f32", sh, got, r, bound);
    gpu->hc_post(gF, gX, gp, gc, gX);  // in place, as the model calls it
    check_bound("hc_post vec_f32 in place", sh, downb(gX), r, bound);
    const Tolerance tol = cuda_tol("hc_post", "vec_f32");
    compare_bf16("hc_post vec_f32 (registry)", sh, got, r, tol.rel, tol.abs);
  }
}

// ---- Benchmarks (scripts/gpu-check runs the DISABLED_ tests). GB/s of the op's own bytes
// (X read once, xn / out written, the small f32 tensors) and of the bytes the kernels move
// (fused pre: X twice), beside the exact path and the measured copy bandwidth (read + write).
class CudaBenchMhc : public CudaMhcFast {
 protected:
  static double time_calls(Backend& be, const std::function<void()>& fn, int reps) {
    for (int i = 0; i < 3; ++i) fn();
    be.synchronize();
    const int a = be.record_event();
    for (int i = 0; i < reps; ++i) fn();
    const int b = be.record_event();
    const double ms = be.elapsed_ms(a, b) / reps;
    be.clear_events();
    return ms;
  }
  void report(const std::string& op, const std::string& shape, double ms, double op_bytes, double moved, double copy) {
    std::printf("BENCH | %-26s | %-26s | %9.4f ms | %7.1f GB/s op bytes (%4.1f%% of copy) | %7.1f GB/s moved (%4.1f%%)\n",
                op.c_str(), shape.c_str(), ms, op_bytes / ms * 1e-6, 100 * op_bytes / ms * 1e-6 / copy,
                moved / ms * 1e-6, 100 * moved / ms * 1e-6 / copy);
    std::fflush(stdout);
  }
};

TEST_F(CudaBenchMhc, DISABLED_PreAndPost) {
  const double copy = gpu->measure_ceilings()["hbm_copy_gbps"];
  ASSERT_GT(copy, 0);
  std::printf("BENCH | copy bandwidth (read + write) | %.1f GB/s\n", copy);
  const int n = 4;
  for (int64_t T : {int64_t(64), int64_t(4096)}) {
    const int64_t D = 4096, M = 24, nD = n * D;
    // Enough distinct stream buffers that every call reads X from HBM (>= 512 MB in all).
    const int64_t xbytes = T * nD * 2;
    const int copies = int(std::max<int64_t>(2, ((int64_t(512) << 20) + xbytes - 1) / xbytes));
    std::vector<uint16_t> X = bf16_of(random_vec(size_t(T * nD), 5, 2.0f)), w = bf16_of(random_vec(size_t(D), 6));
    auto fn = random_vec(size_t(M * nD), 7, 0.05f), base = random_vec(size_t(M), 8), scale = random_vec(3, 9);
    std::vector<Tensor> gX;
    for (int i = 0; i < copies; ++i) gX.push_back(devb(X, {T, n, D}));
    HcArgs ga{devf(fn, {M, nD}), devf(base, {M}), devf(scale, {3}), n, 20, 1e-6f, 1e-6f};
    Tensor gw = devb(w, {D}), pre = poisoned(DType::F32, {T, n}), post = poisoned(DType::F32, {T, n}),
           comb = poisoned(DType::F32, {T, n, n}), xn = poisoned(DType::BF16, {T, D});
    Tensor F = devb(bf16_of(random_vec(size_t(T * D), 10)), {T, D}), out = poisoned(DType::BF16, {T, n, D});
    const double xb = double(T * nD * 2), small = double(T * (2 * n + n * n) * 4);
    const std::string sh = "V4-Flash T=" + std::to_string(T);
    const int reps = T >= 4096 ? 20 : 200;
    for (Numerics mode : {Numerics::Fast, Numerics::Official}) {
      gpu->set_numerics(mode);  // official: the composed exact kernels on the same bf16 streams
      const std::string impl = gpu->impl_for(simple_site("hc_pre", DType::BF16, mode), T).name;
      int i = 0;
      const double ms = time_calls(*gpu, [&] { gpu->hc_pre(gX[size_t(i++ % copies)], ga, Tensor(), gw, pre, post, comb, xn); }, reps);
      report("hc_pre " + impl, sh, ms, xb + T * D * 2 + small, (impl == "fused_fast" ? 2 : 4) * xb + T * D * 2 + small,
             copy);
      const std::string pimpl = gpu->impl_for(simple_site("hc_post", DType::BF16, mode), T).name;
      i = 0;
      const double pms = time_calls(*gpu, [&] { gpu->hc_post(F, gX[size_t(i++ % copies)], post, comb, out); }, reps);
      report("hc_post " + pimpl, sh, pms, 2 * xb + T * D * 2 + small, 2 * xb + T * D * 2 + small, copy);
    }
  }
}

}  // namespace
}  // namespace dil::test
