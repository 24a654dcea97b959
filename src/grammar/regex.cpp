// Regex parser (recursive descent) straight to grammar expressions.
//
// Shorthand classes are their ASCII sets (\d = [0-9], \w = [A-Za-z0-9_], \s = [ \t\n\r\f\v]),
// and their negations stay within ASCII: Python's `re` (what jsonschema validates patterns
// with) reads them as Unicode classes and ECMA-262 as ASCII ones, so only characters both
// agree on are generated.
#include "grammar/regex.h"

#include <cctype>

namespace dil::grammar {
namespace {

constexpr int kMaxCount = 1000;

CharSet ascii() { return CharSet::of(0, 0x7F); }
CharSet digits() { return CharSet::of('0', '9'); }
CharSet word() {
  CharSet s = CharSet::of('a', 'z');
  s.add('A', 'Z');
  s.add('0', '9');
  s.add('_', '_');
  return s;
}
CharSet space() {
  CharSet s = CharSet::of('\t', '\r');  // \t \n \v \f \r
  s.add(' ', ' ');
  return s;
}

class Parser {
 public:
  Parser(Builder& b, std::string_view p, CharMode mode, const CharSet& allowed)
      : b_(b), p_(p), mode_(mode), allowed_(allowed) {}

  Builder::Id run() {
    if (!p_.empty() && p_[0] == '^') ++i_;
    size_t end = p_.size();
    if (end > i_ && p_[end - 1] == '$' && !escaped_at(end - 1)) --end;
    p_ = p_.substr(0, end);
    Builder::Id e = alt();
    if (i_ < p_.size()) fail("unbalanced ')'", ")");
    return e;
  }

 private:
  [[noreturn]] void fail(const std::string& what, const std::string& feature) const {
    throw GrammarError(str_cat("regex: ", what, " at offset ", i_, " is not supported"), feature, str_cat(i_));
  }
  bool escaped_at(size_t k) const {
    size_t n = 0;
    while (k > n && p_[k - 1 - n] == '\\') ++n;
    return n % 2 == 1;
  }
  bool at_end() const { return i_ >= p_.size(); }
  char peek() const { return p_[i_]; }

  uint32_t code_point() {
    const uint8_t c = uint8_t(p_[i_]);
    int n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    if (i_ + size_t(n) > p_.size()) fail("a truncated UTF-8 character", "utf-8");
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (int k = 1; k < n; ++k) cp = cp << 6 | (uint8_t(p_[i_ + size_t(k)]) & 0x3F);
    i_ += size_t(n);
    return cp;
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      if (at_end() || !std::isxdigit(uint8_t(peek()))) fail("a malformed hex escape", "escape");
      const char c = p_[i_++];
      v = v * 16 + uint32_t(std::isdigit(uint8_t(c)) ? c - '0' : (std::tolower(c) - 'a' + 10));
    }
    if (v > CharSet::kMax) fail("a code point above U+10FFFF", "escape");
    return v;
  }

  Builder::Id chars(const CharSet& s) {
    CharSet in = s.intersect(allowed_);
    return emit_chars(b_, in, mode_);
  }

  // After a backslash: a set (*shorthand: \d \w \s and negations) or a single character.
  CharSet escape(bool in_class, bool* shorthand) {
    *shorthand = false;
    if (at_end()) fail("a trailing backslash", "escape");
    const char c = p_[i_++];
    switch (c) {
      case 'd': *shorthand = true; return digits();
      case 'D': *shorthand = true; return ascii().minus(digits());
      case 'w': *shorthand = true; return word();
      case 'W': *shorthand = true; return ascii().minus(word());
      case 's': *shorthand = true; return space();
      case 'S': *shorthand = true; return ascii().minus(space());
      case 'n': return CharSet::of('\n', '\n');
      case 't': return CharSet::of('\t', '\t');
      case 'r': return CharSet::of('\r', '\r');
      case 'f': return CharSet::of('\f', '\f');
      case 'v': return CharSet::of('\v', '\v');
      case '0': return CharSet::of(0, 0);
      case 'x': { const uint32_t v = hex(2); return CharSet::of(v, v); }
      case 'u': {
        if (!at_end() && peek() == '{') fail("\\u{...}", "\\u{");
        const uint32_t v = hex(4);
        return CharSet::of(v, v);
      }
      case 'b':
        if (in_class) return CharSet::of('\b', '\b');  // backspace inside a class
        fail("a word boundary (\\b)", "\\b");
      case 'B': fail("a word boundary (\\B)", "\\B");
      case 'A': case 'z': case 'Z': case 'G': fail(str_cat("the anchor \\", c), str_cat("\\", c));
      case 'p': case 'P': fail("Unicode property classes (\\p, \\P)", "\\p");
      case 'k': fail("named backreferences", "\\k");
      default: break;
    }
    if (c >= '1' && c <= '9') fail("backreferences", "backreference");
    if (std::isalnum(uint8_t(c)) || uint8_t(c) >= 0x80) fail(str_cat("the escape \\", c), str_cat("\\", c));
    return CharSet::of(uint8_t(c), uint8_t(c));
  }

  CharSet char_class() {
    // At '[' already consumed.
    bool neg = false, shorthand_seen = false;
    if (!at_end() && peek() == '^') {
      neg = true;
      ++i_;
    }
    CharSet s;
    bool first = true;
    for (;;) {
      if (at_end()) fail("an unterminated character class", "[");
      if (peek() == ']' && !first) {
        ++i_;
        break;
      }
      if (peek() == '[' && i_ + 1 < p_.size() && (p_[i_ + 1] == ':' || p_[i_ + 1] == '=' || p_[i_ + 1] == '.'))
        fail("POSIX classes ([:alpha:])", "[:");
      first = false;
      uint32_t lo;
      if (peek() == '\\') {
        ++i_;
        bool sh = false;
        CharSet e = escape(true, &sh);
        if (sh) {
          shorthand_seen = true;
          s.add(e);
          continue;
        }
        lo = e.ranges()[0].lo;
      } else {
        lo = code_point();
      }
      uint32_t hi = lo;
      if (i_ + 1 < p_.size() && peek() == '-' && p_[i_ + 1] != ']') {
        ++i_;
        if (peek() == '\\') {
          ++i_;
          bool sh = false;
          CharSet e = escape(true, &sh);
          if (sh) fail("a class shorthand as a range end", "[");
          hi = e.ranges()[0].lo;
        } else {
          hi = code_point();
        }
        if (hi < lo) fail("a reversed range in a character class", "[");
      }
      s.add(lo, hi);
    }
    if (!neg) return s;
    // A negated class holding a shorthand: ASCII only (see the file comment).
    return shorthand_seen ? ascii().minus(s) : s.negated();
  }

  Builder::Id atom() {
    const char c = peek();
    if (c == '(') {
      ++i_;
      if (!at_end() && peek() == '?') {
        ++i_;
        if (at_end()) fail("an unterminated group", "(?");
        const char k = peek();
        if (k == ':') {
          ++i_;
        } else if (k == 'P' || k == '<') {
          if (k == 'P') ++i_;
          if (at_end() || peek() != '<') fail("this group syntax", "(?P");
          if (i_ + 1 < p_.size() && (p_[i_ + 1] == '=' || p_[i_ + 1] == '!')) fail("lookbehind", "(?<=");
          while (!at_end() && peek() != '>') ++i_;
          if (at_end()) fail("an unterminated group name", "(?<");
          ++i_;
        } else if (k == '=' || k == '!') {
          fail("lookahead", str_cat("(?", k));
        } else {
          fail("inline flags and other (? groups", "(?");
        }
      }
      Builder::Id e = alt();
      if (at_end() || peek() != ')') fail("an unterminated group", "(");
      ++i_;
      return e;
    }
    if (c == '[') {
      ++i_;
      return chars(char_class());
    }
    if (c == '.') {
      ++i_;
      CharSet any = CharSet::all();
      for (uint32_t t : {uint32_t('\n'), uint32_t('\r'), 0x2028u, 0x2029u}) any = any.minus(CharSet::of(t, t));
      return chars(any);
    }
    if (c == '\\') {
      ++i_;
      bool sh = false;
      CharSet e = escape(false, &sh);
      return chars(e);
    }
    if (c == '^' || c == '$') fail("anchors inside the pattern", std::string(1, c));
    if (c == '*' || c == '+' || c == '?' || c == '{') fail("a quantifier without anything to repeat", std::string(1, c));
    const uint32_t cp = code_point();
    if (!allowed_.contains(cp)) fail(str_cat("the character U+", cp, ", which this output cannot hold"), "literal");
    return emit_chars(b_, CharSet::of(cp, cp), mode_);
  }

  int number() {
    if (at_end() || !std::isdigit(uint8_t(peek()))) fail("a malformed {m,n} quantifier", "{");
    int64_t v = 0;
    while (!at_end() && std::isdigit(uint8_t(peek()))) {
      v = v * 10 + (p_[i_++] - '0');
      if (v > kMaxCount) fail(str_cat("a repetition count above ", kMaxCount), "{");
    }
    return int(v);
  }

  Builder::Id quantified(Builder::Id e) {
    for (;;) {
      if (at_end()) return e;
      int lo, hi;
      const char c = peek();
      if (c == '*') { lo = 0; hi = -1; ++i_; }
      else if (c == '+') { lo = 1; hi = -1; ++i_; }
      else if (c == '?') { lo = 0; hi = 1; ++i_; }
      else if (c == '{') {
        ++i_;
        lo = number();
        hi = lo;
        if (!at_end() && peek() == ',') {
          ++i_;
          hi = (!at_end() && peek() == '}') ? -1 : number();
        }
        if (at_end() || peek() != '}') fail("a malformed {m,n} quantifier", "{");
        ++i_;
        if (hi >= 0 && hi < lo) fail("a {m,n} quantifier with n < m", "{");
      } else {
        return e;
      }
      if (!at_end() && peek() == '?') ++i_;  // lazy: same strings
      else if (!at_end() && peek() == '+') fail("possessive quantifiers", "+");
      e = b_.repeat(e, lo, hi);
    }
  }

  Builder::Id seq() {
    std::vector<Builder::Id> parts;
    while (!at_end() && peek() != '|' && peek() != ')') parts.push_back(quantified(atom()));
    return b_.seq(std::move(parts));
  }

  Builder::Id alt() {
    std::vector<Builder::Id> options = {seq()};
    while (!at_end() && peek() == '|') {
      ++i_;
      options.push_back(seq());
    }
    return b_.alt(std::move(options));
  }

  Builder& b_;
  std::string_view p_;
  CharMode mode_;
  const CharSet& allowed_;
  size_t i_ = 0;
};

}  // namespace

Builder::Id regex_expr(Builder& b, std::string_view pattern, CharMode mode, const CharSet& allowed) {
  return Parser(b, pattern, mode, allowed).run();
}

Builder::Id choice_expr(Builder& b, const std::vector<std::string>& options, CharMode mode) {
  std::vector<Builder::Id> alts;
  for (const std::string& o : options) alts.push_back(emit_text(b, o, mode));
  return b.alt(std::move(alts));
}

}  // namespace dil::grammar
