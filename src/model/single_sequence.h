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
  std::vector<float> feed(const std::vector<int32_t>& tokens, bool all_logits);
  int position() const { return pos_; }

 private:
  Model& model_;
  int max_len_;
  int block_tokens_;
  int pos_ = 0;
  std::vector<int32_t> blocks_;
};

}  // namespace dil
