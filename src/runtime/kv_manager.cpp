#include "runtime/kv_manager.h"

#include "core/check.h"

namespace dil::runtime {

KvManager::KvManager(int32_t n_blocks, int32_t n_seq_slots, int block_tokens, size_t bytes_per_block,
                     size_t bytes_per_slot, int32_t n_extra_slots)
    : block_tokens_(block_tokens), bytes_per_block_(bytes_per_block), bytes_per_slot_(bytes_per_slot),
      seq_slot_limit_(n_seq_slots) {
  DIL_CHECK(n_blocks >= 0 && n_seq_slots >= 0 && n_extra_slots >= 0 && block_tokens > 0, "bad cache geometry");
  refcount_.assign(size_t(n_blocks), 0);
  cached_.assign(size_t(n_blocks), 0);
  slot_state_.assign(size_t(n_seq_slots + n_extra_slots), SlotState::Free);
  // Stacks popped from the back: block 0 / slot 0 are handed out first (readable traces).
  for (int32_t b = n_blocks - 1; b >= 0; --b) free_blocks_.push_back(b);
  for (int32_t s = total_slots() - 1; s >= 0; --s) free_slots_.push_back(s);
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
  while (free_blocks_.empty() && reclaimer_ && reclaimer_->reclaim_block()) {
  }
  DIL_CHECK(!free_blocks_.empty(), "no free block");
  int32_t b = free_blocks_.back();
  free_blocks_.pop_back();
  DIL_CHECK(refcount_[size_t(b)] == 0 && !cached_[size_t(b)], "block ", b, " on the free list has refcount ",
            refcount_[size_t(b)]);
  refcount_[size_t(b)] = 1;
  return b;
}

void KvManager::ref_block(int32_t b) {
  DIL_CHECK(b >= 0 && b < total_blocks() && refcount_[size_t(b)] > 0, "reference of unowned block ", b);
  if (cached_[size_t(b)] && refcount_[size_t(b)] == 1) --reclaimable_;
  ++refcount_[size_t(b)];
}

void KvManager::drop_block(int32_t b) {
  DIL_CHECK(b >= 0 && b < total_blocks() && refcount_[size_t(b)] > 0, "double free of block ", b);
  const int32_t r = --refcount_[size_t(b)];
  if (cached_[size_t(b)] && r == 1) ++reclaimable_;
  if (r == 0) free_blocks_.push_back(b);
}

int32_t KvManager::take_slot(SlotState as) {
  while (free_slots_.empty() && reclaimer_ && reclaimer_->reclaim_slot()) {
  }
  if (free_slots_.empty()) return -1;
  const int32_t s = free_slots_.back();
  free_slots_.pop_back();
  DIL_CHECK(slot_state_[size_t(s)] == SlotState::Free, "slot ", s, " handed out twice");
  slot_state_[size_t(s)] = as;
  return s;
}

bool KvManager::add(int64_t seq) {
  DIL_CHECK(!seqs_.count(seq), "sequence ", seq, " already registered");
  if (seq_slots() >= seq_slot_limit_) return false;
  SeqState st;
  st.slot = take_slot(SlotState::Seq);
  if (st.slot < 0) return false;
  seqs_.emplace(seq, std::move(st));
  return true;
}

int32_t KvManager::blocks_needed(int64_t seq, int64_t n_tokens) const {
  const SeqState& st = get(seq);
  if (n_tokens <= st.n_tokens) return 0;
  int64_t want = (n_tokens + block_tokens_ - 1) / block_tokens_;
  int32_t need = int32_t(want - int64_t(st.blocks.size()));
  // The next write lands in a partially filled last block: a shared one must be copied first.
  if (st.n_tokens % block_tokens_ != 0 && refcount_[size_t(st.blocks.back())] > 1) need += 1;
  return need;
}

bool KvManager::reserve(int64_t seq, int64_t n_tokens, std::vector<CopyOp>* cow) {
  int32_t need = blocks_needed(seq, n_tokens);
  if (need > available_blocks()) return false;
  SeqState& st = seqs_.at(seq);
  if (n_tokens <= st.n_tokens) return true;
  if (st.n_tokens % block_tokens_ != 0 && refcount_[size_t(st.blocks.back())] > 1) {
    int32_t old = st.blocks.back();
    int32_t fresh = take_block();  // never reclaims `old`: this sequence still holds it
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
  DIL_CHECK(!seqs_.count(child), "sequence ", child, " already registered");
  get(parent);
  if (seq_slots() >= seq_slot_limit_) return false;
  const int32_t slot = take_slot(SlotState::Seq);
  if (slot < 0) return false;
  const SeqState& p = seqs_.at(parent);  // after take_slot: reclaiming never touches sequences
  SeqState c;
  c.blocks = p.blocks;
  c.n_tokens = p.n_tokens;
  for (int32_t b : c.blocks) ref_block(b);
  c.slot = slot;
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
  DIL_CHECK(slot_state_[size_t(s)] == SlotState::Seq, "double free of slot ", s);
  slot_state_[size_t(s)] = SlotState::Free;
  free_slots_.push_back(s);
  seqs_.erase(it);
}

void KvManager::adopt(int64_t seq, const std::vector<int32_t>& blocks, int64_t n_tokens) {
  auto it = seqs_.find(seq);
  DIL_CHECK(it != seqs_.end() && it->second.blocks.empty() && it->second.n_tokens == 0, "adopt: sequence ", seq,
            " is unknown or already holds blocks");
  DIL_CHECK(int64_t(blocks.size()) == (n_tokens + block_tokens_ - 1) / block_tokens_, "adopt: ", blocks.size(),
            " blocks for ", n_tokens, " tokens");
  for (int32_t b : blocks) ref_block(b);
  it->second.blocks = blocks;
  it->second.n_tokens = n_tokens;
}

void KvManager::replace_block(int64_t seq, size_t i, int32_t b) {
  SeqState& st = seqs_.at(seq);
  DIL_CHECK(i < st.blocks.size(), "replace_block: sequence ", seq, " has no block ", i);
  if (st.blocks[i] == b) return;
  ref_block(b);
  drop_block(st.blocks[i]);
  st.blocks[i] = b;
}

void KvManager::cache_block(int32_t b) {
  DIL_CHECK(b >= 0 && b < total_blocks() && refcount_[size_t(b)] > 0 && !cached_[size_t(b)], "cache_block: block ",
            b, " is unowned or cached already");
  ++refcount_[size_t(b)];  // >= 2: a sequence holds it too, so not reclaimable yet
  cached_[size_t(b)] = 1;
  ++n_cached_;
}

void KvManager::uncache_block(int32_t b) {
  DIL_CHECK(b >= 0 && b < total_blocks() && cached_[size_t(b)], "uncache_block: block ", b, " is not cached");
  if (refcount_[size_t(b)] == 1) --reclaimable_;
  cached_[size_t(b)] = 0;
  --n_cached_;
  if (--refcount_[size_t(b)] == 0) free_blocks_.push_back(b);
}

int32_t KvManager::take_snapshot_slot() {
  const int32_t s = take_slot(SlotState::Snapshot);
  if (s >= 0) ++n_snapshots_;
  return s;
}

void KvManager::release_snapshot_slot(int32_t s) {
  DIL_CHECK(s >= 0 && s < total_slots() && slot_state_[size_t(s)] == SlotState::Snapshot, "slot ", s,
            " is not a snapshot");
  slot_state_[size_t(s)] = SlotState::Free;
  free_slots_.push_back(s);
  --n_snapshots_;
}

void KvManager::check_invariants() const {
  std::vector<int32_t> refs(refcount_.size(), 0);
  std::vector<uint8_t> slots(slot_state_.size(), 0);
  for (const auto& [id, st] : seqs_) {
    int64_t want = (st.n_tokens + block_tokens_ - 1) / block_tokens_;
    DIL_CHECK(int64_t(st.blocks.size()) == want, "seq ", id, " holds ", st.blocks.size(), " blocks for ",
              st.n_tokens, " tokens");
    for (int32_t b : st.blocks) {
      DIL_CHECK(b >= 0 && b < total_blocks(), "seq ", id, " holds bad block ", b);
      ++refs[size_t(b)];
    }
    DIL_CHECK(st.slot >= 0 && st.slot < total_slots(), "seq ", id, " holds bad slot ", st.slot);
    DIL_CHECK(!slots[size_t(st.slot)], "slot ", st.slot, " owned twice");
    slots[size_t(st.slot)] = 1;
  }
  DIL_CHECK(seq_slots() <= seq_slot_limit_, seq_slots(), " sequences hold slots, limit ", seq_slot_limit_);
  std::vector<uint8_t> on_free(refcount_.size(), 0);
  for (int32_t b : free_blocks_) {
    DIL_CHECK(b >= 0 && b < total_blocks() && !on_free[size_t(b)], "block ", b, " twice on the free list");
    on_free[size_t(b)] = 1;
  }
  int32_t reclaimable = 0, n_cached = 0;
  for (size_t b = 0; b < refcount_.size(); ++b) {
    const int32_t want = refs[b] + (cached_[b] ? 1 : 0);
    DIL_CHECK(want == refcount_[b], "block ", b, " refcount ", refcount_[b], " but ", refs[b], " owners",
              cached_[b] ? " + the prefix cache" : "");
    DIL_CHECK(on_free[b] == (want == 0), "block ", b, " free-list membership wrong (", want, " owners)");
    n_cached += cached_[b] ? 1 : 0;
    reclaimable += cached_[b] && refs[b] == 0 ? 1 : 0;
  }
  DIL_CHECK(reclaimable == reclaimable_ && n_cached == n_cached_, "reclaimable ", reclaimable_, " / cached ",
            n_cached_, " but ", reclaimable, " / ", n_cached, " counted");
  std::vector<uint8_t> slot_free(slot_state_.size(), 0);
  for (int32_t s : free_slots_) {
    DIL_CHECK(s >= 0 && s < total_slots() && !slot_free[size_t(s)], "slot ", s, " twice on the free list");
    slot_free[size_t(s)] = 1;
  }
  int32_t snaps = 0;
  for (size_t s = 0; s < slot_state_.size(); ++s) {
    DIL_CHECK((slot_state_[s] == SlotState::Seq) == (slots[s] != 0), "slot ", s, " state disagrees with the owners");
    DIL_CHECK((slot_state_[s] == SlotState::Free) == (slot_free[s] != 0), "slot ", s,
              " free-list membership disagrees with its state");
    snaps += slot_state_[s] == SlotState::Snapshot ? 1 : 0;
  }
  DIL_CHECK(snaps == n_snapshots_, "snapshot slots ", n_snapshots_, " but ", snaps, " counted");
}

}  // namespace dil::runtime
