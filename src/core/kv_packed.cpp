#include "core/kv_packed.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/dtype.h"

namespace dil::kvpack {
namespace {

// ue8m0 byte of a power of two s (normal: every s the formulas make is >= 2^-126).
uint8_t ue8m0_of(float s) { return uint8_t((f32_to_bits(s) >> 23) & 0xff); }

// e4m3 codes of x[0, n) with a power-of-two scale per block of B: the act_quant formula.
void pack_fp8(const float* x, int n, int B, uint8_t* q, uint8_t* scales) {
  constexpr float kInv448 = 1.0f / 448.0f;
  for (int b0 = 0; b0 < n; b0 += B) {
    const int b1 = std::min(n, b0 + B);
    float amax = 0.0f;
    for (int i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(x[i]));
    amax = std::max(amax, 1e-4f);
    const float s = pow2_ceil(amax * kInv448);
    scales[b0 / B] = ue8m0_of(s);
    for (int i = b0; i < b1; ++i) q[i] = f32_to_e4m3(std::clamp(x[i] / s, -448.0f, 448.0f));
  }
}

// e2m1 nibbles of x[0, n) (n even, B | n) and one scale byte per block: fp4_qdq's formulas.
void pack_fp4(const float* x, int n, int B, bool e4m3_scale, uint8_t* q, uint8_t* scales) {
  constexpr float kInv6 = 1.0f / 6.0f;
  const float floor_e8m0 = std::ldexp(6.0f, -126), floor_e4m3 = std::ldexp(6.0f, -9);
  for (int b0 = 0; b0 < n; b0 += B) {
    float amax = 0.0f;
    for (int i = b0; i < b0 + B; ++i) amax = std::max(amax, std::fabs(x[i]));
    float s;
    if (e4m3_scale) {
      s = round_e4m3(std::min(std::max(amax, floor_e4m3) / 6.0f, 448.0f));
      scales[b0 / B] = f32_to_e4m3(s);
    } else {
      s = pow2_ceil(std::max(amax, floor_e8m0) * kInv6);
      scales[b0 / B] = ue8m0_of(s);
    }
    for (int i = b0; i < b0 + B; i += 2) {
      const uint8_t lo = f32_to_e2m1(std::clamp(x[i] / s, -6.0f, 6.0f));
      const uint8_t hi = f32_to_e2m1(std::clamp(x[i + 1] / s, -6.0f, 6.0f));
      q[i / 2] = uint8_t(lo | (hi << 4));
    }
  }
}

void check_shape(const RowShape& s) {
  switch (s.format) {
    case Format::V4Row:
      DIL_CHECK(s.rope >= 0 && s.rope < s.d && (s.d - s.rope) % 64 == 0, "V4Row: nope ", s.d - s.rope,
                " not a multiple of 64");
      return;
    case Format::Fp8B32:
    case Format::Fp4B32: DIL_CHECK(s.d > 0 && s.d % 32 == 0 && s.rope == 0, "width ", s.d, " not a multiple of 32"); return;
    case Format::Fp4E4m3B16: DIL_CHECK(s.d > 0 && s.d % 16 == 0 && s.rope == 0, "width ", s.d, " not a multiple of 16"); return;
  }
}

}  // namespace

size_t row_bytes(const RowShape& s) {
  check_shape(s);
  const size_t d = size_t(s.d);
  switch (s.format) {
    case Format::V4Row: {
      const size_t nope = d - size_t(s.rope);
      return (nope + 2 * size_t(s.rope) + nope / 64 + 7) / 8 * 8;
    }
    case Format::Fp8B32: return d + d / 32;
    case Format::Fp4E4m3B16: return d / 2 + d / 16;
    case Format::Fp4B32: return d / 2 + d / 32;
  }
  return 0;
}

void pack_row(const RowShape& s, const float* x, uint8_t* row) {
  const size_t n = row_bytes(s);
  std::memset(row, 0, n);
  const int d = s.d;
  switch (s.format) {
    case Format::V4Row: {
      const int nope = d - s.rope;
      pack_fp8(x, nope, 64, row, row + nope + 2 * s.rope);
      for (int i = 0; i < s.rope; ++i) {
        const uint16_t h = f32_to_bf16(x[nope + i]);
        std::memcpy(row + nope + 2 * i, &h, 2);
      }
      return;
    }
    case Format::Fp8B32: pack_fp8(x, d, 32, row, row + d); return;
    case Format::Fp4E4m3B16: pack_fp4(x, d, 16, true, row, row + d / 2); return;
    case Format::Fp4B32: pack_fp4(x, d, 32, false, row, row + d / 2); return;
  }
}

float unpack_value(const RowShape& s, const uint8_t* row, int c) {
  const int d = s.d;
  switch (s.format) {
    case Format::V4Row: {
      const int nope = d - s.rope;
      if (c >= nope) {
        uint16_t h;
        std::memcpy(&h, row + nope + 2 * (c - nope), 2);
        return bf16_to_f32(h);
      }
      return e4m3_to_f32(row[c]) * e8m0_to_f32(row[nope + 2 * s.rope + c / 64]);
    }
    case Format::Fp8B32: return e4m3_to_f32(row[c]) * e8m0_to_f32(row[d + c / 32]);
    case Format::Fp4E4m3B16:
    case Format::Fp4B32: {
      const uint8_t nib = uint8_t(c & 1 ? row[c / 2] >> 4 : row[c / 2] & 0xf);
      const uint8_t sb = row[d / 2 + c / (s.format == Format::Fp4B32 ? 32 : 16)];
      return e2m1_to_f32(nib) * (s.format == Format::Fp4B32 ? e8m0_to_f32(sb) : e4m3_to_f32(sb));
    }
  }
  return 0.0f;
}

void unpack_row(const RowShape& s, const uint8_t* row, float* x) {
  check_shape(s);
  for (int c = 0; c < s.d; ++c) x[c] = unpack_value(s, row, c);
}

}  // namespace dil::kvpack
