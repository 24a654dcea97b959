// One output of A against the same output of B (trace.h Check), by the rule of docs/kernels.md
// "How parity is measured": rel_l2 = ||b - a|| / ||a||, every element |b - a| <= abs * scale,
// scale = max(1, max|a|) (or max(1, max|rows|), Tolerance::abs_vs_rows); bf16 comparisons allow
// one bf16 ulp more per element and rel + 2 sqrt(rel 2^-7) in L2 when the bound is not exact.
// Outputs of different dtypes (numerics modes) are compared in the narrower one: A's f32 values
// rounded to bf16 (RNE) against B's bf16, which is what B's mode stores for A's result.
#pragma once
#include <cstdint>
#include <vector>

#include "trace/hooks.h"

namespace dil::trace {

// Element values of a snapshot as f32, rounded to bf16 first when `as_bf16` (f32 or bf16).
std::vector<float> float_values(const Snapshot& s, bool as_bf16);
// `s`'s bytes in dtype `to` (f32 <-> bf16 for floats; same dtype: as is); *exact becomes false
// when a value changed (f32 -> bf16 rounding).
std::vector<uint8_t> convert(const Snapshot& s, DType to, bool* exact);
double max_abs_value(const Snapshot& s);

// Fills the figures and verdict of `c` (its gate and tol already set): B's output `b` against
// A's `a`. rows_scale: max|rows| of the op's inputs (abs_vs_rows bounds).
void compare(const Snapshot& a, const Snapshot& b, double rows_scale, Check* c);

// One unit in the last place of a bf16 value of magnitude v (8 significant bits).
double ulp_bf16(double v);

}  // namespace dil::trace
