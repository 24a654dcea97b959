// The accumulation bound of a dot product formed as moe_gemv_fp8.cu forms it (`gemv_fp8`),
// shared by test_moe_gemv.cpp and test_moe_mma.cpp (whose decode-sized fast cases the plan sends
// to it):
// - each 32-K block is one mma.sync m16n8k32 of e4m3 operands started from zero: its 32 exact
//   products are summed by the tensor core, which aligns them to the largest exponent among them
//   and keeps 13 fraction bits below it (the model of test_moe_mma.cpp's dot_fp8 for wgmma, the
//   ~14-bit accumulation of the DeepSeek-V3 report): each term loses less than 2^-13 M_j, M_j the
//   block's largest magnitude, so the block sum is off by less than 32 x 2^-13 M_j;
// - the block sum is added to the f32 accumulator by one fmaf with the product of the two
//   power-of-two scales (exact: >= 2^-143): one rounding, 2^-24 of the running sum's magnitude,
//   or half the subnormal spacing (2^-150) where the result is subnormal (E8M0 0 scales).
// Magnitudes are those of the exact values plus their possible deviation dx, scaled by 1.01 for
// the partials' own drift.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace dil::test {

struct Fp8MmaDot {
  double sum = 0, bound = 0;
};
inline Fp8MmaDot dot_fp8_mma32(const float* x, const double* dx, const float* w, int64_t K) {
  Fp8MmaDot r;
  double P = 0, D = 0, err = 0;
  for (int64_t s0 = 0; s0 < K; s0 += 32) {
    double m = 0;
    for (int64_t k = s0; k < std::min(K, s0 + 32); ++k) {
      const double ex = dx ? dx[k] : 0.0;
      m = std::max(m, (std::fabs(double(x[k])) + ex) * std::fabs(double(w[k])));
      P += double(x[k]) * w[k];
      D += ex * std::fabs(double(w[k]));
    }
    err += 32.0 * 0x1p-13 * 1.01 * m;
    err += 0x1p-24 * (std::fabs(P) + D + err) + 0x1p-150;
  }
  r.sum = P;
  r.bound = D + err;
  return r;
}

}  // namespace dil::test
