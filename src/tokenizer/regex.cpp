#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include <memory>

#include "core/check.h"

namespace dil::tok {

namespace {
// Oniguruma (HF tokenizers' engine) and PCRE2 disagree on \s: PCRE2 with UCP adds U+180E
// (Mongolian vowel separator, a format character since Unicode 6.3). Spell \s and \S out as
// Unicode White_Space, which is what Oniguruma matches.
constexpr const char* kWhiteSpace = "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

std::string onig_to_pcre2(const std::string& p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char n = p[i + 1];
      ++i;
      if (n == 's') {
        out += in_class ? std::string(kWhiteSpace) : std::string("[") + kWhiteSpace + "]";
      } else if (n == 'S') {
        if (in_class) DIL_FAIL("tokenizer: \\S inside a character class is not supported");
        out += std::string("[^") + kWhiteSpace + "]";
      } else {
        out += c;
        out += n;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}
}  // namespace

Regex::Regex(const std::string& onig_pattern) {
  const std::string pattern = onig_to_pcre2(onig_pattern);
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    DIL_FAIL("tokenizer: bad pre-tokenizer regex at offset ", off, ": ", reinterpret_cast<char*>(msg));
  }
  // JIT is an optimisation only: fall back to the interpreter if it is unavailable.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  // Match data is per call so that find_all is safe to run from several threads.
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(code, nullptr), &pcre2_match_data_free);
  auto subj = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t pos = 0;
  while (pos <= s.size()) {
    // The subject was validated once by the caller: skip PCRE2's per-call UTF check.
    int rc = pcre2_match(code, subj, s.size(), pos, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    // A resource limit on pathological input is the user's input failing, not a broken invariant.
    if (rc < 0) DIL_FAIL("tokenizer: pre-tokenizer regex failed (PCRE2 error ", rc, ")");
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.emplace_back(b, e);
      pos = e;
    } else {
      // Empty match: step over one code point.
      pos = b + 1;
      while (pos < s.size() && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
}

}  // namespace dil::tok
