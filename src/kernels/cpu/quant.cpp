// Quantize-dequantize simulations of the official kernels (model-spec §3.1): FP8 act_quant
// (ue8m0 scales), FP4 fp4_act_quant (E8M0 or E4M3 scales), and the Hadamard rotation.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"

namespace dil {
namespace cpu {

// amax = max(max|x_blk|, 1e-4f); s = pow2_ceil(amax * (1.0f/448.0f)) (fp32 multiply by the
// fp32 constant, as the official kernel; not a division); q = e4m3_RNE(clamp(x/s, +-448));
// x <- q*s. x/s and q*s are exact up to subnormals since s is a power of two.
void act_quant_qdq(float* x, int64_t n, int block) {
  DIL_CHECK(block > 0, "act_quant: block ", block);
  constexpr float kInv448 = 1.0f / 448.0f;
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    const int64_t b1 = std::min<int64_t>(n, b0 + block);
    float amax = 0.0f;
    for (int64_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(x[i]));
    amax = std::max(amax, 1e-4f);
    const float s = pow2_ceil(amax * kInv448);
    for (int64_t i = b0; i < b1; ++i) {
      const float v = std::clamp(x[i] / s, -448.0f, 448.0f);
      x[i] = round_e4m3(v) * s;
    }
  }
}

}  // namespace cpu

// x [R, d] f32|bf16 (any shape; rows = numel / last dim): per row, columns [0, cols) go
// through act_quant_qdq in blocks of `block`; columns >= cols are untouched. The QDQ'd values
// (e4m3 times a power of two) are exact in bf16.
void CpuBackend::fp8_qdq(Tensor x0, int cols, int block) {
  cpu::Staged sx(x0, "fp8_qdq", true);
  Tensor& x = sx.t;
  const int64_t d = cpu::last_dim(x), R = cpu::n_rows(x);
  DIL_CHECK(cols >= 0 && cols <= d, "fp8_qdq: cols ", cols, " for width ", d);
  float* p = x.ptr<float>();
  for (int64_t r = 0; r < R; ++r) cpu::act_quant_qdq(p + r * d, cols, block);
}

// x [R, d] f32|bf16, d % block == 0. Per block of `block` elements of a row (the results,
// e2m1 times a scale of at most 4 significant bits, are exact in bf16):
//   E8M0 form:  amax = max(max|x|, 6*2^-126); s = pow2_ceil(amax * (1.0f/6.0f));
//   E4M3 form:  amax = max(max|x|, 6*2^-9);   s = e4m3_RNE(min(amax / 6.0f, 448)) (fp32 division);
//   q = e2m1_RNE(clamp(x/s, -6, 6)) (ties to the even code); x <- q*s.
void CpuBackend::fp4_qdq(Tensor x0, int block, bool e4m3_scale) {
  cpu::Staged sx(x0, "fp4_qdq", true);
  Tensor& x = sx.t;
  const int64_t d = cpu::last_dim(x), n = x.numel();
  DIL_CHECK(block > 0 && d % block == 0, "fp4_qdq: width ", d, " not a multiple of block ", block);
  constexpr float kInv6 = 1.0f / 6.0f;
  const float floor_e8m0 = std::ldexp(6.0f, -126), floor_e4m3 = std::ldexp(6.0f, -9);
  float* p = x.ptr<float>();
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    float amax = 0.0f;
    for (int64_t i = b0; i < b0 + block; ++i) amax = std::max(amax, std::fabs(p[i]));
    float s;
    if (e4m3_scale) {
      amax = std::max(amax, floor_e4m3);
      s = round_e4m3(std::min(amax / 6.0f, 448.0f));
    } else {
      amax = std::max(amax, floor_e8m0);
      s = pow2_ceil(amax * kInv6);
    }
    for (int64_t i = b0; i < b0 + block; ++i) p[i] = round_e2m1(std::clamp(p[i] / s, -6.0f, 6.0f)) * s;
  }
}

// x [R, d] f32|bf16, d a power of two: y = (x @ H_d) * d^-0.5 with the Sylvester matrix
// H[i][j] = (-1)^popcount(i & j), via the in-place fast Walsh-Hadamard butterflies in double,
// scaled by pow(d, -0.5) in double and rounded once to f32 (then to x's dtype).
void CpuBackend::hadamard(Tensor x0) {
  cpu::Staged sx(x0, "hadamard", true);
  Tensor& x = sx.t;
  const int64_t d = cpu::last_dim(x), R = cpu::n_rows(x);
  DIL_CHECK(d > 0 && (d & (d - 1)) == 0, "hadamard: width ", d, " is not a power of two");
  const double scale = std::pow(double(d), -0.5);
  std::vector<double> y(static_cast<size_t>(d));  // [d]
  float* p = x.ptr<float>();
  for (int64_t r = 0; r < R; ++r) {
    float* row = p + r * d;
    for (int64_t i = 0; i < d; ++i) y[i] = row[i];
    for (int64_t h = 1; h < d; h *= 2)
      for (int64_t i = 0; i < d; i += 2 * h)
        for (int64_t j = i; j < i + h; ++j) {
          const double a = y[j], b = y[j + h];
          y[j] = a + b;
          y[j + h] = a - b;
        }
    for (int64_t i = 0; i < d; ++i) row[i] = float(y[i] * scale);
  }
}

}  // namespace dil
