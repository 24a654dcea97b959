// Parity of the routed experts' tensor-core path (moe_mma.cu: FP4 weights, FP8-QDQ'd
// activations, BF16 mma.sync with f32 accumulation) with the CPU reference (double
// accumulation), element by element under a bound derived before measuring, at the V4 and
// V4.1 expert shapes and at tile edge cases. The GPU runs every token (so the tile map is the
// one of a real batch); the CPU reference and the bound are evaluated for a subset of the
// tokens, which is exact because each token's output depends only on its own (token, slot)
// rows (CpuBackend::moe_experts).
//
// The bound (per output element; kUmma below):
// 1. Products. QDQ'd activations are e4m3 x 2^j (4 significant bits) and FP4 weights e2m1 x 2^j
//    (2 bits), both exact in BF16 (8 bits); a BF16 x BF16 product (<= 16 bits) is exact in f32.
//    So the tensor-core sums differ from the reference's (double, rounded once) only by the
//    f32 accumulation.
// 2. Accumulation. One mma.sync m16n8k16 adds 16 exact products to the f32 accumulator c;
//    Hopper's tensor cores align the addends to the largest exponent and truncate. We model one
//    instruction's error as at most kUmma = 2^-20 (8 units of f32 rounding) times |c| plus the
//    16 |products|: a margin over the one-ulp truncation and alignment losses measured on these
//    units (Fasi et al. 2021, Khattak & Mikaitis 2025). The kernel walks k ascending, 16 at a
//    time, so over K/16 instructions
//      |g_gpu - g| <= 1.01 kUmma sum_j (|P_(j-1)| + sum_(k in block j) |x_k w_k|) + 2^-24 |g|
//    with P_j the exact partial sum after block j (1.01 covers the accumulator's own drift from
//    P, K/16 kUmma < 1e-3) and 2^-24 |g| the reference's own rounding of its double sum.
// 3. SwiGLU h = silu(min(g, L)) * clamp(u, -L, L) * w: |silu'| <= 1.1, min and clamp are
//    1-Lipschitz (and exact where g - dg >= L, or |u| - du >= L: saturated on both sides), so
//      |dh| <= |w| (1.1 dg (|u| + du) + (|silu(g)| + 1.1 dg) du) + 2^-20 |h|
//    (the last term: the f32 roundings of the products and a last-bit difference of the double
//    exp in SiLU, on each side).
// 4. FP8 QDQ of h in blocks of act_block. The block scale 2^ceil(log2(amax/448)) differs when
//    amax is within its bound of a power-of-two boundary, and an element's e4m3 rounding flips
//    when h is within dh of a rounding midpoint. For a fixed scale QDQ is monotone in h, so the
//    GPU's value lies in [Q(h - dh, s), Q(h + dh, s)] for s either of the possible scales: dq_j =
//    the largest distance of those ends from the reference's q_j (0 far from any boundary).
// 5. y = W2 . q over K = I, with the flips and the accumulation as in 2 on |q| + dq:
//      |y_gpu - y| <= sum_j |W2_nj| dq_j + 1.01 kUmma sum_j (|P_(j-1)| + D_(j-1)
//                     + sum_(block j) |W2| (|q| + dq)) + 2^-24 |y|
//    D the running sum of |W2| dq; then 2^-24 |y| more for the rounding of y to f32 (both sides).
// 6. out = the sum of the k slots' y in double, rounded once on both sides: the sum of the slot
//    bounds + 2^-23 |out|.
// The replay that evaluates the bound recomputes the reference step by step with the CPU's
// formulas; the test also checks that replay against the CPU backend (bit-identical).
// Fast numerics (MmaCase::fast: bf16 tokens, MoeExpertsArgs::round_bf16): g and u are rounded
// to bf16 after their GEMMs, h after SwiGLU and every slot's y after w2, on both sides. Rounding
// (RNE) is monotone, so as for the QDQ of step 4 the GPU's rounded value lies between the
// roundings of the ends of its interval: at each of those points the replay rounds the
// reference value and replaces the deviation d by max |bf16(v -+ d) - bf16(v)| (0 away from a
// rounding midpoint, one bf16 ulp near one), and the next step starts from there.
#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "core/dtype.h"
#include "fp8_mma_bound.h"
#include "parity.h"

namespace dil::test {
namespace {

constexpr double kUmma = 0x1p-20;  // per-instruction error model of the tensor-core accumulation

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
// of step 2 / 5: x exact values, dx their possible deviation on the GPU (null: none).
struct Dot {
  double sum = 0, bound = 0;
};
// The FP8 path of `wgmma` (act_block 128, moe_wgmma.cu): each 128-K block's partial sum is
// formed by 4 k32 e4m3 wgmma steps in the tensor core's accumulator, which aligns the step's 32
// exact products and the running partial to the largest exponent among them and keeps 13
// fraction bits below it (test_cutlass.cpp's model, the ~14-bit accumulation of the DeepSeek-V3
// report): each of the 33 terms loses less than 2^-13 M_j, M_j the step's largest magnitude.
// The partial is then added to the f32 accumulator with one fmaf of the two power-of-two
// scales (one f32 rounding, 2^-24 of the running sum). Magnitudes are taken on the exact
// values plus their possible deviation dx and scaled by 1.01 (the partials' own drift).
Dot dot_fp8(const float* x, const double* dx, const float* w, int64_t K) {
  Dot r;
  double P = 0, D = 0, err = 0;
  for (int64_t b0 = 0; b0 < K; b0 += 128) {
    double part = 0;  // |exact partial| of the block so far (plus deviations)
    for (int64_t s0 = b0; s0 < std::min(K, b0 + 128); s0 += 32) {
      double m = part;
      double step = 0;
      for (int64_t k = s0; k < std::min(K, s0 + 32); ++k) {
        const double ex = dx ? dx[k] : 0.0;
        const double t = (std::fabs(double(x[k])) + ex) * std::fabs(double(w[k]));
        m = std::max(m, t);
        step += double(x[k]) * w[k];
        P += double(x[k]) * w[k];
        D += ex * std::fabs(double(w[k]));
      }
      err += 33.0 * 0x1p-13 * 1.01 * m;
      part = std::fabs(part) + std::fabs(step);
    }
    err += 0x1p-24 * (std::fabs(P) + D + err);  // the f32 promotion of the block
  }
  r.sum = P;
  r.bound = D + err;
  return r;
}

Dot dot(const float* x, const double* dx, const float* w, int64_t K) {
  Dot r;
  double P = 0, D = 0, steps = 0;
  for (int64_t k0 = 0; k0 < K; k0 += 16) {
    double blk = 0;
    const double Pprev = std::fabs(P), Dprev = D;
    for (int64_t k = k0; k < std::min(K, k0 + 16); ++k) {
      P += double(x[k]) * w[k];
      const double ex = dx ? dx[k] : 0.0;
      blk += (std::fabs(double(x[k])) + ex) * std::fabs(double(w[k]));
      D += ex * std::fabs(double(w[k]));
    }
    steps += Pprev + Dprev + blk;
  }
  r.sum = P;
  r.bound = D + 1.01 * kUmma * steps;
  return r;
}

struct Routing {
  int64_t T;
  int k;
  std::vector<int32_t> idx;  // [T, k]
};

// The tile-edge routing: 13 experts with 0, 1, 15/16/17, 63/64/65, 127/128/129, 300 and 0 rows,
// k = 2, padded to 928 pairs with unrouted slots (they contribute nothing), shuffled by `seed`:
// 464 tokens. `all` lists every token (all are checked).
struct EdgeRouting {
  Routing r;
  int64_t E;
  std::vector<int64_t> all;
};
EdgeRouting edge_routing(uint32_t seed) {
  const std::vector<int> counts = {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 300, 0};  // rows of each expert
  const int k = 2;
  std::vector<int32_t> pairs;
  for (size_t e = 0; e < counts.size(); ++e) pairs.insert(pairs.end(), size_t(counts[e]), int32_t(e));
  while (pairs.size() % k != 0 || pairs.size() < 928) pairs.push_back(-1);
  std::mt19937 rng(seed);
  std::shuffle(pairs.begin(), pairs.end(), rng);
  const int64_t T = int64_t(pairs.size()) / k;
  std::vector<int64_t> all(static_cast<size_t>(T));
  std::iota(all.begin(), all.end(), 0);
  return {Routing{T, k, pairs}, int64_t(counts.size()), all};
}

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

class CudaMoeMma : public CudaParity {
 protected:
  void run(const MmaCase& c, uint32_t seed) {
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
    // The accumulation model of the implementation that ran: FP8 wgmma (wgmma at act_block 128),
    // else BF16 tensor-core instructions of 16 products (mma_bf16, and wgmma's BF16 path).
    // gemv_fp8 (the plan's at decode sizes): FP8 MMAs of 32 products promoted in f32 (fp8_mma_bound.h).
    const bool fp8_acc = impl == "wgmma" && c.act == 128;
    auto dotm = [&](const float* xv, const double* dxv, const float* wv, int64_t K) {
      if (impl == "gemv_fp8") {
        const Fp8MmaDot f = dot_fp8_mma32(xv, dxv, wv, K);
        return Dot{f.sum, f.bound};
      }
      return fp8_acc ? dot_fp8(xv, dxv, wv, K) : dot(xv, dxv, wv, K);
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
                c.fast ? "moe_experts mma fast" : "moe_experts mma fp4", c.what.c_str(), max_abs, rel_l2, worst, bsum / std::max(rabs, 1e-30),
                bad == 0 ? "ok" : "FAIL");
    std::fflush(stdout);
    EXPECT_EQ(bad, 0u) << c.what << ": " << bad << " elements over the derived bound (or non-finite)";
    if (!forced("moe_experts")) {  // the plan's choice: wgmma where it runs the shapes (fast numerics)
      const bool wg_fits = c.fast && D % 128 == 0 && I % 128 == 0;
      EXPECT_EQ(impl, c.fast && T <= 64 ? "gemv_fp8" : wg_fits ? "wgmma" : "mma_bf16") << c.what;
    }
    // The SIMT kernels are bit-identical to the reference (double sums); f32 accumulation over
    // K >= 224 terms is not, so equal outputs everywhere would mean the tensor-core path did not
    // run. (In fast numerics the bf16 roundings hide most accumulation differences: not checked.)
    if (!c.fast) {
      EXPECT_GT(differ, 0u) << c.what << ": output bit-identical to the CPU: the tensor-core path did not run";
    }
    if (c.fast && (impl == "wgmma" || impl == "gemv_fp8")) {
      // Every slot's y is rounded to bf16 (the w2 epilogue), so a token with one routed slot
      // has a bf16-exact output; the FP8 accumulation's flips make the quarter-distance check
      // below meaningless for this path (its errors are of the order of the roundings).
      size_t one = 0;
      const size_t not_bf16 = moe_one_slot_not_bf16(ic, k, c.E, got, D, &one);
      std::printf("PARITY | %-22s | %-34s | %zu one-slot tokens, %zu outputs not bf16-exact | %s\n", "moe_experts wgmma",
                  c.what.c_str(), one, not_bf16, not_bf16 == 0 ? "ok" : "FAIL");
      EXPECT_EQ(not_bf16, 0u) << c.what << ": y not rounded to bf16";
    } else if (c.fast) {
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
      std::printf("PARITY | %-22s | %-34s | rel_l2 %.3e vs the unrounded computation's %.3e (bound: a quarter) | %s\n",
                  "moe_experts mma fast", c.what.c_str(), rel_l2, d_round, rel_l2 <= 0.25 * d_round ? "ok" : "FAIL");
      EXPECT_LE(rel_l2, 0.25 * d_round) << c.what << ": the bf16 roundings did not happen on the GPU";
    }
  }
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

TEST_F(CudaMoeMma, V4Shape) {
  // T=512, k=6 > 8 rows per expert on average: the tile path.
  const int64_t T = 512, E = 256;
  run({"v4 D4096 I2048 E256 k6 act128 T=512", 4096, 2048, E, 128, 2, random_routing(T, 6, E, 3, 601),
       spread(T, 16)},
      610);
}

TEST_F(CudaMoeMma, V41Shape) {
  const int64_t T = 640, E = 384;
  run({"v41 D5120 I2304 E384 k6 act32 T=640", 5120, 2304, E, 32, 2, random_routing(T, 6, E, 5, 602),
       spread(T, 16)},
      620);
}

// Experts with 0 rows, 1 row, both sides of the 16-row MMA slices (15/16/17), of the 32-row warp
// slices and the old 64-row tile (63/64/65), of the 128-row tile (127/128/129) and 300 rows
// (three tiles); N and the w2 K not multiples of the tile (I = 224 = 128 + 96 columns and 7 k
// stages; D = 288 = 2 x 128 + 32 columns and 9 k stages: odd stage counts end on the second
// buffer); act_block 128 with a ragged last block of 32, and act_block 32.
TEST_F(CudaMoeMma, TileEdges) {
  const EdgeRouting er = edge_routing(603);
  run({"edges E13 rows 0..300 act128", 288, 224, er.E, 128, int(er.E), er.r, er.all}, 630);
  run({"edges E13 rows 0..300 act32", 288, 224, er.E, 32, int(er.E), er.r, er.all}, 640);
  run({"edges E13 act32 scales 0 / 129..140", 288, 224, er.E, 32, int(er.E), er.r, er.all, true}, 650);
}

// Fast numerics (bf16 tokens, round_bf16): the same shapes and edges, the bound carried
// through the four bf16 roundings (header).
TEST_F(CudaMoeMma, FastV4Shape) {
  const int64_t T = 512, E = 256;
  run({"fast v4 D4096 I2048 E256 k6 act128 T=512", 4096, 2048, E, 128, 2, random_routing(T, 6, E, 3, 661),
       spread(T, 16), false, true},
      660);
}

TEST_F(CudaMoeMma, FastV41ShapeAndDecode) {
  const int64_t E = 384;
  run({"fast v41 D5120 I2304 E384 k6 act32 T=640", 5120, 2304, E, 32, 2, random_routing(640, 6, E, 5, 671),
       spread(640, 16), false, true},
      670);
  // Decode sizes: one token, and 17 (fewer rows than experts: one partial tile each).
  run({"fast v41 decode T=1", 5120, 2304, E, 32, 2, random_routing(1, 6, E, 0, 672), spread(1, 1), false, true}, 675);
  run({"fast v41 decode T=17", 5120, 2304, E, 32, 2, random_routing(17, 6, E, 0, 673), spread(17, 17), false, true},
      676);
}

TEST_F(CudaMoeMma, FastTileEdges) {
  const EdgeRouting er = edge_routing(683);
  run({"fast edges E13 rows 0..300 act128", 288, 224, er.E, 128, int(er.E), er.r, er.all, false, true}, 680);
  run({"fast edges E13 act32 scales 0 / 129..140", 288, 224, er.E, 32, int(er.E), er.r, er.all, true, true}, 690);
}

// The wgmma path (fast numerics, widths multiples of 128) at the tile edges: experts with 0, 1,
// 15/16/17, 63/64/65 (one or both MMA warpgroups), 127/128/129 (one or two tiles) and 300 rows;
// D = 512 and I = 256: 4 weight-row blocks per tile in both GEMMs, 4 / 2 FP8 steps (8 / 4 BF16).
// act 128 runs the FP8 path, act 32 the BF16 path; the odd scales (0 and 129..140 in one block)
// cannot be converted to e4m3 exactly, so that list runs the BF16 tensor-core fallback.
TEST_F(CudaMoeMma, FastWgmmaTileEdges) {
  const EdgeRouting er = edge_routing(693);
  run({"fast wgmma edges E13 D512 I256 act128", 512, 256, er.E, 128, int(er.E), er.r, er.all, false, true}, 694);
  run({"fast wgmma edges E13 D512 I256 act32", 512, 256, er.E, 32, int(er.E), er.r, er.all, false, true}, 695);
  run({"fast wgmma edges act128 odd scales", 512, 256, er.E, 128, int(er.E), er.r, er.all, true, true}, 696);
}

// Many tiles per expert and a full persistent schedule: 2,048 tokens, k = 6 over 64 experts of
// V4-Flash's shape (~192 rows each, two tiles; slot 0 on 3 hot experts: ~880 rows, 7 tiles).
TEST_F(CudaMoeMma, FastWgmmaManyTiles) {
  const int64_t T = 2048, E = 64;
  run({"fast wgmma v4 E64 T=2048", 4096, 2048, E, 128, 2, random_routing(T, 6, E, 3, 697), spread(T, 24), false,
       true},
      698);
  run({"fast wgmma v41 E64 T=2048", 5120, 2304, E, 32, 2, random_routing(T, 6, E, 3, 699), spread(T, 24), false,
       true},
      700);
}

}  // namespace
}  // namespace dil::test
