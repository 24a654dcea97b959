#include "runtime/ngram_drafter.h"

#include <algorithm>

namespace dil::runtime {

std::vector<int32_t> ngram_lookup(std::span<const int32_t> t, int k, int min_n, int max_n) {
  const int len = int(t.size());
  for (int n = std::min(max_n, len - 1); n >= min_n; --n) {
    const std::span<const int32_t> tail = t.subspan(size_t(len - n));
    // Latest earlier match first: recent context predicts best. A match must leave a token
    // after it (start + n < len).
    for (int start = len - n - 1; start >= 0; --start) {
      if (!std::equal(tail.begin(), tail.end(), t.begin() + start)) continue;
      const int from = start + n, to = std::min(len, from + k);
      return std::vector<int32_t>(t.begin() + from, t.begin() + to);
    }
  }
  return {};
}

void NgramDrafter::propose(std::span<const DraftInput> in, std::vector<std::vector<int32_t>>* out) {
  out->clear();
  for (const DraftInput& d : in) out->push_back(ngram_lookup(d.tokens, std::min(k_, d.max_tokens), min_n_, max_n_));
}

}  // namespace dil::runtime
