// Prompt-lookup drafting (vLLM's `[ngram]` speculative method): the draft is what followed the
// most recent earlier occurrence of the sequence's last n tokens (n = max_n down to min_n), in
// the prompt and what it generated. Needs no weights: repetitive text (code edits, quoting,
// structured output) gets long accepted runs, anything else costs one verify row per draft
// token.
#pragma once
#include "runtime/drafter.h"

namespace dil::runtime {

class NgramDrafter final : public Drafter {
 public:
  NgramDrafter(int k, int min_n = 1, int max_n = 4) : k_(k), min_n_(min_n), max_n_(max_n) {}
  int max_draft_tokens() const override { return k_; }
  void propose(std::span<const DraftInput> in, std::vector<std::vector<int32_t>>* out) override;

 private:
  int k_, min_n_, max_n_;
};

// The draft for one token sequence (exposed for tests).
std::vector<int32_t> ngram_lookup(std::span<const int32_t> tokens, int k, int min_n, int max_n);

}  // namespace dil::runtime
