// Numeric ranges as digit automata.
//
// Integers: per digit count L, the L-digit strings between two bounds (the classic
// prefix-splitting construction). Decimals: sign, then the integer part (a range, or one
// boundary value whose fraction is compared digit by digit with the bound's fraction).
// Bounded decimals keep at most 9 integer and 6 fraction digits: 15 significant digits always
// survive a round trip through a double, so the exact decimal comparison made here agrees
// with the float comparison a validator makes (a value with more digits could round onto an
// exclusive bound).
#include "grammar/json_number.h"

#include <charconv>
#include <cmath>
#include <map>
#include <tuple>

namespace dil::grammar {
namespace {

constexpr int kBoundedIntDigits = 9;
constexpr int kBoundedFracDigits = 6;

Builder::Id digit(Builder& b) { return b.bytes_in({{'0', '9'}}); }
Builder::Id digits(Builder& b, int lo, int hi) { return b.repeat(digit(b), lo, hi); }

// Equal-length digit strings x <= s <= y.
Builder::Id same_length(Builder& b, const std::string& x, const std::string& y) {
  if (x.empty()) return b.empty();
  if (x.find_first_not_of('0') == std::string::npos && y.find_first_not_of('9') == std::string::npos)
    return digits(b, int(x.size()), int(x.size()));
  if (x[0] == y[0]) return b.seq({b.byte(uint8_t(x[0])), same_length(b, x.substr(1), y.substr(1))});
  const size_t k = x.size() - 1;
  std::vector<Builder::Id> alts;
  alts.push_back(b.seq({b.byte(uint8_t(x[0])), same_length(b, x.substr(1), std::string(k, '9'))}));
  if (x[0] + 1 <= y[0] - 1) alts.push_back(b.seq({b.bytes_in({{uint8_t(x[0] + 1), uint8_t(y[0] - 1)}}), digits(b, int(k), int(k))}));
  alts.push_back(b.seq({b.byte(uint8_t(y[0])), same_length(b, std::string(k, '0'), y.substr(1))}));
  return b.alt(std::move(alts));
}

int64_t pow10(int n) {
  int64_t p = 1;
  while (n-- > 0) p *= 10;
  return p;
}

// Non-negative integers lo..hi without leading zeros.
Builder::Id nonneg_range(Builder& b, int64_t lo, int64_t hi) {
  if (lo > hi) return b.nothing();
  std::vector<Builder::Id> alts;
  const int la = int(std::to_string(lo).size()), lb = int(std::to_string(hi).size());
  for (int len = la; len <= lb; ++len) {
    const int64_t a = std::max(lo, len == 1 ? 0 : pow10(len - 1)), z = std::min(hi, pow10(len) - 1);
    if (a <= z) alts.push_back(same_length(b, std::to_string(a), std::to_string(z)));
  }
  return b.alt(std::move(alts));
}

struct Dec {
  bool neg = false;
  std::string ip = "0", fp;  // integer digits (no leading zeros), fraction digits (no trailing zeros)
};

Dec parse_dec(const std::string& s) {
  Dec d;
  size_t i = 0;
  if (i < s.size() && s[i] == '-') {
    d.neg = true;
    ++i;
  }
  const size_t dot = s.find('.', i);
  d.ip = s.substr(i, dot == std::string::npos ? std::string::npos : dot - i);
  d.fp = dot == std::string::npos ? "" : s.substr(dot + 1);
  for (char c : d.ip + d.fp)
    if (c < '0' || c > '9') DIL_CHECK(false, "not a plain decimal: ", s);
  while (d.ip.size() > 1 && d.ip[0] == '0') d.ip.erase(0, 1);
  if (d.ip.empty()) d.ip = "0";
  while (!d.fp.empty() && d.fp.back() == '0') d.fp.pop_back();
  if (d.ip == "0" && d.fp.empty()) d.neg = false;
  return d;
}

// Fraction digit strings (up to kBoundedFracDigits) compared with a bound's fraction digits
// from position i; a bound that is still "tight" has matched the string's prefix so far.
class Fraction {
 public:
  Fraction(Builder& b, const std::string* lo, bool lo_strict, const std::string* hi, bool hi_strict)
      : b_(b), lo_(lo), hi_(hi), lo_strict_(lo_strict), hi_strict_(hi_strict) {}

  // "" or "." digits, as the bounds allow.
  Builder::Id expr() {
    std::vector<Builder::Id> alts;
    if (empty_ok(0, lo_ != nullptr, hi_ != nullptr)) alts.push_back(b_.empty());
    alts.push_back(b_.seq({b_.byte('.'), nonempty(0, kBoundedFracDigits, lo_ != nullptr, hi_ != nullptr)}));
    return b_.alt(std::move(alts));
  }

 private:
  char lo_digit(size_t i) const { return i < lo_->size() ? (*lo_)[i] : '0'; }
  char hi_digit(size_t i) const { return i < hi_->size() ? (*hi_)[i] : '0'; }
  // The rest being all zeros satisfies the tight bounds.
  bool empty_ok(size_t i, bool lt, bool ht) const {
    const bool lo_ok = !lt || (i >= lo_->size() && !lo_strict_);
    const bool hi_ok = !ht || i < hi_->size() || !hi_strict_;
    return lo_ok && hi_ok;
  }
  Builder::Id full(size_t i, int r, bool lt, bool ht) {
    std::vector<Builder::Id> alts;
    if (empty_ok(i, lt, ht)) alts.push_back(b_.empty());
    if (r > 0) alts.push_back(nonempty(i, r, lt, ht));
    return b_.alt(std::move(alts));
  }
  Builder::Id nonempty(size_t i, int r, bool lt, bool ht) {
    if (r <= 0) return b_.nothing();
    if (!lt && !ht) return digits(b_, 1, r);
    auto key = std::make_tuple(i, r, lt, ht);
    auto it = memo_.find(key);
    if (it != memo_.end()) return it->second;
    std::vector<Builder::Id> alts;
    for (int c = '0'; c <= '9';) {
      // Digits with the same effect on both bounds form one range.
      auto effect = [&](int d, bool* nlt, bool* nht) {
        *nlt = lt && d == lo_digit(i);
        *nht = ht && d == hi_digit(i);
        return !(lt && d < lo_digit(i)) && !(ht && d > hi_digit(i));
      };
      bool a, h;
      const bool ok = effect(c, &a, &h);
      int e = c;
      for (bool a2, h2; e + 1 <= '9' && effect(e + 1, &a2, &h2) == ok && a2 == a && h2 == h;) ++e;
      if (ok) alts.push_back(b_.seq({b_.bytes_in({{uint8_t(c), uint8_t(e)}}), full(i + 1, r - 1, a, h)}));
      c = e + 1;
    }
    const Builder::Id out = b_.alt(std::move(alts));
    memo_[key] = out;
    return out;
  }

  Builder& b_;
  const std::string *lo_, *hi_;
  bool lo_strict_, hi_strict_;
  std::map<std::tuple<size_t, int, bool, bool>, Builder::Id> memo_;
};

struct Mag {  // a magnitude bound
  Dec d;
  bool strict = false;
};

// Magnitudes (no sign) between lo and hi (absent: below the digit cap).
Builder::Id magnitudes(Builder& b, const Mag& lo, const std::optional<Mag>& hi) {
  const int64_t cap = pow10(kBoundedIntDigits) - 1;
  if (lo.d.ip.size() > size_t(kBoundedIntDigits)) return b.nothing();
  const int64_t ai = std::stoll(lo.d.ip);
  std::optional<Mag> top = hi;
  if (top && top->d.ip.size() > size_t(kBoundedIntDigits)) top.reset();  // above the cap anyway
  std::vector<Builder::Id> alts;
  auto with_frac = [&](int64_t ip, const std::string* flo, bool slo, const std::string* fhi, bool shi) {
    alts.push_back(b.seq({b.literal(std::to_string(ip)), Fraction(b, flo, slo, fhi, shi).expr()}));
  };
  if (top) {
    const int64_t bi = std::stoll(top->d.ip);
    if (ai > bi) return b.nothing();
    if (ai == bi) {
      with_frac(ai, &lo.d.fp, lo.strict, &top->d.fp, top->strict);
    } else {
      with_frac(ai, &lo.d.fp, lo.strict, nullptr, false);
      if (ai + 1 <= bi - 1)
        alts.push_back(b.seq({nonneg_range(b, ai + 1, bi - 1), Fraction(b, nullptr, false, nullptr, false).expr()}));
      with_frac(bi, nullptr, false, &top->d.fp, top->strict);
    }
  } else {
    with_frac(ai, &lo.d.fp, lo.strict, nullptr, false);
    if (ai + 1 <= cap) alts.push_back(b.seq({nonneg_range(b, ai + 1, cap), Fraction(b, nullptr, false, nullptr, false).expr()}));
  }
  return b.alt(std::move(alts));
}

int cmp_dec(const Dec& x, const Dec& y) {  // -1, 0, 1
  if (x.neg != y.neg) return x.neg ? -1 : 1;
  const int s = x.neg ? -1 : 1;
  if (x.ip.size() != y.ip.size()) return x.ip.size() < y.ip.size() ? -s : s;
  if (x.ip != y.ip) return x.ip < y.ip ? -s : s;
  const size_t n = std::max(x.fp.size(), y.fp.size());
  const std::string a = x.fp + std::string(n - x.fp.size(), '0'), c = y.fp + std::string(n - y.fp.size(), '0');
  if (a != c) return a < c ? -s : s;
  return 0;
}

}  // namespace

Builder::Id integer_expr(Builder& b, std::optional<int64_t> lo, std::optional<int64_t> hi) {
  const int64_t cap = pow10(kMaxIntDigits) - 1;
  const int64_t l = std::max(lo.value_or(-cap), -cap), h = std::min(hi.value_or(cap), cap);
  if (l > h) {
    if (lo && hi && *lo > *hi) throw GrammarError(str_cat("no integer lies between ", *lo, " and ", *hi), "minimum");
    throw GrammarError(str_cat("integer bounds beyond +-", cap, " are not supported"), lo && *lo > cap ? "minimum" : "maximum");
  }
  std::vector<Builder::Id> alts;
  if (l < 0) alts.push_back(b.seq({b.byte('-'), nonneg_range(b, std::max<int64_t>(1, h < 0 ? -h : 1), -l)}));
  if (h >= 0) alts.push_back(nonneg_range(b, std::max<int64_t>(0, l), h));
  return b.alt(std::move(alts));
}

Builder::Id number_expr(Builder& b, const std::optional<DecimalBound>& lo, const std::optional<DecimalBound>& hi) {
  if (!lo && !hi) {
    // -?(0|[1-9][0-9]{0,17})(\.[0-9]{1,15})?([eE][+-]?[0-9]{1,2})?
    Builder::Id ip = b.alt({b.byte('0'), b.seq({b.bytes_in({{'1', '9'}}), digits(b, 0, kMaxIntDigits - 1)})});
    Builder::Id frac = b.optional(b.seq({b.byte('.'), digits(b, 1, kMaxFracDigits)}));
    Builder::Id exp = b.optional(b.seq({b.bytes_in({{'e', 'e'}, {'E', 'E'}}), b.optional(b.bytes_in({{'+', '+'}, {'-', '-'}})),
                                        digits(b, 1, kMaxExpDigits)}));
    return b.seq({b.optional(b.byte('-')), ip, frac, exp});
  }
  const std::optional<Dec> l = lo ? std::optional<Dec>(parse_dec(lo->digits)) : std::nullopt;
  const std::optional<Dec> h = hi ? std::optional<Dec>(parse_dec(hi->digits)) : std::nullopt;
  if (l && h) {
    const int c = cmp_dec(*l, *h);
    if (c > 0 || (c == 0 && (lo->exclusive || hi->exclusive)))
      throw GrammarError(str_cat("no number lies between ", lo->digits, " and ", hi->digits), "minimum");
  }
  const Dec zero;
  std::vector<Builder::Id> alts;
  // v < 0: "-" and a magnitude m > 0 with m <= -lo, m >= -hi.
  if (!l || l->neg) {
    Mag mlo{zero, true};
    if (h && h->neg) mlo = Mag{Dec{false, h->ip, h->fp}, hi->exclusive};
    std::optional<Mag> mhi;
    if (l) mhi = Mag{Dec{false, l->ip, l->fp}, lo->exclusive};
    alts.push_back(b.seq({b.byte('-'), magnitudes(b, mlo, mhi)}));
  }
  // v >= 0.
  if (!h || !h->neg) {
    const bool hi_zero_excl = h && cmp_dec(*h, zero) == 0 && hi->exclusive;
    if (!hi_zero_excl) {
      Mag mlo{zero, false};
      if (l && !l->neg) mlo = Mag{*l, lo->exclusive};
      std::optional<Mag> mhi;
      if (h) mhi = Mag{*h, hi->exclusive};
      alts.push_back(magnitudes(b, mlo, mhi));
    }
  }
  Builder::Id e = b.alt(std::move(alts));
  if (b.node(e).kind == Builder::Kind::Nothing)
    throw GrammarError(str_cat("no number with at most ", kBoundedIntDigits, " integer digits meets the bounds"),
                       lo ? "minimum" : "maximum");
  return e;
}

std::string plain_decimal(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, r.ptr);
  const size_t e = s.find_first_of("eE");
  if (e == std::string::npos) return s;
  int exp = std::stoi(s.substr(e + 1));
  std::string m = s.substr(0, e);
  bool neg = false;
  if (!m.empty() && m[0] == '-') {
    neg = true;
    m.erase(0, 1);
  }
  const size_t dot = m.find('.');
  std::string dig = dot == std::string::npos ? m : m.substr(0, dot) + m.substr(dot + 1);
  int point = int(dot == std::string::npos ? m.size() : dot) + exp;  // digits before the point
  std::string out;
  if (point <= 0) out = "0." + std::string(size_t(-point), '0') + dig;
  else if (point >= int(dig.size())) out = dig + std::string(size_t(point) - dig.size(), '0');
  else out = dig.substr(0, size_t(point)) + "." + dig.substr(size_t(point));
  return neg ? "-" + out : out;
}

}  // namespace dil::grammar
