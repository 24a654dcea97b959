// Sets of Unicode scalar values and their byte automata: raw UTF-8, or the way a JSON string
// writes them (", \ and control characters escaped).
#pragma once
#include <cstdint>
#include <vector>

#include "grammar/builder.h"

namespace dil::grammar {

struct CpRange {
  uint32_t lo = 0, hi = 0;
};

class CharSet {
 public:
  static constexpr uint32_t kMax = 0x10FFFF;
  static CharSet all();  // every scalar value (no surrogates)
  static CharSet of(uint32_t lo, uint32_t hi) {
    CharSet s;
    s.add(lo, hi);
    return s;
  }
  void add(uint32_t lo, uint32_t hi);
  void add(const CharSet& o) {
    for (const CpRange& r : o.r_) add(r.lo, r.hi);
  }
  CharSet negated() const;  // within all()
  CharSet minus(const CharSet& o) const { return intersect(o.negated()); }
  CharSet intersect(const CharSet& o) const;
  bool contains(uint32_t c) const;
  bool empty() const { return r_.empty(); }
  const std::vector<CpRange>& ranges() const { return r_; }

 private:
  std::vector<CpRange> r_;  // sorted, disjoint, not adjacent
};

enum class CharMode : uint8_t {
  Raw,         // the characters' UTF-8 bytes
  JsonString,  // inside a JSON string: ", \ and U+0000..U+001F as escapes, the rest raw
};

// One character of `s`, written in `mode`.
Builder::Id emit_chars(Builder& b, const CharSet& s, CharMode mode);
// `text` (UTF-8) written in `mode` (JsonString: escaped as a JSON string body, no quotes).
Builder::Id emit_text(Builder& b, std::string_view text, CharMode mode);
// Every character of `text` (UTF-8) is in `s`.
bool chars_within(std::string_view text, const CharSet& s);
// The JSON string literal of `text`, quotes included (what json.dumps writes, non-ASCII raw).
std::string json_quote(std::string_view text);

}  // namespace dil::grammar
