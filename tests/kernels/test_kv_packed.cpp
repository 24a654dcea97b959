// The official packed KV row formats (core/kv_packed.h) against the QDQ ops the model applies
// to these rows (CpuBackend::fp8_qdq / fp4_qdq): unpack(pack(x)) must be the QDQ'd row bit for
// bit (no tolerance: the formats store exactly the codes and scales the QDQ computes, and the
// dequantized product q * s is exact in f32), the rope dims of a V4 row its bf16 rounding, the
// byte counts those of model/kv_layout.h, and a dequantized row must re-pack to the same
// values (a row re-written from its dequantized form, e.g. by randomize_cache, is unchanged).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/kv_packed.h"
#include "kernels/cpu/cpu_backend.h"
#include "test_util.h"

namespace dil {
namespace {

using kvpack::Format;
using kvpack::RowShape;

// Rows with a wide spread of magnitudes per block (exercises every exponent of the scales, the
// amax floors, the subnormal codes and the clamps), plus exact zeros and negative zeros.
std::vector<float> spread_rows(int rows, int d, uint32_t seed) {
  std::vector<float> x = test::random_vec(size_t(rows) * size_t(d), seed, 1.0f);
  for (size_t i = 0; i < x.size(); ++i) {
    const int e = int((i * 2654435761u + seed) % 40) - 30;  // 2^-30 .. 2^9
    x[i] = std::ldexp(x[i], e);
  }
  x[3] = 0.0f;
  x[5] = -0.0f;
  for (int i = 0; i < d; ++i) x[size_t(d) + size_t(i)] = std::ldexp(x[size_t(d) + size_t(i)], -40);  // below every floor
  return x;
}

std::vector<float> round_trip(const RowShape& s, const std::vector<float>& x, int rows) {
  const size_t nb = kvpack::row_bytes(s);
  std::vector<uint8_t> packed(nb * size_t(rows), 0xab);
  std::vector<float> y(x.size());
  for (int r = 0; r < rows; ++r) {
    kvpack::pack_row(s, x.data() + size_t(r) * size_t(s.d), packed.data() + size_t(r) * nb);
    kvpack::unpack_row(s, packed.data() + size_t(r) * nb, y.data() + size_t(r) * size_t(s.d));
    // Re-packing the dequantized row keeps its values (not always its bytes: a block whose
    // amax rounded down to half a power of two re-packs with half the scale and twice the codes).
    std::vector<uint8_t> again(nb);
    std::vector<float> y2(size_t(s.d));
    kvpack::pack_row(s, y.data() + size_t(r) * size_t(s.d), again.data());
    kvpack::unpack_row(s, again.data(), y2.data());
    EXPECT_TRUE(test::same_bits(y2, std::vector<float>(y.begin() + r * s.d, y.begin() + (r + 1) * s.d))) << "row " << r;
    for (int c = 0; c < s.d; c += 37)
      EXPECT_EQ(f32_to_bits(kvpack::unpack_value(s, packed.data() + size_t(r) * nb, c)),
                f32_to_bits(y[size_t(r) * size_t(s.d) + size_t(c)]));
  }
  return y;
}

TEST(KvPacked, RowBytesAreTheOfficialOnes) {
  EXPECT_EQ(kvpack::row_bytes({Format::V4Row, 512, 64}), 584u);
  EXPECT_EQ(kvpack::row_bytes({Format::Fp8B32, 512, 0}), 528u);
  EXPECT_EQ(kvpack::row_bytes({Format::Fp4E4m3B16, 512, 0}), 288u);
  EXPECT_EQ(kvpack::row_bytes({Format::Fp4B32, 128, 0}), 68u);
}

TEST(KvPacked, V4RowIsFp8QdqOfTheNopeDimsAndBf16Rope) {
  CpuBackend be;
  const int R = 9, d = 512, rope = 64;
  std::vector<float> x = spread_rows(R, d, 11);
  std::vector<float> want = x;
  be.fp8_qdq(test::view(want, {R, d}), d - rope, 64);
  for (int r = 0; r < R; ++r)
    for (int c = d - rope; c < d; ++c) want[size_t(r * d + c)] = round_bf16(want[size_t(r * d + c)]);
  EXPECT_TRUE(test::same_bits(round_trip({Format::V4Row, d, rope}, x, R), want));
}

TEST(KvPacked, V41SwaRowIsFp8QdqInBlocksOf32) {
  CpuBackend be;
  const int R = 9, d = 512;
  std::vector<float> x = spread_rows(R, d, 12);
  std::vector<float> want = x;
  be.fp8_qdq(test::view(want, {R, d}), d, 32);
  EXPECT_TRUE(test::same_bits(round_trip({Format::Fp8B32, d, 0}, x, R), want));
}

TEST(KvPacked, V41MainKvIsFp4QdqWithE4m3ScalesPer16) {
  CpuBackend be;
  const int R = 9, d = 512;
  std::vector<float> x = spread_rows(R, d, 13);
  std::vector<float> want = x;
  be.fp4_qdq(test::view(want, {R, d}), 16, true);
  EXPECT_TRUE(test::same_bits(round_trip({Format::Fp4E4m3B16, d, 0}, x, R), want));
}

TEST(KvPacked, IndexerKeysAreFp4QdqWithUe8m0ScalesPer32) {
  CpuBackend be;
  const int R = 9, d = 128;
  std::vector<float> x = spread_rows(R, d, 14);
  std::vector<float> want = x;
  be.fp4_qdq(test::view(want, {R, d}), 32, false);
  EXPECT_TRUE(test::same_bits(round_trip({Format::Fp4B32, d, 0}, x, R), want));
}

TEST(KvPacked, ByteOrderOfTheV4Row) {
  // dims 0..447 = 1.0 (scale 2^-8: amax 1 -> pow2_ceil(1/448) = 2^-8, code 256 = e4m3 0x78),
  // rope dims = 0.5 (bf16 0x3f00), pad 0.
  std::vector<float> x(512, 1.0f);
  for (int c = 448; c < 512; ++c) x[size_t(c)] = 0.5f;
  std::vector<uint8_t> row(584);
  kvpack::pack_row({Format::V4Row, 512, 64}, x.data(), row.data());
  for (int c = 0; c < 448; ++c) ASSERT_EQ(row[size_t(c)], 0x78) << c;
  for (int i = 0; i < 64; ++i) {
    ASSERT_EQ(row[size_t(448 + 2 * i)], 0x00);
    ASSERT_EQ(row[size_t(448 + 2 * i + 1)], 0x3f);
  }
  for (int b = 0; b < 7; ++b) ASSERT_EQ(row[size_t(576 + b)], 127 - 8);
  ASSERT_EQ(row[583], 0);
}

TEST(KvPacked, NibbleOrderOfFp4Rows) {
  // Block of 32 with amax 6 -> ue8m0 scale 1 (byte 127); dim 0 = 1 (code 2), dim 1 = -6 (code 0xf).
  std::vector<float> x(128, 0.0f);
  x[0] = 1.0f;
  x[1] = -6.0f;
  std::vector<uint8_t> row(68);
  kvpack::pack_row({Format::Fp4B32, 128, 0}, x.data(), row.data());
  EXPECT_EQ(row[0], 0xf2);
  EXPECT_EQ(row[64], 127);
}

}  // namespace
}  // namespace dil
