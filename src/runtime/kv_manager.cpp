#include "runtime/kv_manager.h"

#include "core/check.h"

namespace dil::runtime {

KvManager::KvManager(int32_t n_blocks, int32_t n_slots, int block_tokens, size_t bytes_per_block,
                     size_t bytes_per_slot)
    : block_tokens_(block_tokens), bytes_per_block_(bytes_per_block), bytes_per_slot_(bytes_per_slot) {
  DIL_CHECK(n_blocks >= 0 && n_slots >= 0 && block_tokens > 0, "bad cache geometry");
  refcount_.assign(n_blocks, 0);
  slot_used_.assign(n_slots, 0);
  // Stacks popped from the back: block 0 / slot 0 are handed out first (readable traces).
  for (int32_t b = n_blocks - 1; b >= 0; --b) free_blocks_.push_back(b);
  for (int32_t s = n_slots - 1; s >= 0; --s) free_slots_.push_back(s);
}

const KvManager::SeqState& KvManager::get(int64_t seq) const {
  auto it = seqs_.find(seq);
  DIL_CHECK(it != seqs_.end(), "unknown sequence ", seq);
  return it->second;
}

const std::vector<int32_t>& KvManager::blocks(int64_t seq) const { return get(seq).blocks; }
int32_t KvManager::slot(int64_t seq) const { return get(seq).slot; }
int64_t KvManager::reserved_tokens(int64_t seq) const { return get(seq).n_tokens; }

int32_t KvManager::take_block() {
  DIL_CHECK(!free_blocks_.empty(), "no free block");
  int32_t b = free_blocks_.back();
  free_blocks_.pop_back();
  DIL_CHECK(refcount_[b] == 0, "block ", b, " on the free list has refcount ", refcount_[b]);
  refcount_[b] = 1;
  return b;
}

void KvManager::drop_block(int32_t b) {
  DIL_CHECK(b >= 0 && b < total_blocks() && refcount_[b] > 0, "double free of block ", b);
  if (--refcount_[b] == 0) free_blocks_.push_back(b);
}

bool KvManager::add(int64_t seq) {
  DIL_CHECK(!seqs_.count(seq), "sequence ", seq, " already registered");
  if (free_slots_.empty()) return false;
  SeqState st;
  st.slot = free_slots_.back();
  free_slots_.pop_back();
  DIL_CHECK(!slot_used_[st.slot], "slot ", st.slot, " handed out twice");
  slot_used_[st.slot] = 1;
  seqs_.emplace(seq, std::move(st));
  return true;
}

int32_t KvManager::blocks_needed(int64_t seq, int64_t n_tokens) const {
  const SeqState& st = get(seq);
  if (n_tokens <= st.n_tokens) return 0;
  int64_t want = (n_tokens + block_tokens_ - 1) / block_tokens_;
  int32_t need = int32_t(want - int64_t(st.blocks.size()));
  // The next write lands in a partially filled last block: a shared one must be copied first.
  if (st.n_tokens % block_tokens_ != 0 && refcount_[st.blocks.back()] > 1) need += 1;
  return need;
}

bool KvManager::reserve(int64_t seq, int64_t n_tokens, std::vector<CopyOp>* cow) {
  int32_t need = blocks_needed(seq, n_tokens);
  if (need > free_blocks()) return false;
  SeqState& st = seqs_.at(seq);
  if (n_tokens <= st.n_tokens) return true;
  if (st.n_tokens % block_tokens_ != 0 && refcount_[st.blocks.back()] > 1) {
    int32_t old = st.blocks.back();
    int32_t fresh = take_block();
    drop_block(old);
    st.blocks.back() = fresh;
    DIL_CHECK(cow != nullptr, "copy-on-write of block ", old, " needs a CopyOp list");
    cow->push_back({CopyOp::Kind::Block, old, fresh});
  }
  int64_t want = (n_tokens + block_tokens_ - 1) / block_tokens_;
  while (int64_t(st.blocks.size()) < want) st.blocks.push_back(take_block());
  st.n_tokens = n_tokens;
  return true;
}

bool KvManager::fork(int64_t parent, int64_t child, std::vector<CopyOp>* copies) {
  const SeqState& p = get(parent);
  DIL_CHECK(!seqs_.count(child), "sequence ", child, " already registered");
  if (free_slots_.empty()) return false;
  SeqState c;
  c.blocks = p.blocks;
  c.n_tokens = p.n_tokens;
  for (int32_t b : c.blocks) ++refcount_[b];
  c.slot = free_slots_.back();
  free_slots_.pop_back();
  slot_used_[c.slot] = 1;
  copies->push_back({CopyOp::Kind::Slot, p.slot, c.slot});
  seqs_.emplace(child, std::move(c));
  return true;
}

void KvManager::free(int64_t seq) {
  auto it = seqs_.find(seq);
  DIL_CHECK(it != seqs_.end(), "free of unknown sequence ", seq);
  // Release in reverse so a sequence's blocks come back in allocation order next time.
  for (auto b = it->second.blocks.rbegin(); b != it->second.blocks.rend(); ++b) drop_block(*b);
  int32_t s = it->second.slot;
  DIL_CHECK(slot_used_[s], "double free of slot ", s);
  slot_used_[s] = 0;
  free_slots_.push_back(s);
  seqs_.erase(it);
}

void KvManager::check_invariants() const {
  std::vector<int32_t> refs(refcount_.size(), 0);
  std::vector<uint8_t> slots(slot_used_.size(), 0);
  for (const auto& [id, st] : seqs_) {
    int64_t want = (st.n_tokens + block_tokens_ - 1) / block_tokens_;
    DIL_CHECK(int64_t(st.blocks.size()) == want, "seq ", id, " holds ", st.blocks.size(), " blocks for ",
              st.n_tokens, " tokens");
    for (int32_t b : st.blocks) {
      DIL_CHECK(b >= 0 && b < total_blocks(), "seq ", id, " holds bad block ", b);
      ++refs[b];
    }
    DIL_CHECK(st.slot >= 0 && st.slot < total_slots(), "seq ", id, " holds bad slot ", st.slot);
    DIL_CHECK(!slots[st.slot], "slot ", st.slot, " owned twice");
    slots[st.slot] = 1;
  }
  std::vector<uint8_t> on_free(refcount_.size(), 0);
  for (int32_t b : free_blocks_) {
    DIL_CHECK(b >= 0 && b < total_blocks() && !on_free[b], "block ", b, " twice on the free list");
    on_free[b] = 1;
  }
  for (size_t b = 0; b < refcount_.size(); ++b) {
    DIL_CHECK(refs[b] == refcount_[b], "block ", b, " refcount ", refcount_[b], " but ", refs[b], " owners");
    DIL_CHECK(on_free[b] == (refs[b] == 0), "block ", b, " free-list membership wrong (", refs[b], " owners)");
  }
  std::vector<uint8_t> slot_free(slot_used_.size(), 0);
  for (int32_t s : free_slots_) {
    DIL_CHECK(s >= 0 && s < total_slots() && !slot_free[s], "slot ", s, " twice on the free list");
    slot_free[s] = 1;
  }
  for (size_t s = 0; s < slot_used_.size(); ++s) {
    DIL_CHECK(slot_used_[s] == slots[s], "slot ", s, " in-use flag disagrees with the owners");
    DIL_CHECK(slot_free[s] != slots[s], "slot ", s, " is both owned and free, or neither");
  }
}

}  // namespace dil::runtime
