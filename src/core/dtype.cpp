#include "core/dtype.h"

namespace dil {

namespace {
struct Entry { DType t; const char* name; size_t size; };
constexpr Entry kTypes[] = {
    {DType::F32, "F32", 4},     {DType::F64, "F64", 8},   {DType::BF16, "BF16", 2},
    {DType::F16, "F16", 2},     {DType::F8E4M3, "F8_E4M3", 1}, {DType::E8M0, "F8_E8M0", 1},
    {DType::I8, "I8", 1},       {DType::U8, "U8", 1},     {DType::I32, "I32", 4},
    {DType::I64, "I64", 8},     {DType::Bool, "BOOL", 1},
};
}  // namespace

size_t dtype_size(DType t) { return kTypes[size_t(t)].size; }
std::string_view dtype_name(DType t) { return kTypes[size_t(t)].name; }
bool dtype_from_name(std::string_view s, DType* out) {
  for (const auto& e : kTypes)
    if (s == e.name) { *out = e.t; return true; }
  return false;
}

float e4m3_to_f32(uint8_t v) {
  int sign = v >> 7, exp = (v >> 3) & 0xf, man = v & 7;
  if (exp == 0xf && man == 7) return std::nanf("");
  float mag = exp == 0 ? std::ldexp(float(man), -9) : std::ldexp(1.0f + man / 8.0f, exp - 7);
  return sign ? -mag : mag;
}

uint8_t f32_to_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // saturate
  // Find the quantum of the binade: normals have 3 mantissa bits, subnormals step 2^-9.
  int e;
  std::frexp(a, &e);          // a = m * 2^e, m in [0.5,1)
  int unbiased = e - 1;       // a in [2^unbiased, 2^(unbiased+1))
  if (unbiased < -6) unbiased = -6;
  float quantum = std::ldexp(1.0f, unbiased - 3);
  float q = std::nearbyint(a / quantum) * quantum;  // default rounding mode: ties to even
  // Encode q exactly.
  if (q == 0.0f) return sign;
  int qe;
  float qm = std::frexp(q, &qe);
  int ub = qe - 1;
  if (ub < -6) {  // subnormal
    int man = int(std::lround(q / std::ldexp(1.0f, -9)));
    return sign | uint8_t(man);
  }
  int man = int(std::lround((qm * 2.0f - 1.0f) * 8.0f));
  return sign | uint8_t(((ub + 7) << 3) | man);
}

uint8_t f32_to_e2m1(float v) {
  uint8_t sign = std::signbit(v) ? 8 : 0;
  float a = std::fabs(v);
  float r;
  if (a < 2.0f) r = std::nearbyint(a * 2.0f) / 2.0f;
  else if (a < 4.0f) r = std::nearbyint(a);
  else r = std::nearbyint(a / 2.0f) * 2.0f;
  if (r > 6.0f) r = 6.0f;
  static constexpr float kMag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  uint8_t code = 0;
  for (uint8_t c = 0; c < 8; ++c)
    if (kMag[c] == r) code = c;
  return sign | code;
}

float pow2_ceil(float v) {
  uint32_t b = f32_to_bits(v);
  int exp = int((b >> 23) & 0xff) - 127;
  if (b & 0x7fffffu) exp += 1;
  return std::ldexp(1.0f, exp);
}

}  // namespace dil
