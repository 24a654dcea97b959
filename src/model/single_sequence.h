// One sequence run directly on a Model, without the engine: for the CLI (`logits`,
// `generate`) and the model tests. Owns slot 0 and enough blocks for `max_len` tokens.
#pragma once
#include <vector>

#include "model/model.h"

namespace dil {

class SingleSequence {
 public:
  SingleSequence(Model& model, int max_len, int block_tokens = 128);
  // Feeds `tokens` as one chunk at the current position; returns [rows, vocab] logits for
  // every token (all_logits) or only the last one.
  // Expert-parallel runs pass every rank's token count for the step (StepBatch::rank_tokens).
  std::vector<float> feed(const std::vector<int32_t>& tokens, bool all_logits,
                          const std::vector<int64_t>& rank_tokens = {});
  int position() const { return pos_; }

 private:
  Model& model_;
  int max_len_;
  int block_tokens_;
  int pos_ = 0;
  std::vector<int32_t> blocks_;
};

}  // namespace dil
