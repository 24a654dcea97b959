#include "model/single_sequence.h"

#include "core/check.h"

namespace dil {

SingleSequence::SingleSequence(Model& model, int max_len, int block_tokens)
    : model_(model), max_len_(max_len), block_tokens_(block_tokens) {
  int n_blocks = (max_len + block_tokens - 1) / block_tokens;
  for (int i = 0; i < n_blocks; ++i) blocks_.push_back(i);
  model_.allocate_cache(n_blocks, 1, block_tokens);
}

std::vector<float> SingleSequence::feed(const std::vector<int32_t>& tokens, bool all_logits,
                                        const std::vector<int64_t>& rank_tokens) {
  if (tokens.empty()) return {};
  if (pos_ + int(tokens.size()) > max_len_)
    DIL_FAIL("sequence of ", pos_ + tokens.size(), " tokens exceeds the cache (", max_len_, ")");
  StepBatch b;
  b.tokens = tokens;
  SeqChunk c;
  c.slot = 0;
  c.start_pos = pos_;
  c.n_tokens = int(tokens.size());
  c.blocks = blocks_;
  c.want_logits = true;
  c.all_logits = all_logits;
  b.seqs.push_back(c);
  b.rank_tokens = rank_tokens;
  std::vector<float> logits;
  model_.forward(b, &logits);
  pos_ += int(tokens.size());
  return logits;
}

}  // namespace dil
