#include "trace/compare.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace dil::trace {

double ulp_bf16(double v) {
  v = std::fabs(v);
  if (!(v > 0)) return std::ldexp(1.0, -133);
  int e;
  std::frexp(v, &e);  // v = m 2^e, m in [0.5, 1)
  return std::ldexp(1.0, std::max(e - 8, -133));
}

std::vector<float> float_values(const Snapshot& s, bool as_bf16) {
  const size_t n = size_t(s.numel());
  std::vector<float> v(n);
  if (s.dtype == DType::BF16) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(s.bytes.data());
    for (size_t i = 0; i < n; ++i) v[i] = bf16_to_f32(p[i]);
  } else {
    DIL_CHECK(s.dtype == DType::F32, "trace: float values of a ", dtype_name(s.dtype), " tensor ", s.name);
    std::memcpy(v.data(), s.bytes.data(), n * 4);
    if (as_bf16)
      for (float& f : v) f = round_bf16(f);
  }
  return v;
}

std::vector<uint8_t> convert(const Snapshot& s, DType to, bool* exact) {
  if (s.dtype == to) return s.bytes;
  const size_t n = size_t(s.numel());
  std::vector<uint8_t> out(n * dtype_size(to));
  if (s.dtype == DType::F32 && to == DType::BF16) {
    const float* p = reinterpret_cast<const float*>(s.bytes.data());
    uint16_t* q = reinterpret_cast<uint16_t*>(out.data());
    for (size_t i = 0; i < n; ++i) {
      q[i] = f32_to_bf16(p[i]);
      // NaN payloads aside, a value survives iff widening gives it back.
      if (f32_to_bits(bf16_to_f32(q[i])) != f32_to_bits(p[i])) *exact = false;
    }
    return out;
  }
  if (s.dtype == DType::BF16 && to == DType::F32) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(s.bytes.data());
    float* q = reinterpret_cast<float*>(out.data());
    for (size_t i = 0; i < n; ++i) q[i] = bf16_to_f32(p[i]);  // exact
    return out;
  }
  DIL_CHECK(false, "trace: ", s.name, " is ", dtype_name(s.dtype), " on A and ", dtype_name(to), " on B");
  return out;
}

double max_abs_value(const Snapshot& s) {
  if (s.dtype != DType::F32 && s.dtype != DType::BF16) return 0;
  double m = 0;
  for (float f : float_values(s, false))
    if (std::isfinite(f)) m = std::max(m, double(std::fabs(f)));
  return m;
}

namespace {

void compare_indices(const Snapshot& a, const Snapshot& b, Check* c) {
  const int32_t* pa = reinterpret_cast<const int32_t*>(a.bytes.data());
  const int32_t* pb = reinterpret_cast<const int32_t*>(b.bytes.data());
  c->indices = true;
  c->n = a.numel();
  for (int64_t i = 0; i < c->n; ++i) c->differ += pa[i] != pb[i];
  c->exact = c->differ == 0;
  c->bad = c->differ;
  c->ratio = c->exact ? 0 : std::numeric_limits<double>::infinity();
  c->ok = c->gate == "mode" || c->exact;
}

// Packed KV rows (U8): byte for byte (they are state, exact everywhere).
void compare_bytes(const Snapshot& a, const Snapshot& b, Check* c) {
  c->n = a.numel();
  for (int64_t i = 0; i < c->n; ++i) c->differ += a.bytes[size_t(i)] != b.bytes[size_t(i)];
  c->exact = c->differ == 0;
  c->bad = c->differ;
  c->ratio = c->exact ? 0 : std::numeric_limits<double>::infinity();
  c->ok = c->gate == "mode" || c->exact;
}

}  // namespace

void compare(const Snapshot& a, const Snapshot& b, double rows_scale, Check* c) {
  DIL_CHECK(a.numel() == b.numel(), "trace: ", a.name, " has ", a.numel(), " elements on A, ", b.numel(), " on B");
  if (a.dtype == DType::I32 || b.dtype == DType::I32) {
    DIL_CHECK(a.dtype == b.dtype, "trace: ", a.name, " is ", dtype_name(a.dtype), " on A, ", dtype_name(b.dtype), " on B");
    compare_indices(a, b, c);
    return;
  }
  if (a.dtype == DType::U8 || b.dtype == DType::U8) {
    DIL_CHECK(a.dtype == b.dtype, "trace: ", a.name, " is ", dtype_name(a.dtype), " on A, ", dtype_name(b.dtype), " on B");
    compare_bytes(a, b, c);
    return;
  }
  const bool bf16 = a.dtype == DType::BF16 || b.dtype == DType::BF16;
  c->bf16 = bf16;
  const std::vector<float> ref = float_values(a, bf16), got = float_values(b, bf16);
  c->n = int64_t(ref.size());
  for (float r : ref) c->max_ref = std::max(c->max_ref, double(std::fabs(r)));
  const Tolerance& t = c->tol;
  const bool exact = c->gate == "exact" || t.exact();
  const double scale = std::max(1.0, t.abs_vs_rows ? rows_scale : c->max_ref);
  const double l2_allowed = exact ? 0.0 : t.rel + (bf16 ? 2.0 * std::sqrt(t.rel * 0x1p-7) : 0.0);
  double num = 0, den = 0, worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const bool same = f32_to_bits(got[i]) == f32_to_bits(ref[i]);
    den += double(ref[i]) * ref[i];
    if (same) continue;
    ++c->differ;
    if (!std::isfinite(got[i]) || !std::isfinite(ref[i])) {
      ++c->bad;
      worst = std::numeric_limits<double>::infinity();
      continue;
    }
    const double d = std::fabs(double(got[i]) - double(ref[i]));
    c->max_abs = std::max(c->max_abs, d);
    num += d * d;
    const double allowed =
        exact ? 0.0 : t.abs * scale + (bf16 ? ulp_bf16(std::max(std::fabs(got[i]), std::fabs(ref[i]))) : 0.0);
    if (d > allowed) ++c->bad;
    worst = std::max(worst, allowed > 0 ? d / allowed : std::numeric_limits<double>::infinity());
  }
  c->rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  c->exact = c->differ == 0;
  if (l2_allowed > 0) worst = std::max(worst, c->rel_l2 / l2_allowed);
  else if (c->rel_l2 > 0) worst = std::numeric_limits<double>::infinity();
  c->ratio = worst;
  c->ok = c->gate == "mode" || (c->bad == 0 && c->rel_l2 <= l2_allowed);
}

}  // namespace dil::trace
