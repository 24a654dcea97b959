// Scalar codecs against model-spec §2.1 / §3.1.
#include <gtest/gtest.h>

#include "core/dtype.h"

using namespace dil;

TEST(DType, E4M3DecodeTable) {
  EXPECT_EQ(e4m3_to_f32(0x00), 0.0f);
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);          // exp 7, man 0
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);        // max
  EXPECT_EQ(e4m3_to_f32(0xfe), -448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xff)));
}

TEST(DType, E4M3RoundTripAllCodes) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    float v = e4m3_to_f32(uint8_t(c));
    if (v == 0.0f) continue;
    EXPECT_EQ(f32_to_e4m3(v), uint8_t(c)) << c;
  }
}

TEST(DType, E4M3RoundsToNearestEven) {
  // Between 1.0 (man 0) and 1.125 (man 1): the midpoint goes to the even mantissa (1.0).
  EXPECT_EQ(round_e4m3(1.0625f), 1.0f);
  // Between 1.125 and 1.25 the midpoint goes to 1.25 (man 2, even).
  EXPECT_EQ(round_e4m3(1.1875f), 1.25f);
  EXPECT_EQ(round_e4m3(500.0f), 448.0f);  // saturates
  EXPECT_EQ(round_e4m3(std::ldexp(1.5f, -10)), std::ldexp(1.0f, -9));  // 0.75 quanta -> 1
  EXPECT_EQ(round_e4m3(std::ldexp(1.0f, -10)), 0.0f);                // 0.5 quanta -> 0 (even)
}

TEST(DType, E8M0) {
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(130), 8.0f);
  EXPECT_EQ(e8m0_to_f32(120), std::ldexp(1.0f, -7));
}

TEST(DType, E2M1TableAndTies) {
  const float mags[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) EXPECT_EQ(e2m1_to_f32(uint8_t(c)), (c & 8 ? -1 : 1) * mags[c & 7]);
  // Ties to the even code: 0.25, 1.25, 2.5, 5 down; 0.75, 1.75, 3.5 up.
  EXPECT_EQ(round_e2m1(0.25f), 0.0f);
  EXPECT_EQ(round_e2m1(0.75f), 1.0f);
  EXPECT_EQ(round_e2m1(1.25f), 1.0f);
  EXPECT_EQ(round_e2m1(1.75f), 2.0f);
  EXPECT_EQ(round_e2m1(2.5f), 2.0f);
  EXPECT_EQ(round_e2m1(3.5f), 4.0f);
  EXPECT_EQ(round_e2m1(5.0f), 4.0f);
  EXPECT_EQ(round_e2m1(-3.5f), -4.0f);
  EXPECT_EQ(round_e2m1(5.5f), 6.0f);
  EXPECT_EQ(round_e2m1(0.2f), 0.0f);
}

TEST(DType, BF16RoundNearestEven) {
  EXPECT_EQ(round_bf16(1.0f), 1.0f);
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f808000u)), 0x3f80);  // tie -> even
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f818000u)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f808001u)), 0x3f81);
}

TEST(DType, Pow2Ceil) {
  EXPECT_EQ(pow2_ceil(1.0f), 1.0f);
  EXPECT_EQ(pow2_ceil(1.0001f), 2.0f);
  EXPECT_EQ(pow2_ceil(0.75f), 1.0f);
  EXPECT_EQ(pow2_ceil(0.5f), 0.5f);
  EXPECT_EQ(pow2_ceil(3.0f / 448.0f), 1.0f / 128.0f);
}
