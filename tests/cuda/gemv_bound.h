// The per-element bound of linear's fast GEMV (`gemv`, gemv_fast.cuh) against the CPU's fast
// linear, shared by test_gemv.cpp and the fast cases of test_linear.cpp that the plan sends to it.
//
// The bound (per output element). Let xq be the activations the op multiplies (the bf16 input,
// FP8-QDQ'd per act_block for FP8 / FP4 weights: exact in bf16) and w the decoded weights.
// 1. Products. xq has <= 8 significant bits and w <= 8 (BF16), 4 (e4m3) or 2 (e2m1) bits times
//    a power of two, so every product is exact in f32 (the kernel multiplies the unscaled codes
//    and applies the power-of-two block scale, and FP4's 2^6, to each 16-byte chunk's sum:
//    exact as well, the scales being normal powers of two here).
// 2. Accumulation. Each product reaches the result through at most
//      depth = V + ceil(C / 32) + 5 + (KS - 1) <= V + ceil(C / 32) + 12
//    f32 roundings: V fmaf within its chunk (V values per 16-byte chunk: 8 BF16, 16 FP8,
//    32 FP4), one per chunk a lane adds to its accumulator (a lane takes every 32nd of the C
//    chunks of its K slice), 5 in the warp's xor-shuffle tree, and at most KS - 1 <= 7 in the
//    sum of the K slices. Recursive summation with n roundings per term is within
//    gamma_n = n u / (1 - n u) (u = 2^-24) of the exact sum, relative to sum |xq w|; the
//    reference's own rounding of its double sum to f32 adds u |ref|:
//      |got - ref| <= 1.01 depth u S + u |ref|,   S = sum_k |xq_k| |w_k|
//    (1.01 >= 1 / (1 - n u) for n < 10^5). S is computed by the CPU's linear on |x| and |W| (the
//    sign bits cleared; the FP8 QDQ is sign-symmetric, so |QDQ(x)| = QDQ(|x|)), in double
//    rounded once (relative error 2^-24, inside the 1.01).
// 3. A bf16 output: both sides round their f32 value once (RNE, monotone), so they differ by
//    at most the f32 bound plus one bf16 ulp of the larger magnitude.
#pragma once
#include <algorithm>
#include <cmath>

#include "parity.h"

namespace dil::test {

// |W|: the same weight with every value's sign bit cleared (storage re-pointed to the copy).
inline HostWeight abs_weight(const HostWeight& h) {
  HostWeight a = h;
  switch (h.wt.kind) {
    case Weight::Kind::BF16:
      for (size_t i = 1; i < a.w.size(); i += 2) a.w[i] &= 0x7f;  // little-endian: the high byte
      break;
    case Weight::Kind::FP8:
      for (auto& b : a.w) b &= 0x7f;
      break;
    case Weight::Kind::FP4:
      for (auto& b : a.w) b &= 0x77;
      break;
    case Weight::Kind::F32:
      for (size_t i = 3; i < a.w.size(); i += 4) a.w[i] &= 0x7f;
      break;
  }
  a.wt.w.data = a.w.data();
  if (!a.scale.empty()) a.wt.scale.data = a.scale.data();
  return a;
}

// Values per 16-byte chunk (gemv_fast.cuh gv_values).
inline int chunk_values(Weight::Kind k) { return k == Weight::Kind::BF16 ? 8 : k == Weight::Kind::FP8 ? 16 : 32; }

// Weight rows [n0, n0 + rows) of a BF16 or FP8 weight as a weight of its own (FP8: n0 and rows
// multiples of the block rows), for grouped_linear's groups.
inline HostWeight row_slice(const HostWeight& h, int64_t n0, int64_t rows) {
  const Weight& w = h.wt;
  HostWeight o;
  o.wt = w;
  const size_t rb = w.kind == Weight::Kind::BF16 ? size_t(w.in) * 2 : size_t(w.in);
  o.w.assign(h.w.begin() + int64_t(rb) * n0, h.w.begin() + int64_t(rb) * (n0 + rows));
  o.wt.out = rows;
  o.wt.w.data = o.w.data();
  o.wt.w.shape[0] = rows;
  if (w.kind == Weight::Kind::FP8) {
    const int64_t sc = w.scale.size(1), r0 = n0 / w.block_out, nr = (rows + w.block_out - 1) / w.block_out;
    o.scale.assign(h.scale.begin() + sc * r0, h.scale.begin() + sc * (r0 + nr));
    o.wt.scale.data = o.scale.data();
    o.wt.scale.shape[0] = nr;
  }
  return o;
}

class GemvParity : public CudaParity {
 protected:
  // got: the GPU's output (bf16 outputs widened); x: the bf16 input [T, in]; checks every element
  // against the bound above and prints one PARITY line. Returns the number over it.
  size_t compare_gemv(const std::string& what, const HostWeight& hw, int act, std::vector<uint16_t> x, int64_t T,
                      DType odt, const std::vector<float>& got) {
    const Weight& w = hw.wt;
    HostWeight ha = abs_weight(hw);
    const bool bf = odt == DType::BF16;
    std::vector<float> ref32(size_t(T * w.out)), S(size_t(T * w.out));
    std::vector<uint16_t> ref_b(size_t(T * w.out));
    cpu->set_numerics(Numerics::Fast);
    cpu->linear(bview(x, {T, w.in}), w, act, view(ref32, {T, w.out}));  // the f32 value before any bf16 rounding
    if (bf) cpu->linear(bview(x, {T, w.in}), w, act, bview(ref_b, {T, w.out}));
    for (auto& v : x) v &= 0x7fff;
    cpu->linear(bview(x, {T, w.in}), ha.wt, act, view(S, {T, w.out}));
    const std::vector<float> ref = bf ? widen(ref_b) : ref32;
    const int V = chunk_values(w.kind);
    const int64_t C = w.in / V;
    const double u = 0x1p-24, depth = double(V + (C + 31) / 32 + 12);
    size_t bad = 0, differ = 0;
    double max_abs = 0, worst = 0, num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      double bound = 1.01 * depth * u * double(S[i]) + u * std::fabs(double(ref32[i]));
      if (bf) bound += ulp_bf16(std::max(std::fabs(double(got[i])), std::fabs(double(ref[i]))));
      const double d = std::fabs(double(got[i]) - double(ref[i]));
      differ += got[i] != ref[i];
      if (!std::isfinite(got[i]) || !(d <= bound)) ++bad;
      if (std::isfinite(got[i])) {
        max_abs = std::max(max_abs, d);
        if (bound > 0) worst = std::max(worst, d / bound);
        num += d * d;
      }
      den += double(ref[i]) * ref[i];
    }
    const double rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    std::printf("PARITY | %-22s | %-34s | max_abs %.3e | rel_l2 %.3e | err/bound max %.3f, %zu of %zu differ | %s\n",
                "linear fast gemv", what.c_str(), max_abs, rel_l2, worst, differ, ref.size(), bad == 0 ? "ok" : "FAIL");
    std::fflush(stdout);
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " elements over the derived bound (or non-finite)";
    return bad;
  }
};

}  // namespace dil::test
