// Parity of the routed experts' decode-sized paths (fast numerics, T <= 64 tokens: the plan's
// `gemv_fp8`, moe_gemv_fp8.cu on FP8 tensor cores, and `gemv`, moe_gemv.cu over gemv_fast.cuh,
// forced) with the CPU's fast moe_experts, element by element under a bound
// derived before measuring, at the V4 and V4.1 expert shapes at decode sizes (T = 1, 8, 64;
// most experts empty, a few with several rows) and at tile edges (experts with 0..9 and 17 rows
// around the 4-row tiles, widths of fewer chunks than lanes, a ragged activation block, odd
// E8M0 scales). The GPU runs every token; the CPU reference and the bound are evaluated for a
// subset of them (exact: each token's output depends on its own (token, slot) rows only).
//
// The bound is test_moe_mma.cpp's (steps 1-6 and the fast roundings there), with this kernel's
// accumulation in steps 2 and 5 instead of the tensor cores':
// 2. Products of QDQ'd activations (e4m3 x 2^j) and FP4 weights (e2m1 x 2^j) are exact in f32.
//    Each product reaches g (or u, or y) through at most depth(K) = 32 + ceil(K / 1024) + 12
//    f32 roundings (gemv_fast.cuh: 32 fmaf within its 16-byte chunk of 32 values, one per chunk
//    of its lane (K / 32 chunks, every 32nd to a lane), 5 in the warp's shuffle tree, and a
//    margin of 7 the linear's K slices would take; the MoE runs one slice). Recursive summation
//    is then within gamma_depth = depth u / (1 - depth u) (u = 2^-24) of the exact sum relative
//    to sum |x w|; with the inputs' own possible deviation dx (h's FP8 flips, step 4):
//      |g_gpu - g| <= sum_k dx_k |w_k| + 1.01 depth u sum_k (|x_k| + dx_k) |w_k| + u |g|
//    (1.01 >= 1 / (1 - depth u); u |g| the reference's rounding of its double sum to f32).
//    gemv_fp8 accumulates as fp8_mma_bound.h derives (FP8 MMAs of 32 products promoted in f32)
//    instead: that bound replaces the depth term, the rest is the same.
#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "core/dtype.h"
#include "fp8_mma_bound.h"
#include "parity.h"

namespace dil::test {
namespace {

// f32 roundings per term (header, step 2).
double gemv_depth(int64_t K) { return double(32 + (K / 32 + 31) / 32 + 12); }

// A checkpoint weight dequantized on the host: [out, in] f32 (exact values).
struct Dense {
  int64_t out = 0, in = 0;
  std::vector<float> v;
};
Dense dense_fp4(const Weight& w) {
  Dense d{w.out, w.in, std::vector<float>(size_t(w.out * w.in))};
  const uint8_t* q = w.w.ptr<uint8_t>();
  const uint8_t* s = w.scale.ptr<uint8_t>();
  for (int64_t n = 0; n < w.out; ++n)
    for (int64_t k = 0; k < w.in; ++k) {
      const uint8_t b = q[n * (w.in / 2) + k / 2];
      d.v[size_t(n * w.in + k)] =
          e2m1_to_f32(uint8_t((k & 1) ? b >> 4 : b & 15)) * e8m0_to_f32(s[n * (w.in / 32) + k / 32]);
    }
  return d;
}

// The reference's FP8 QDQ of one value with block scale s (cpu_common.h: act_quant_qdq).
float qdq(float v, float s) { return round_e4m3(std::clamp(v / s, -448.0f, 448.0f)) * s; }
float block_scale(float amax) { return pow2_ceil(std::max(amax, 1e-4f) * (1.0f / 448.0f)); }

// Reference dot product (double, k ascending, as cpu::linear_rows) and the accumulation bound
// of steps 2 / 5: x exact values, dx their possible deviation on the GPU (null: none).
struct Dot {
  double sum = 0, bound = 0;
};
Dot dot(const float* x, const double* dx, const float* w, int64_t K) {
  Dot r;
  double P = 0, D = 0, A = 0;
  for (int64_t k = 0; k < K; ++k) {
    P += double(x[k]) * w[k];
    const double ex = dx ? dx[k] : 0.0;
    A += (std::fabs(double(x[k])) + ex) * std::fabs(double(w[k]));
    D += ex * std::fabs(double(w[k]));
  }
  r.sum = P;
  r.bound = D + 1.01 * gemv_depth(K) * 0x1p-24 * A;
  return r;
}

struct Routing {
  int64_t T;
  int k;
  std::vector<int32_t> idx;  // [T, k]
};

struct MmaCase {
  std::string what;
  int64_t D, I, E;
  int act, sets;
  Routing r;
  std::vector<int64_t> check;  // tokens compared with the CPU
  bool odd_scales = false;     // some w1 / w2 rows get E8M0 scales 0 (2^-127) and 129..140
  bool fast = false;           // fast numerics: bf16 tokens, round_bf16
};

// The deviation of a rounded value: the GPU's unrounded value lies in [v - d, v + d] (f32 ends
// rounded outwards); both sides round to bf16 (monotone), the reference's bf16(v).
double rounded_dev(float v, double d) {
  const float vr = round_bf16(v);
  const float lo = std::nextafter(float(double(v) - d), -INFINITY);
  const float hi = std::nextafter(float(double(v) + d), INFINITY);
  return std::max(std::fabs(double(round_bf16(lo)) - vr), std::fabs(double(round_bf16(hi)) - vr));
}

class CudaMoeGemv : public CudaParity {
 protected:
  // force: an implementation forced ("" = the plan's, which must be gemv_fp8).
  void run(const MmaCase& c, uint32_t seed, const char* force = "") {
    if (forced_ != force) {  // a backend with the implementation forced, or the plan's again
      BackendOptions o = test_options();
      if (*force) o.force["moe_experts"] = force;
      gpu = make_backend(BackendKind::CUDA, 0, o);
      forced_ = force;
    }
    const int64_t T = c.r.T, D = c.D, I = c.I;
    const int k = c.r.k;
    std::vector<HostWeight> s1, s2, s3;
    std::vector<Dense> q1, q2, q3;
    std::vector<Weight> d1, d2, d3;
    for (int i = 0; i < c.sets; ++i) {
      s1.push_back(make_weight(Weight::Kind::FP4, I, D, 32, seed + 3 * i));
      s2.push_back(make_weight(Weight::Kind::FP4, D, I, 32, seed + 3 * i + 1));
      s3.push_back(make_weight(Weight::Kind::FP4, I, D, 32, seed + 3 * i + 2));
    }
    for (int i = 0; c.odd_scales && i < c.sets; ++i) {  // the kernel's other dequantization branch
      for (size_t j = 0; j < s1[size_t(i)].scale.size(); ++j)
        if (j % 5 == 0) s1[size_t(i)].scale[j] = uint8_t(j % 2 ? 0 : 129 + j % 12);
      for (size_t j = 0; j < s2[size_t(i)].scale.size(); ++j)
        if (j % 7 == 0) s2[size_t(i)].scale[j] = uint8_t(j % 2 ? 0 : 129 + j % 4);
    }
    for (int i = 0; i < c.sets; ++i) {
      q1.push_back(dense_fp4(s1[i].wt));
      q2.push_back(dense_fp4(s2[i].wt));
      q3.push_back(dense_fp4(s3[i].wt));
      d1.push_back(dev_weight(s1[i]));
      d2.push_back(dev_weight(s2[i]));
      d3.push_back(dev_weight(s3[i]));
    }
    std::vector<Weight> h1, h2, h3, g1, g2, g3;
    for (int64_t e = 0; e < c.E; ++e) {
      h1.push_back(s1[e % c.sets].wt);
      h2.push_back(s2[e % c.sets].wt);
      h3.push_back(s3[e % c.sets].wt);
      g1.push_back(d1[e % c.sets]);
      g2.push_back(d2[e % c.sets]);
      g3.push_back(d3[e % c.sets]);
    }
    auto x = random_vec(size_t(T * D), seed + 100, 2.0f);
    std::vector<uint16_t> xb = bf16_of(x);
    if (c.fast) x = widen(xb);  // the bf16 tokens' values
    cpu->set_numerics(c.fast ? Numerics::Fast : Numerics::Reference);
    gpu->set_numerics(c.fast ? Numerics::Fast : Numerics::Reference);
    auto rw = random_vec(size_t(T * k), seed + 101, 1.0f);
    const float lim = 10.0f;
    std::vector<int32_t> ridx = c.r.idx;

    // GPU: every token.
    MoeExpertsArgs ga;
    ga.x = c.fast ? devb(xb, {T, D}) : devf(x, {T, D});
    ga.w1 = &g1;
    ga.w2 = &g2;
    ga.w3 = &g3;
    ga.route_w = devf(rw, {T, k});
    ga.route_idx = devi(ridx, {T, int64_t(k)});
    ga.act_block = c.act;
    ga.swiglu_limit = lim;
    ga.round_bf16 = c.fast;
    ga.out = poisoned(DType::F32, {T, D});
    gpu->moe_experts(ga);
    const std::string impl =
        gpu->impl_for(moe_experts_site(g1[0], c.act, ga.x.dtype, DType::F32, gpu->numerics()), T).name;
    const auto got_all = down<float>(ga.out);
    // The accumulation model of the implementation that ran.
    auto dotm = [&](const float* xv, const double* dxv, const float* wv, int64_t K) {
      if (impl != "gemv_fp8") return dot(xv, dxv, wv, K);
      const Fp8MmaDot f = dot_fp8_mma32(xv, dxv, wv, K);
      return Dot{f.sum, f.bound};
    };

    // CPU reference for the checked tokens.
    const int64_t C = int64_t(c.check.size());
    std::vector<float> xc(size_t(C * D)), rwc(size_t(C * k)), ref(size_t(C * D)), got(size_t(C * D));
    std::vector<uint16_t> xcb(size_t(C * D));  // the checked tokens' bf16 rows (fast)
    std::vector<int32_t> ic(size_t(C * k));
    for (int64_t j = 0; j < C; ++j) {
      const int64_t t = c.check[j];
      std::copy_n(x.begin() + t * D, D, xc.begin() + j * D);
      std::copy_n(xb.begin() + t * D, D, xcb.begin() + j * D);
      std::copy_n(rw.begin() + t * k, k, rwc.begin() + j * k);
      std::copy_n(ridx.begin() + t * k, k, ic.begin() + j * k);
      std::copy_n(got_all.begin() + t * D, D, got.begin() + j * D);
    }
    MoeExpertsArgs ha;
    ha.x = c.fast ? bview(xcb, {C, D}) : view(xc, {C, D});
    ha.w1 = &h1;
    ha.w2 = &h2;
    ha.w3 = &h3;
    ha.route_w = view(rwc, {C, int64_t(k)});
    ha.route_idx = view(ic, {C, int64_t(k)});
    ha.act_block = c.act;
    ha.swiglu_limit = lim;
    ha.round_bf16 = c.fast;
    ha.out = view(ref, {C, D});
    cpu->moe_experts(ha);

    // Replay of the reference with the bound of every output element (steps 1-6).
    std::vector<double> bound(size_t(C * D)), replay(size_t(C * D));
    std::vector<float> xq(static_cast<size_t>(D)), h(static_cast<size_t>(I)), q(static_cast<size_t>(I));
    std::vector<double> dh(static_cast<size_t>(I)), dq(static_cast<size_t>(I));
    std::vector<double> ysum(static_cast<size_t>(D)), ybound(static_cast<size_t>(D)), yabs(static_cast<size_t>(D));
    for (int64_t j = 0; j < C; ++j) {
      const float* xr = xc.data() + j * D;
      for (int64_t b0 = 0; b0 < D; b0 += c.act) {
        const int64_t b1 = std::min(D, b0 + c.act);
        float amax = 0;
        for (int64_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(xr[i]));
        const float s = block_scale(amax);
        for (int64_t i = b0; i < b1; ++i) xq[size_t(i)] = qdq(xr[i], s);
      }
      std::fill(ysum.begin(), ysum.end(), 0.0);
      std::fill(ybound.begin(), ybound.end(), 0.0);
      std::fill(yabs.begin(), yabs.end(), 0.0);
      for (int slot = 0; slot < k; ++slot) {
        const int32_t e = ic[size_t(j * k + slot)];
        if (e < 0 || e >= c.E) continue;
        const Dense &w1 = q1[size_t(e % c.sets)], &w2 = q2[size_t(e % c.sets)], &w3 = q3[size_t(e % c.sets)];
        const float rwv = rwc[size_t(j * k + slot)];
        for (int64_t n = 0; n < I; ++n) {
          const Dot dg = dotm(xq.data(), nullptr, w1.v.data() + n * D, D);
          const Dot du = dotm(xq.data(), nullptr, w3.v.data() + n * D, D);
          float gv = float(dg.sum), uv = float(du.sum);
          double eg = dg.bound + 0x1p-24 * std::fabs(dg.sum), eu = du.bound + 0x1p-24 * std::fabs(du.sum);
          if (c.fast) {  // g, u rounded to bf16 on both sides
            eg = rounded_dev(gv, eg);
            eu = rounded_dev(uv, eu);
            gv = round_bf16(gv);
            uv = round_bf16(uv);
          }
          // Saturated on both sides: min(g, L) = L and clamp(u) = +-L exactly, whatever the error.
          if (double(gv) - eg >= lim) eg = 0;
          if (std::fabs(double(uv)) - eu >= lim) eu = 0;
          // swiglu_one * w, f32 steps as the reference.
          const float gc = std::min(gv, lim), uc = std::clamp(uv, -lim, lim);
          const float sg = float(double(gc) / (1.0 + std::exp(-double(gc))));
          h[size_t(n)] = sg * uc * rwv;
          dh[size_t(n)] = std::fabs(double(rwv)) * (1.1 * eg * (std::fabs(double(uc)) + eu) +
                                                   (std::fabs(double(sg)) + 1.1 * eg) * eu) +
                          0x1p-20 * std::fabs(double(h[size_t(n)]));
          if (c.fast) {  // h rounded to bf16 (w2's input) on both sides
            dh[size_t(n)] = rounded_dev(h[size_t(n)], dh[size_t(n)]);
            h[size_t(n)] = round_bf16(h[size_t(n)]);
          }
        }
        for (int64_t b0 = 0; b0 < I; b0 += c.act) {
          const int64_t b1 = std::min(I, b0 + c.act);
          float amax = 0;
          double amax_hi = 0, amax_lo = 0;
          for (int64_t i = b0; i < b1; ++i) {
            amax = std::max(amax, std::fabs(h[size_t(i)]));
            amax_hi = std::max(amax_hi, std::fabs(double(h[size_t(i)])) + dh[size_t(i)]);
            amax_lo = std::max(amax_lo, std::fabs(double(h[size_t(i)])) - dh[size_t(i)]);
          }
          const float s = block_scale(amax);
          // Possible GPU scales: pow2_ceil is monotone, so every power of two between those of
          // the amax interval's ends (f32 ends rounded outwards).
          std::vector<float> scales;
          const float s_hi = block_scale(std::nextafter(float(amax_hi), INFINITY));
          for (float sc = block_scale(std::max(0.0f, std::nextafter(float(std::max(0.0, amax_lo)), 0.0f)));
               sc <= s_hi; sc *= 2.0f)
            scales.push_back(sc);
          for (int64_t i = b0; i < b1; ++i) {
            const float hv = h[size_t(i)];
            q[size_t(i)] = qdq(hv, s);
            // The h interval with its f32 ends rounded outwards.
            const float lo = std::nextafter(float(double(hv) - dh[size_t(i)]), -INFINITY);
            const float hi = std::nextafter(float(double(hv) + dh[size_t(i)]), INFINITY);
            double d = 0;
            for (float sc : scales)
              for (float v : {lo, hi}) d = std::max(d, std::fabs(double(qdq(v, sc)) - double(q[size_t(i)])));
            dq[size_t(i)] = d;
          }
        }
        for (int64_t n = 0; n < D; ++n) {
          const Dot dy = dotm(q.data(), dq.data(), w2.v.data() + n * I, I);
          float yv = float(dy.sum);
          double ey = dy.bound + 0x1p-23 * std::fabs(dy.sum);
          if (c.fast) {  // each slot's y rounded to bf16 on both sides
            ey = rounded_dev(yv, ey);
            yv = round_bf16(yv);
          }
          ysum[size_t(n)] += yv;
          ybound[size_t(n)] += ey;
          yabs[size_t(n)] += std::fabs(double(yv));
        }
      }
      for (int64_t n = 0; n < D; ++n) {
        replay[size_t(j * D + n)] = float(ysum[size_t(n)]);
        bound[size_t(j * D + n)] = ybound[size_t(n)] + 0x1p-23 * (yabs[size_t(n)] + ybound[size_t(n)]);
      }
    }

    // The replay is the reference itself (same formulas, same order).
    size_t replay_diff = 0;
    for (size_t i = 0; i < ref.size(); ++i) replay_diff += float(replay[i]) != ref[i];
    EXPECT_EQ(replay_diff, 0u) << c.what << ": the bound's replay differs from the CPU backend";

    size_t bad = 0, differ = 0;
    double max_abs = 0, worst = 0, num = 0, den = 0, bsum = 0, rabs = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double d = std::fabs(double(got[i]) - double(ref[i]));
      differ += got[i] != ref[i];
      if (!std::isfinite(got[i]) || !(d <= bound[i])) ++bad;
      if (std::isfinite(got[i])) {
        max_abs = std::max(max_abs, d);
        worst = std::max(worst, d / bound[i]);
        num += d * d;
      }
      den += double(ref[i]) * ref[i];
      bsum += bound[i];
      rabs += std::fabs(double(ref[i]));
    }
    const double rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    std::printf("PARITY | %-22s | %-34s | max_abs %.3e | rel_l2 %.3e | err/bound max %.3f, mean bound/|ref| %.1e | %s\n",
                ("moe_experts fast " + impl).c_str(), c.what.c_str(), max_abs, rel_l2, worst, bsum / std::max(rabs, 1e-30),
                bad == 0 ? "ok" : "FAIL");
    std::fflush(stdout);
    EXPECT_EQ(bad, 0u) << c.what << ": " << bad << " elements over the derived bound (or non-finite)";
    EXPECT_EQ(impl, *force ? force : c.r.T <= 64 ? "gemv_fp8" : "mma_bf16") << c.what;
    if (c.fast) {
      // The bound above is wide at the real shapes (its worst-case accumulation term exceeds a
      // bf16 ulp, so every rounding may flip in it), too wide to see whether the roundings
      // happened at all. They are where fast numerics departs from the unrounded computation
      // (each of g, u, h, y moved by up to 2^-8, and h's FP8 roundings with them); the GPU
      // departs from the CPU's fast result only where its f32 accumulation error (~1e-6
      // relative, measured in official numerics) carries a value across a rounding midpoint,
      // a fraction ~1e-6 / 2^-8 of them. So the GPU must be far closer to the CPU's fast result
      // than the unrounded one is: at most a quarter of that distance in L2.
      std::vector<float> plain(size_t(C * D));
      ha.round_bf16 = false;
      ha.out = view(plain, {C, D});
      cpu->moe_experts(ha);
      double pn = 0;
      for (size_t i = 0; i < ref.size(); ++i) pn += (double(plain[i]) - ref[i]) * (double(plain[i]) - ref[i]);
      const double d_round = den > 0 ? std::sqrt(pn / den) : std::sqrt(pn);
      // gemv_fp8's FP8 accumulation errs by up to ~2^-13 of a block's largest product, the order
      // of the roundings themselves (as the wgmma path in test_moe_mma.cpp): there the distance
      // is reported only, and the check is that every y was rounded to bf16 (the combine's
      // round_bf16), visible on the tokens with one routed slot, whose output is that y.
      const bool quarter = impl != "gemv_fp8";
      std::printf("PARITY | %-22s | %-34s | rel_l2 %.3e vs the unrounded computation's %.3e (bound: a quarter%s) | %s\n",
                  ("moe_experts fast " + impl).c_str(), c.what.c_str(), rel_l2, d_round, quarter ? "" : ", not checked",
                  !quarter || rel_l2 <= 0.25 * d_round ? "ok" : "FAIL");
      if (quarter) {
        EXPECT_LE(rel_l2, 0.25 * d_round) << c.what << ": the bf16 roundings did not happen on the GPU";
      }
      size_t one = 0;
      const size_t not_bf16 = moe_one_slot_not_bf16(ic, k, c.E, got, D, &one);
      std::printf("PARITY | %-22s | %-34s | %zu one-slot tokens, %zu outputs not bf16-exact | %s\n",
                  ("moe_experts fast " + impl).c_str(), c.what.c_str(), one, not_bf16, not_bf16 == 0 ? "ok" : "FAIL");
      EXPECT_EQ(not_bf16, 0u) << c.what << ": y not rounded to bf16";
    }
  }

 private:
  std::string forced_;
};

// Token t's k experts: distinct, uniformly random; with `hot` > 0 slot 0 is expert t % hot
// (a few experts then hold several full 64-row tiles).
Routing random_routing(int64_t T, int k, int64_t E, int hot, uint32_t seed) {
  Routing r{T, k, std::vector<int32_t>(size_t(T * k))};
  std::mt19937 rng(seed);
  std::vector<int32_t> all(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    std::iota(all.begin(), all.end(), 0);
    if (hot > 0) std::swap(all[0], all[size_t(t % hot)]);
    std::shuffle(all.begin() + (hot > 0 ? 1 : 0), all.end(), rng);
    std::copy_n(all.begin(), k, r.idx.begin() + t * k);
  }
  return r;
}

// `n` tokens spread over [0, T), first and last included.
std::vector<int64_t> spread(int64_t T, int64_t n) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(n > 1 ? i * (T - 1) / (n - 1) : 0);
  return v;
}


TEST_F(CudaMoeGemv, V4Decode) {
  const int64_t E = 256;
  for (const char* force : {"", "gemv"})
    for (int64_t T : {1, 8, 64})
      run({"fast v4 D4096 I2048 E256 k6 act128 T=" + std::to_string(T), 4096, 2048, E, 128, 2,
           random_routing(T, 6, E, T >= 8 ? 3 : 0, 1201 + uint32_t(T)), spread(T, std::min<int64_t>(T, 8)), false,
           true},
          1210 + uint32_t(T), force);
}

TEST_F(CudaMoeGemv, V41Decode) {
  const int64_t E = 384;
  for (const char* force : {"", "gemv"})
    for (int64_t T : {1, 17, 64})
      run({"fast v41 D5120 I2304 E384 k6 act32 T=" + std::to_string(T), 5120, 2304, E, 32, 2,
           random_routing(T, 6, E, T >= 8 ? 5 : 0, 1301 + uint32_t(T)), spread(T, std::min<int64_t>(T, 8)), false,
           true},
          1310 + uint32_t(T), force);
}

// Experts with 0..9 and 17 rows (gemv's tiles of 4: 1, 2, 3, 4 rows, then 4 + 1, ..., 4 + 4 + 1;
// gemv_fp8's tiles of 8: 1..8, 8 + 1, 8 + 8 + 1), 13 experts, k = 2; D = 288 (9 chunks: fewer than
// the 32 lanes; 9 blocks of 32: gemv_fp8's third 128-K step holds one; act 128: blocks 128, 128,
// 32), I = 224 (7 chunks, 7 blocks); and odd E8M0 scales (0 = 2^-127 and 129..140).
TEST_F(CudaMoeGemv, TileEdges) {
  const std::vector<int> counts = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 0, 3};  // rows of each expert
  const int k = 2;
  std::vector<int32_t> pairs;
  for (size_t e = 0; e < counts.size(); ++e) pairs.insert(pairs.end(), size_t(counts[e]), int32_t(e));
  while (pairs.size() % k != 0 || pairs.size() < 128) pairs.push_back(-1);  // padding slots: contribute nothing
  std::mt19937 rng(1403);
  std::shuffle(pairs.begin(), pairs.end(), rng);
  const int64_t T = int64_t(pairs.size()) / k;  // 64 tokens
  const int64_t E = int64_t(counts.size());
  Routing r{T, k, pairs};
  std::vector<int64_t> all(static_cast<size_t>(T));
  std::iota(all.begin(), all.end(), 0);
  for (const char* force : {"", "gemv"}) {
    run({"fast edges E13 rows 0..17 act128", 288, 224, E, 128, int(E), r, all, false, true}, 1410, force);
    run({"fast edges E13 act32 scales 0 / 129..140", 288, 224, E, 32, int(E), r, all, true, true}, 1420, force);
  }
}

}  // namespace
}  // namespace dil::test
