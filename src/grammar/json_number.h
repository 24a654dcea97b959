// JSON numbers as grammar expressions: integers in a range, decimals in a range, free numbers.
// Free repetition is bounded (digits per part) so a number cannot run on: a subset of what a
// schema allows, never more.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "grammar/builder.h"

namespace dil::grammar {

inline constexpr int kMaxIntDigits = 18;   // |integer| < 10^18 (fits int64)
inline constexpr int kMaxFracDigits = 15;  // digits after the point (a double's precision)
inline constexpr int kMaxExpDigits = 2;    // free numbers: e-99 .. e+99

// -?(0|[1-9][0-9]*) with lo <= value <= hi (absent: unbounded, within kMaxIntDigits digits).
// Throws GrammarError when no such integer exists.
Builder::Id integer_expr(Builder& b, std::optional<int64_t> lo, std::optional<int64_t> hi);

// A decimal bound: the value, and whether it is excluded.
struct DecimalBound {
  std::string digits;  // the bound as a plain decimal ("-12.5", "0.001"): exact, no exponent
  bool exclusive = false;
};
// JSON numbers (no exponent when bounded) between the bounds. Throws GrammarError when empty.
Builder::Id number_expr(Builder& b, const std::optional<DecimalBound>& lo, const std::optional<DecimalBound>& hi);

// A double as the shortest plain decimal that reads back as it ("1e-05" -> "0.00001").
std::string plain_decimal(double v);

}  // namespace dil::grammar
