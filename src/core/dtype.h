// Element types and the scalar codecs of DeepSeek's checkpoint formats (model-spec §2.1).
// Pure host code, no CUDA headers; the CUDA kernels have their own device versions that the
// parity tests compare with these.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace dil {

enum class DType : uint8_t { F32, F64, BF16, F16, F8E4M3, E8M0, I8, U8, I32, I64, Bool };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);                 // safetensors spelling: "F32", "F8_E4M3", ...
bool dtype_from_name(std::string_view s, DType* out);  // false when unknown

inline float bits_to_f32(uint32_t b) { float f; std::memcpy(&f, &b, 4); return f; }
inline uint32_t f32_to_bits(float f) { uint32_t b; std::memcpy(&b, &f, 4); return b; }

inline float bf16_to_f32(uint16_t h) { return bits_to_f32(uint32_t(h) << 16); }
// Round to nearest even, NaN preserved.
inline uint16_t f32_to_bf16(float f) {
  uint32_t b = f32_to_bits(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return uint16_t((b >> 16) | 0x40);
  b += 0x7fffu + ((b >> 16) & 1u);
  return uint16_t(b >> 16);
}
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// OCP e4m3fn: bias 7, no inf, 0x7f/0xff NaN, max 448, subnormal step 2^-9.
float e4m3_to_f32(uint8_t v);
// Round to nearest even with saturation to +-448 (what the quantizers do after clamping).
uint8_t f32_to_e4m3(float f);
inline float round_e4m3(float f) { return e4m3_to_f32(f32_to_e4m3(f)); }

// ue8m0 scale byte b -> 2^(b-127).
inline float e8m0_to_f32(uint8_t b) { return std::ldexp(1.0f, int(b) - 127); }

// FP4 e2m1 nibble: bit3 sign, magnitude table {0,.5,1,1.5,2,3,4,6}.
inline float e2m1_to_f32(uint8_t nib) {
  static constexpr float kMag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  float m = kMag[nib & 7];
  return (nib & 8) ? -m : m;
}
// Nearest e2m1 code of v (|v| <= 6 after clamping), ties to the even code:
// 0.25,1.25,2.5,5 round down; 0.75,1.75,3.5 round up.
uint8_t f32_to_e2m1(float v);
inline float round_e2m1(float v) { return e2m1_to_f32(f32_to_e2m1(v)); }

// 2^ceil(log2(v)) for v > 0, exact: the exponent of v, plus one if the mantissa is non-zero.
float pow2_ceil(float v);

}  // namespace dil
