// FP8 act quant, FP4 QDQ and Hadamard of the CPU reference against model-spec §3.1, with
// reference roundings re-derived here by exhaustive search over the code tables.
#include <gtest/gtest.h>

#include "kernels/cpu/cpu_backend.h"
#include "test_util.h"

namespace dil {
namespace {

using test::nearest_e2m1;
using test::nearest_e4m3;
using test::pow2_at_least;
using test::ref_act_quant;
using test::view;

TEST(ActQuant, ScaleAtExactPowerOfTwoTimes448) {
  CpuBackend be;
  // amax = 896 = 448 * 2 -> s = 2: the max maps to the top code 448 (no clamp needed), and
  // 0.01 / 2 = 0.005 lands in the e4m3 subnormals: 2.56 * 2^-9 -> 3 * 2^-9 -> 0.01171875.
  std::vector<float> x = test::random_vec(128, 1, 100.0f);
  x[0] = 896.0f;
  x[1] = 0.01f;
  x[2] = 3.3f;  // 1.65 -> 1.625 (step 1/8 in [1, 2)) -> 3.25
  std::vector<float> y = x;
  be.fp8_qdq(view(y, {1, 128}), 128, 128);
  EXPECT_EQ(y[0], 896.0f);
  EXPECT_EQ(y[1], 0.01171875f);
  EXPECT_EQ(y[2], 3.25f);
  EXPECT_TRUE(test::same_bits(y, ref_act_quant(x, 128, 128, 128)));
  // One ulp above 896 -> s = 4: 0.01 / 4 = 0.0025 -> 1.28 * 2^-9 -> 2^-9 -> 0.0078125.
  x[0] = std::nextafter(896.0f, 1e9f);
  y = x;
  be.fp8_qdq(view(y, {1, 128}), 128, 128);
  EXPECT_EQ(y[1], 0.0078125f);
  EXPECT_EQ(y[0], 896.0f);  // 224.00002 -> 224
  EXPECT_TRUE(test::same_bits(y, ref_act_quant(x, 128, 128, 128)));
}

TEST(ActQuant, FloorAt1em4) {
  CpuBackend be;
  // All |x| < 1e-4: amax is floored to 1e-4, s = 2^ceil(log2(1e-4/448)) = 2^-22;
  // 3e-5 / 2^-22 = 125.8 -> 128 (step 8 in [64, 128)) -> 2^-15.
  std::vector<float> x = test::random_vec(64, 2, 5e-5f);
  x[5] = 3e-5f;
  std::vector<float> y = x;
  be.fp8_qdq(view(y, {1, 64}), 64, 64);
  EXPECT_EQ(y[5], std::ldexp(1.0f, -15));
  EXPECT_TRUE(test::same_bits(y, ref_act_quant(x, 64, 64, 64)));
}

TEST(ActQuant, Blocks64And128RaggedAndPartialColumns) {
  CpuBackend be;
  const int64_t R = 3, d = 160;
  std::vector<float> x = test::random_vec(R * d, 3, 2.0f);
  for (int64_t r = 0; r < R; ++r) {
    x[r * d + 70 + r] = 90.0f + r;  // a large value in block 1 of 64
    x[r * d + 3] = 0.0031f;  // s = 2^-7: 0.397 -> 0.40625; s = 2^-2 (with the 90): 6.35 * 2^-9 -> 6 * 2^-9
  }
  for (int block : {64, 128}) {
    for (int64_t cols : {int64_t(160), int64_t(100), int64_t(128)}) {
      std::vector<float> y = x;
      be.fp8_qdq(view(y, {R, d}), int(cols), block);
      EXPECT_TRUE(test::same_bits(y, ref_act_quant(x, d, cols, block))) << "block " << block << " cols " << cols;
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = cols; c < d; ++c) EXPECT_EQ(y[r * d + c], x[r * d + c]);  // untouched
    }
  }
  // The block size matters: column 0 shares its block with the 90 only when block = 128.
  std::vector<float> a = x, b = x;
  be.fp8_qdq(view(a, {R, d}), 128, 64);
  be.fp8_qdq(view(b, {R, d}), 128, 128);
  EXPECT_FALSE(test::same_bits(a, b));
  // Ragged block: columns [128, 160) with block 64 use the amax of their own 32 elements.
  std::vector<float> c = x;
  c[150] = 40.0f;
  std::vector<float> ref = ref_act_quant(c, d, d, 64);
  be.fp8_qdq(view(c, {R, d}), int(d), 64);
  EXPECT_TRUE(test::same_bits(c, ref));
}

TEST(Fp4Qdq, E8m0ScaleAndTies) {
  CpuBackend be;
  // amax 6 -> s = 1 (6 * fp32(1/6) rounds to 1): the values are the e2m1 grid and its ties.
  const std::vector<float> in = {6.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f,
                                 -0.75f, -2.5f, 0.3f, -5.5f, 2.9f, 1.1f, -0.2f, 4.4f};
  const std::vector<float> want = {6.0f, 0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f,
                                   -1.0f, -2.0f, 0.5f, -6.0f, 3.0f, 1.0f, -0.0f, 4.0f};
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[i] = in[i % 16];
  be.fp4_qdq(view(x, {1, 32}), 32, false);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(x[i], want[i % 16]) << i;
  // Scaled by 2^-3: amax 0.75 -> s = 2^-3, same codes.
  for (int i = 0; i < 32; ++i) x[i] = in[i % 16] / 8.0f;
  be.fp4_qdq(view(x, {1, 32}), 32, false);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(x[i], want[i % 16] / 8.0f) << i;
  // Random rows against the formula (amax floor 6*2^-126, s = 2^ceil(log2(amax * fp32(1/6)))).
  std::vector<float> r = test::random_vec(4 * 64, 4, 3.0f);
  std::vector<float> ref = r;
  for (size_t b = 0; b < r.size() / 32; ++b) {
    float amax = std::ldexp(6.0f, -126);
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(r[b * 32 + i]));
    const float s = pow2_at_least(float(double(amax) * double(1.0f / 6.0f)));
    for (int i = 0; i < 32; ++i) ref[b * 32 + i] = nearest_e2m1(std::clamp(r[b * 32 + i] / s, -6.0f, 6.0f)) * s;
  }
  be.fp4_qdq(view(r, {4, 64}), 32, false);
  EXPECT_TRUE(test::same_bits(r, ref));
}

TEST(Fp4Qdq, E4m3ScaleAndFloor) {
  CpuBackend be;
  // amax 7.8 -> s = e4m3(7.8/6 = 1.3) = 1.25; 7.8/1.25 = 6.24 -> clamp 6 -> 7.5;
  // 3.125/1.25 = 2.5 -> tie -> 2 -> 2.5; 0.9375/1.25 = 0.75 -> tie -> 1 -> 1.25.
  std::vector<float> x = test::random_vec(16, 5, 1.0f);
  x[0] = 7.8f;
  x[1] = 3.125f;
  x[2] = 0.9375f;
  std::vector<float> ref = x;
  const float s = nearest_e4m3(std::min(7.8f / 6.0f, 448.0f));
  ASSERT_EQ(s, 1.25f);
  for (auto& v : ref) v = nearest_e2m1(std::clamp(v / s, -6.0f, 6.0f)) * s;
  be.fp4_qdq(view(x, {1, 16}), 16, true);
  EXPECT_EQ(x[0], 7.5f);
  EXPECT_EQ(x[1], 2.5f);
  EXPECT_EQ(x[2], 1.25f);
  EXPECT_TRUE(test::same_bits(x, ref));
  // Tiny block: amax floored to 6*2^-9 -> s = 2^-9; 1.6e-3 / 2^-9 = 0.82 -> 1 -> 2^-9.
  std::vector<float> t = test::random_vec(16, 6, 1e-4f);
  t[3] = 1.6e-3f;
  be.fp4_qdq(view(t, {1, 16}), 16, true);
  EXPECT_EQ(t[3], std::ldexp(1.0f, -9));
  for (int i = 0; i < 16; ++i) {
    if (i == 3) continue;
    EXPECT_EQ(std::fabs(t[i]), 0.0f) << i;  // |x| <= 1e-4 -> below 0.25 * 2^-9
  }
}

TEST(Hadamard, HandExampleAndOrthogonality) {
  CpuBackend be;
  // x @ H4 = [1+2+3+4, 1-2+3-4, 1+2-3-4, 1-2-3+4] = [10, -2, -4, 0]; times 4^-0.5.
  std::vector<float> x = {1, 2, 3, 4};
  be.hadamard(view(x, {1, 4}));
  EXPECT_EQ(x, (std::vector<float>{5, -1, -2, 0}));
  // Rows of the identity give H/sqrt(d); (H/sqrt d)(H/sqrt d)^T = I, entries +-d^-0.5 with
  // the sign (-1)^popcount(i&j).
  const int d = 16;
  std::vector<float> e(d * d, 0.0f);
  for (int i = 0; i < d; ++i) e[i * d + i] = 1.0f;
  be.hadamard(view(e, {d, d}));
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) {
      EXPECT_EQ(e[i * d + j], (__builtin_popcount(i & j) % 2 ? -0.25f : 0.25f));
      double dot = 0;
      for (int k = 0; k < d; ++k) dot += double(e[i * d + k]) * e[j * d + k];
      EXPECT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-12);
    }
  // A random 128-vector against the direct matrix product in double.
  std::vector<float> r = test::random_vec(2 * 128, 7, 4.0f), y = r;
  be.hadamard(view(y, {2, 128}));
  for (int row = 0; row < 2; ++row)
    for (int j = 0; j < 128; ++j) {
      double acc = 0;
      for (int i = 0; i < 128; ++i) acc += (__builtin_popcount(i & j) % 2 ? -1.0 : 1.0) * r[row * 128 + i];
      EXPECT_EQ(y[row * 128 + j], float(acc * std::pow(128.0, -0.5)));
    }
}

}  // namespace
}  // namespace dil
