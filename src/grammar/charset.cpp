#include "grammar/charset.h"

#include <algorithm>
#include <cstdio>

namespace dil::grammar {
namespace {

constexpr uint32_t kSurLo = 0xD800, kSurHi = 0xDFFF;

int utf8_len(uint32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }

void encode(uint32_t c, uint8_t* out) {
  switch (utf8_len(c)) {
    case 1: out[0] = uint8_t(c); break;
    case 2: out[0] = uint8_t(0xC0 | c >> 6); out[1] = uint8_t(0x80 | (c & 0x3F)); break;
    case 3:
      out[0] = uint8_t(0xE0 | c >> 12); out[1] = uint8_t(0x80 | (c >> 6 & 0x3F)); out[2] = uint8_t(0x80 | (c & 0x3F));
      break;
    default:
      out[0] = uint8_t(0xF0 | c >> 18); out[1] = uint8_t(0x80 | (c >> 12 & 0x3F));
      out[2] = uint8_t(0x80 | (c >> 6 & 0x3F)); out[3] = uint8_t(0x80 | (c & 0x3F));
  }
}

// [lo, hi] of one UTF-8 length as products of byte ranges (each position independent), by
// splitting at the boundaries where the continuation bytes stop covering 80..BF fully.
void split_same_length(uint32_t lo, uint32_t hi, std::vector<std::vector<ByteRange>>& out) {
  const int n = utf8_len(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (uint32_t(1) << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        split_same_length(lo, lo | m, out);
        split_same_length((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        split_same_length(lo, (hi & ~m) - 1, out);
        split_same_length(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  encode(lo, a);
  encode(hi, b);
  std::vector<ByteRange> seq;
  for (int k = 0; k < n; ++k) seq.push_back({a[k], b[k]});
  out.push_back(std::move(seq));
}

Builder::Id utf8_expr(Builder& b, const CharSet& cs) {
  const CharSet s = cs.intersect(CharSet::all());  // surrogates have no UTF-8 form
  std::vector<std::vector<ByteRange>> seqs;
  static constexpr uint32_t kBounds[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
  for (const CpRange& r : s.ranges()) {
    uint32_t lo = r.lo;
    for (uint32_t bound : kBounds) {
      if (lo > r.hi) break;
      if (lo > bound) continue;
      split_same_length(lo, std::min(r.hi, bound), seqs);
      lo = bound + 1;
    }
  }
  // Single bytes in one set; longer sequences grouped by their first byte range.
  std::vector<ByteRange> ascii;
  std::vector<Builder::Id> alts;
  for (const auto& q : seqs) {
    if (q.size() == 1) {
      ascii.push_back(q[0]);
      continue;
    }
    std::vector<Builder::Id> parts;
    for (const ByteRange& r : q) parts.push_back(b.bytes_in({r}));
    alts.push_back(b.seq(std::move(parts)));
  }
  if (!ascii.empty()) alts.push_back(b.bytes_in(std::move(ascii)));
  return b.alt(std::move(alts));
}

const char* short_escape(uint32_t c) {
  switch (c) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\b': return "\\b";
    case '\f': return "\\f";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    default: return nullptr;
  }
}

std::string json_escape_char(uint32_t c) {
  if (const char* e = short_escape(c)) return e;
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
  return buf;
}

uint32_t decode_at(std::string_view s, size_t* i) {
  const uint8_t c = uint8_t(s[*i]);
  int n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
  if (*i + size_t(n) > s.size()) n = 1;
  uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
  for (int k = 1; k < n; ++k) cp = cp << 6 | (uint8_t(s[*i + size_t(k)]) & 0x3F);
  *i += size_t(n);
  return cp;
}

}  // namespace

CharSet CharSet::all() {
  CharSet s;
  s.add(0, kSurLo - 1);
  s.add(kSurHi + 1, kMax);
  return s;
}

void CharSet::add(uint32_t lo, uint32_t hi) {
  DIL_CHECK(lo <= hi && hi <= kMax, "code point range ", lo, "-", hi);
  std::vector<CpRange> out;
  bool placed = false;
  for (const CpRange& r : r_) {
    if (r.hi + 1 < lo) {
      out.push_back(r);
    } else if (hi + 1 < r.lo) {
      if (!placed) out.push_back({lo, hi});
      placed = true;
      out.push_back(r);
    } else {
      lo = std::min(lo, r.lo);
      hi = std::max(hi, r.hi);
    }
  }
  if (!placed) out.push_back({lo, hi});
  r_ = std::move(out);
}

CharSet CharSet::negated() const {
  CharSet out;
  uint32_t next = 0;
  for (const CpRange& r : r_) {
    if (r.lo > next) out.add(next, r.lo - 1);
    next = r.hi + 1;
  }
  if (next <= kMax) out.add(next, kMax);
  return out.intersect(all());
}

CharSet CharSet::intersect(const CharSet& o) const {
  CharSet out;
  for (const CpRange& a : r_)
    for (const CpRange& b : o.r_) {
      const uint32_t lo = std::max(a.lo, b.lo), hi = std::min(a.hi, b.hi);
      if (lo <= hi) out.add(lo, hi);
    }
  return out;
}

bool CharSet::contains(uint32_t c) const {
  for (const CpRange& r : r_)
    if (c >= r.lo && c <= r.hi) return true;
  return false;
}

Builder::Id emit_chars(Builder& b, const CharSet& s, CharMode mode) {
  if (mode == CharMode::Raw) return utf8_expr(b, s);
  // JSON: the characters a string may hold raw, plus an escape for each of the others.
  CharSet escaped = CharSet::of(0, 0x1F);
  escaped.add('"', '"');
  escaped.add('\\', '\\');
  std::vector<Builder::Id> alts = {utf8_expr(b, s.minus(escaped))};
  const CharSet controls = s.intersect(CharSet::of(0, 0x1F));
  const bool all_controls = controls.ranges().size() == 1 && controls.ranges()[0].lo == 0 && controls.ranges()[0].hi == 0x1F;
  const CharSet special = s.intersect(escaped);
  for (const CpRange& r : special.ranges())
    for (uint32_t c = r.lo; c <= r.hi; ++c)
      if (!all_controls || c >= 0x20 || short_escape(c)) alts.push_back(b.literal(json_escape_char(c)));
  // Every control character: \u0000..\u001f in one small automaton.
  if (all_controls)
    alts.push_back(b.seq({b.literal("\\u00"), b.bytes_in({{'0', '1'}}), b.bytes_in({{'0', '9'}, {'a', 'f'}})}));
  return b.alt(std::move(alts));
}

Builder::Id emit_text(Builder& b, std::string_view text, CharMode mode) {
  if (mode == CharMode::Raw) return b.literal(text);
  std::string q = json_quote(text);
  return b.literal(std::string_view(q).substr(1, q.size() - 2));
}

bool chars_within(std::string_view text, const CharSet& s) {
  for (size_t i = 0; i < text.size();)
    if (!s.contains(decode_at(text, &i))) return false;
  return true;
}

std::string json_quote(std::string_view text) {
  std::string out = "\"";
  for (size_t i = 0; i < text.size();) {
    const size_t start = i;
    const uint32_t c = decode_at(text, &i);
    if (c < 0x20 || c == '"' || c == '\\') out += json_escape_char(c);
    else out.append(text.substr(start, i - start));
  }
  out += '"';
  return out;
}

}  // namespace dil::grammar
