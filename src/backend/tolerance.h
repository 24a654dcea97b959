// A kernel implementation's tolerance against the CPU reference of the same numerics, in
// machine-readable form (docs/kernels.md "How parity is measured"): the registries declare one
// per implementation (backend/plan.h KernelImpl), docs/kernels.md prints text(), and
// `deepinfer-lab trace` (src/trace) checks every op of a model run against it.
#pragma once
#include <string>

namespace dil {

struct Tolerance {
  // Float outputs, `got` against the reference `ref`: ||got - ref|| / ||ref|| <= rel, and every
  // element |got - ref| <= abs * max(1, max|ref|) (with abs_vs_rows: max(1, max|rows|), below).
  // rel = abs = 0: bit-identical. Index outputs (top-k, routed experts) and recurrent state
  // (rings, paged rows, compressor state) are bit-identical in every implementation.
  double rel = 0, abs = 0;
  // The implementation writes bf16 outputs in fast numerics: each side rounds its own f32
  // result once, so a bf16 comparison allows one bf16 ulp more per element and
  // rel + 2 sqrt(rel * 2^-7) in L2 (docs/kernels.md; applied to every bf16 comparison with a
  // non-exact bound, the flag documents it).
  bool bf16_ulp = false;
  // abs is relative to max(1, max|rows|) over the rows the op reads (attention: the KV rows),
  // for outputs that are convex combinations of those rows: |out| <= max|rows|.
  bool abs_vs_rows = false;
  // The CPU reference itself (docs: "the specification"): exact against itself.
  bool reference = false;
  // A per-element bound evaluated from the data is derived and checked in this test; rel / abs
  // are then its conservative numeric form (docs/kernels.md, "Numeric forms of the derived
  // bounds").
  std::string derived;
  // What the numbers come from, printed in parentheses by text().
  std::string note;

  bool exact() const { return rel == 0 && abs == 0; }
  // docs/kernels.md's wording: "exact", "rel 2e-3 / abs 2e-2 (note), + one bf16 ulp of a bf16
  // output", "per-element bound derived in X (note); as numbers: rel ... / abs ...".
  std::string text() const;
  // One short cell for tables: "exact", "2e-3/2e-2", "1e-2/7.8e-3 rows".
  std::string brief() const;
};

Tolerance exact_tolerance(std::string note = {});
Tolerance tolerance(double rel, double abs, bool bf16_ulp = false, std::string note = {});
// Two results each within their tolerance of one reference are within the sum of each other
// (triangle inequality, per element and in L2).
Tolerance combine(const Tolerance& a, const Tolerance& b);
// 2e-3 -> "2e-3", 1.2e-7 -> "1.2e-7", 0.0078125 -> "7.8e-3" (three significant digits at most).
std::string format_number(double v);

}  // namespace dil
