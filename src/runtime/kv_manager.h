// The KV/state manager: which cache memory each sequence owns.
//
// Two kinds of per-sequence state (model-spec §3.9, §4.9):
// - paged blocks: compressed KV rows and indexer keys, which grow with the sequence. A block
//   covers `block_tokens` token positions (a multiple of 128, so no compression window
//   straddles two blocks); logical block i of a sequence holds positions
//   [i*block_tokens, (i+1)*block_tokens). Blocks are reference counted so that a fork (n > 1)
//   and the prefix cache can share them; a write into a shared partially filled block copies
//   it first (copy-on-write).
// - one state slot: fixed-size recurrent state (SWA rings, compressor partial state, Engram
//   history), `CacheSpec::bytes_per_slot` bytes whatever the length.
//
// The prefix cache (prefix_cache.h) holds references too: a cached block carries one extra
// reference, and a snapshot of a slot's state occupies a slot of its own. Both are reclaimable:
// when the free list is empty, a block or slot is taken back from the cache through its
// `Reclaimer` (LRU), before the scheduler has to preempt anyone. Sequences may hold at most
// `n_seq_slots` slots; the pool has `n_extra_slots` more that only snapshots use when every
// sequence slot is taken (idle sequence slots hold snapshots too, until a sequence needs them).
//
// Only the engine thread touches it (no locking). It never sees the cache's contents: a copy
// it asks for is returned as a CopyOp for the model to execute.
#pragma once
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace dil::runtime {

struct CopyOp {
  enum class Kind : uint8_t { Block, Slot };
  Kind kind = Kind::Block;
  int32_t src = 0, dst = 0;
  bool operator==(const CopyOp&) const = default;
};

// Gives memory back from the prefix cache when the free lists are empty.
class Reclaimer {
 public:
  virtual ~Reclaimer() = default;
  // Drops the cache's reference of one block that nobody else holds (the least recently used
  // one); false when there is none.
  virtual bool reclaim_block() = 0;
  // Frees one snapshot slot (the least recently used); false when the cache holds none.
  virtual bool reclaim_slot() = 0;
};

class KvManager {
 public:
  // bytes_per_block / bytes_per_slot: CacheSpec of the model (for byte accounting only).
  // Slots [0, n_seq_slots + n_extra_slots) exist; sequences hold at most n_seq_slots at once.
  KvManager(int32_t n_blocks, int32_t n_seq_slots, int block_tokens, size_t bytes_per_block, size_t bytes_per_slot,
            int32_t n_extra_slots = 0);

  void set_reclaimer(Reclaimer* r) { reclaimer_ = r; }

  // Registers `seq` with a fresh state slot and no blocks. False when no slot can be had.
  bool add(int64_t seq);
  bool has(int64_t seq) const { return seqs_.count(seq) != 0; }
  // Blocks `seq` would have to allocate to hold `n_tokens` positions (including the copy of a
  // shared partial last block).
  int32_t blocks_needed(int64_t seq, int64_t n_tokens) const;
  // Makes the table of `seq` cover `n_tokens` positions, all or nothing: false (and no change)
  // when too few blocks are available. Appends a CopyOp to `cow` when a shared partially filled
  // last block is replaced by a private copy.
  bool reserve(int64_t seq, int64_t n_tokens, std::vector<CopyOp>* cow = nullptr);
  // `child` becomes a copy of `parent`: shares every block (refcount + 1) and gets a new slot
  // whose contents must be copied (CopyOp in `copies`). False when no slot can be had.
  bool fork(int64_t parent, int64_t child, std::vector<CopyOp>* copies);
  // Releases the slot and one reference of every block.
  void free(int64_t seq);

  // Prefix-cache side (prefix_cache.cpp).
  // A just added `seq` (no blocks yet) takes a reference of each of `blocks`, which then cover
  // its first `n_tokens` positions (a cache hit).
  void adopt(int64_t seq, const std::vector<int32_t>& blocks, int64_t n_tokens);
  // Logical block i of `seq` becomes `b` (a cached block with the same contents): one reference
  // of `b` taken, the old block's dropped.
  void replace_block(int64_t seq, size_t i, int32_t b);
  // The cache's own reference of a block (one per cached block).
  void cache_block(int32_t b);
  void uncache_block(int32_t b);
  bool cached(int32_t b) const { return cached_[size_t(b)] != 0; }
  // A slot for a snapshot (a free one, else the cache's least recently used); -1 when every
  // slot is held by a sequence.
  int32_t take_snapshot_slot();
  void release_snapshot_slot(int32_t s);

  const std::vector<int32_t>& blocks(int64_t seq) const;
  int32_t slot(int64_t seq) const;
  int64_t reserved_tokens(int64_t seq) const;

  int block_tokens() const { return block_tokens_; }
  int32_t total_blocks() const { return int32_t(refcount_.size()); }
  int32_t free_blocks() const { return int32_t(free_blocks_.size()); }
  // Held only by the prefix cache: they come back on demand.
  int32_t reclaimable_blocks() const { return reclaimable_; }
  int32_t available_blocks() const { return free_blocks() + reclaimable_; }
  int32_t cached_blocks() const { return n_cached_; }
  int32_t total_slots() const { return int32_t(slot_state_.size()); }
  int32_t free_slots() const { return int32_t(free_slots_.size()); }
  int32_t seq_slot_limit() const { return seq_slot_limit_; }
  int32_t seq_slots() const { return int32_t(seqs_.size()); }
  int32_t snapshot_slots() const { return n_snapshots_; }
  size_t bytes_per_block() const { return bytes_per_block_; }
  size_t bytes_per_slot() const { return bytes_per_slot_; }
  size_t total_bytes() const { return total_blocks() * bytes_per_block_ + total_slots() * bytes_per_slot_; }
  // What sequences hold (the prefix cache's blocks and snapshots are not counted: they are
  // given back on demand).
  int32_t used_blocks() const { return total_blocks() - available_blocks(); }
  size_t used_bytes() const { return size_t(used_blocks()) * bytes_per_block_ + size_t(seq_slots()) * bytes_per_slot_; }
  int32_t refcount(int32_t block) const { return refcount_.at(block); }
  size_t n_seqs() const { return seqs_.size(); }

  // Recomputes every refcount from the tables and the cache flags and checks it against the
  // stored one, that the free lists hold exactly the unreferenced blocks/slots once each, the
  // reclaimable count, and that every table covers its reserved tokens exactly. Aborts
  // (DIL_CHECK) on a violation.
  void check_invariants() const;

 private:
  enum class SlotState : uint8_t { Free, Seq, Snapshot };
  struct SeqState {
    std::vector<int32_t> blocks;
    int32_t slot = -1;
    int64_t n_tokens = 0;  // positions reserved
  };
  int32_t take_block();
  void ref_block(int32_t b);
  void drop_block(int32_t b);
  int32_t take_slot(SlotState as);
  const SeqState& get(int64_t seq) const;

  int block_tokens_;
  size_t bytes_per_block_, bytes_per_slot_;
  int32_t seq_slot_limit_;
  Reclaimer* reclaimer_ = nullptr;
  std::vector<int32_t> refcount_;      // [n_blocks] tables + the cache's reference
  std::vector<uint8_t> cached_;        // [n_blocks] the prefix cache holds a reference
  std::vector<int32_t> free_blocks_;   // stack of unreferenced blocks
  int32_t reclaimable_ = 0;            // cached blocks with refcount 1
  int32_t n_cached_ = 0;
  std::vector<SlotState> slot_state_;  // [n_slots]
  std::vector<int32_t> free_slots_;    // stack of free slots
  int32_t n_snapshots_ = 0;
  std::unordered_map<int64_t, SeqState> seqs_;
};

}  // namespace dil::runtime
