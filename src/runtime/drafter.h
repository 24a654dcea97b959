// Speculative decoding's proposer (issue 27). Each step the engine asks the drafter for up to
// k tokens to follow every decoding sequence; the target model scores [last token + drafts] in
// one forward (the chunked-prefill math, all rows' logits) and the engine keeps the longest
// prefix the target's own sampling agrees with, plus the target's next token (engine.cpp,
// "Speculative decoding").
//
// The drafter only proposes: whatever it proposes, the output is the target's (the engine
// samples every position from the target's logits with the request's seed and position, and
// stops at the first position where that token differs from the draft). A drafter changes
// how many forwards a request takes, never its tokens.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dil::runtime {

struct DraftInput {
  int64_t seq_id = 0;                // stable while the request lives (also across preemption)
  std::string_view request_id;
  std::span<const int32_t> tokens;   // prompt + generated so far; the last one is not computed yet
  int prompt_len = 0;
  int max_tokens = 0;                // propose at most this many (>= 1)
  int32_t slot = -1;                 // the model's state slot (every token but the last computed)
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  // The most tokens it ever proposes for one sequence in one step (--num-speculative-tokens).
  virtual int max_draft_tokens() const = 0;
  // One proposal per input, in order: (*out)[i] has at most in[i].max_tokens ids in
  // [0, vocab) (fewer, or none, is fine). Called on the engine thread before scheduling.
  virtual void propose(std::span<const DraftInput> in, std::vector<std::vector<int32_t>>* out) = 0;
  // The request left the engine (finished, cancelled): drop what is kept for it.
  virtual void release(int64_t seq_id) { (void)seq_id; }
};

}  // namespace dil::runtime
