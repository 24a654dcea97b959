#include "backend/tolerance.h"

#include <cmath>
#include <cstdio>

namespace dil {

std::string format_number(double v) {
  if (v == 0) return "0";
  const int e = int(std::floor(std::log10(std::fabs(v))));
  double m = v / std::pow(10.0, e);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2g", m);  // 1.2, 2, 7.8
  if (std::string(buf) == "10") return "1e" + std::to_string(e + 1);
  return std::string(buf) + "e" + std::to_string(e);
}

namespace {
const char* kUlp = ", + one bf16 ulp of a bf16 output";

std::string numbers(const Tolerance& t) {
  std::string s = "rel " + format_number(t.rel) + " / abs " + format_number(t.abs);
  if (t.abs_vs_rows) s += " of max(1, max|rows|)";
  return s;
}
}  // namespace

std::string Tolerance::text() const {
  if (reference) return "the specification";
  const std::string paren = note.empty() ? "" : " (" + note + ")";
  if (!derived.empty())
    return "per-element bound derived in " + derived + paren + "; as numbers: " + numbers(*this) +
           (bf16_ulp ? kUlp : "");
  if (exact()) return "exact" + paren;
  return numbers(*this) + paren + (bf16_ulp ? kUlp : "");
}

std::string Tolerance::brief() const {
  if (exact()) return "exact";
  std::string s = format_number(rel) + "/" + format_number(abs);
  if (abs_vs_rows) s += " rows";
  if (!derived.empty()) s += " (derived)";
  return s;
}

Tolerance exact_tolerance(std::string note) {
  Tolerance t;
  t.note = std::move(note);
  return t;
}

Tolerance tolerance(double rel, double abs, bool bf16_ulp, std::string note) {
  Tolerance t;
  t.rel = rel;
  t.abs = abs;
  t.bf16_ulp = bf16_ulp;
  t.note = std::move(note);
  return t;
}

Tolerance combine(const Tolerance& a, const Tolerance& b) {
  Tolerance t;
  t.rel = a.rel + b.rel;
  t.abs = a.abs + b.abs;
  t.bf16_ulp = a.bf16_ulp || b.bf16_ulp;
  // Relative to the rows when either is: such outputs have |out| <= max|rows|, so the other
  // side's bound relative to max(1, max|out|) is also one relative to max(1, max|rows|).
  t.abs_vs_rows = a.abs_vs_rows || b.abs_vs_rows;
  t.derived = !a.derived.empty() ? a.derived : b.derived;
  return t;
}

}  // namespace dil
