// A stand-in Model for engine tests: logits are a hash of the sequence's whole token history,
// read back from the paged blocks the engine hands it, and checked against a running hash kept
// in the sequence's state slot. So a wrong block table, a block freed while still in use, a
// wrong slot or a skipped/duplicated position makes it abort, not just give other tokens. Cache
// copies (fork, prefix cache) copy a block's tokens or a slot's hash and position, so a wrong or
// missing copy (a restore from the wrong snapshot, a shared block written) aborts the same way.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "core/check.h"
#include "model/model.h"

namespace dil::testing {

struct FakeModelStats {
  std::atomic<int64_t> steps{0};
  std::atomic<int64_t> max_step_tokens{0};
  std::atomic<int64_t> max_step_seqs{0};
  std::atomic<int> step_delay_us{0};  // slows each step (cancel tests)
  std::atomic<int64_t> tokens{0};     // positions computed, over all steps
  std::atomic<int64_t> copies{0};     // cache copies run
};

inline uint64_t mix64(uint64_t x) {  // SplitMix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

class FakeModel final : public Model {
 public:
  explicit FakeModel(int vocab = 64, std::shared_ptr<FakeModelStats> stats = std::make_shared<FakeModelStats>())
      : stats_(std::move(stats)) {
    cfg_.model_type = "fake";
    cfg_.vocab_size = vocab;
    cfg_.n_layers = 3;
    cfg_.compress_ratios = {0, 4, 128};
    cfg_.eos_id = 1;
    cfg_.bos_id = 0;
  }
  const ModelConfig& config() const override { return cfg_; }
  CacheSpec cache_spec(int block_tokens) const override {
    return {block_tokens, size_t(block_tokens) * 4, 1000};  // one int32 token per position; a hash slot
  }
  void allocate_cache(int n_blocks, int n_slots, int block_tokens) override {
    bt_ = block_tokens;
    cache_.assign(size_t(n_blocks) * block_tokens, -1);
    slot_hash_.assign(n_slots, 0);
    slot_pos_.assign(n_slots, -1);
  }
  void copy_cache(const std::vector<CacheCopy>& ops) override {
    for (const CacheCopy& op : ops) {
      ++stats_->copies;
      if (op.kind == CacheCopy::Kind::Block) {
        const size_t n = cache_.size() / size_t(bt_);
        DIL_CHECK(op.src >= 0 && size_t(op.src) < n && op.dst >= 0 && size_t(op.dst) < n, "bad block copy");
        std::copy_n(cache_.begin() + int64_t(op.src) * bt_, bt_, cache_.begin() + int64_t(op.dst) * bt_);
      } else {
        DIL_CHECK(op.src >= 0 && op.src < int(slot_hash_.size()) && op.dst >= 0 && op.dst < int(slot_hash_.size()),
                  "bad slot copy");
        DIL_CHECK(slot_pos_[op.src] >= 0, "copy of slot ", op.src, " that holds no state");
        slot_hash_[op.dst] = slot_hash_[op.src];
        slot_pos_[op.dst] = slot_pos_[op.src];
      }
    }
  }
  void forward(const StepBatch& batch, std::vector<float>* logits) override {
    if (int us = stats_->step_delay_us.load()) std::this_thread::sleep_for(std::chrono::microseconds(us));
    ++stats_->steps;
    stats_->tokens += int64_t(batch.tokens.size());
    stats_->max_step_tokens = std::max<int64_t>(stats_->max_step_tokens, int64_t(batch.tokens.size()));
    stats_->max_step_seqs = std::max<int64_t>(stats_->max_step_seqs, int64_t(batch.seqs.size()));
    logits->clear();
    size_t off = 0;
    for (const SeqChunk& c : batch.seqs) {
      DIL_CHECK(c.slot >= 0 && c.slot < int(slot_hash_.size()), "bad slot ", c.slot);
      if (c.start_pos == 0) {
        slot_hash_[c.slot] = 0x5eed;
        slot_pos_[c.slot] = 0;
      }
      DIL_CHECK(slot_pos_[c.slot] == c.start_pos, "slot ", c.slot, " is at ", slot_pos_[c.slot], " but chunk starts at ",
                c.start_pos);
      DIL_CHECK(int64_t(c.blocks.size()) * bt_ >= c.start_pos + c.n_tokens, "block table too short");
      for (int i = 0; i < c.n_tokens; ++i) {
        const int p = c.start_pos + i;
        const int32_t tok = batch.tokens[off + i];
        cache_[size_t(c.blocks[p / bt_]) * bt_ + p % bt_] = tok;
        slot_hash_[c.slot] = mix64(slot_hash_[c.slot] ^ uint64_t(uint32_t(tok)));
      }
      off += c.n_tokens;
      slot_pos_[c.slot] = c.start_pos + c.n_tokens;
      if (!c.want_logits) continue;
      // Re-read the whole history from the blocks: it must reproduce the slot's hash.
      uint64_t h = 0x5eed;
      const int end = c.start_pos + c.n_tokens;
      for (int p = 0; p < end; ++p) h = mix64(h ^ uint64_t(uint32_t(cache_[size_t(c.blocks[p / bt_]) * bt_ + p % bt_])));
      DIL_CHECK(h == slot_hash_[c.slot], "blocks of slot ", c.slot, " no longer hold its history");
      for (int64_t v = 0; v < cfg_.vocab_size; ++v)
        logits->push_back(float(double(mix64(h + uint64_t(v)) >> 11) * 0x1.0p-53 * 8.0 - 4.0));
    }
    DIL_CHECK(off == batch.tokens.size(), "chunk sizes do not add up to the batch");
  }

 private:
  ModelConfig cfg_;
  std::shared_ptr<FakeModelStats> stats_;
  int bt_ = 128;
  std::vector<int32_t> cache_;      // [n_blocks, block_tokens] token ids
  std::vector<uint64_t> slot_hash_; // [n_slots]
  std::vector<int> slot_pos_;       // [n_slots]
};

}  // namespace dil::testing
