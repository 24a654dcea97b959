// Thin PCRE2 wrapper (8-bit, UTF + UCP, JIT) for the pre-tokenizer's Split patterns.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dil::tok {

class Regex {
 public:
  // `onig_pattern` uses Oniguruma syntax (as in tokenizer.json); throws dil::Error if bad.
  explicit Regex(const std::string& onig_pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Non-overlapping matches in `s` (valid UTF-8), as byte [begin, end) pairs; empty matches
  // are skipped (HF's Split ignores them too).
  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  void* code_;  // pcre2_code_8*
};

}  // namespace dil::tok
