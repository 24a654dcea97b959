#include "tokenizer/utf8.h"

namespace dil::tok {
namespace {
// Length of the valid sequence starting at s[i], or 0 if invalid; *maximal gets the length of
// the maximal subpart (the bytes that are a valid prefix) when invalid (>= 1).
size_t seq_len(std::string_view s, size_t i, size_t* maximal) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  uint8_t c = b(i);
  size_t n = s.size();
  *maximal = 1;
  if (c < 0x80) return 1;
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k < need; ++k) {
    if (i + k >= n) return 0;
    uint8_t x = b(i + k);
    if (k == 1 ? (x < lo || x > hi) : (x < 0x80 || x > 0xBF)) return 0;
    *maximal = k + 1;
  }
  return need;
}
}  // namespace

size_t utf8_invalid_at(std::string_view s) {
  size_t i = 0, m;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t l = seq_len(s, i, &m);
    if (!l) return i;
    i += l;
  }
  return std::string_view::npos;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0, m;
  while (i < s.size()) {
    size_t l = seq_len(s, i, &m);
    if (l) {
      out.append(s.substr(i, l));
      i += l;
    } else {
      out += "\xEF\xBF\xBD";
      i += m;
    }
  }
  return out;
}

size_t utf8_incomplete_tail(std::string_view s) {
  // Look back at most 3 bytes for a lead byte whose sequence runs past the end.
  for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    size_t i = s.size() - back;
    uint8_t c = static_cast<uint8_t>(s[i]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t m;
    size_t l = seq_len(s, i, &m);
    // Incomplete: invalid only because it is cut short (every present byte fits).
    if (l == 0 && m == back && c >= 0xC2 && c <= 0xF4) return back;
    return 0;
  }
  return 0;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint32_t utf8_next(std::string_view s, size_t& i) {
  uint8_t c = static_cast<uint8_t>(s[i]);
  if (c < 0x80) {
    ++i;
    return c;
  }
  int n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
  uint32_t cp = c & (0x7F >> n);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

}  // namespace dil::tok
