// The KV/state manager: which cache memory each sequence owns.
//
// Two kinds of per-sequence state (model-spec §3.9, §4.9):
// - paged blocks: compressed KV rows and indexer keys, which grow with the sequence. A block
//   covers `block_tokens` token positions (a multiple of 128, so no compression window
//   straddles two blocks); logical block i of a sequence holds positions
//   [i*block_tokens, (i+1)*block_tokens). Blocks are reference counted so a fork (n>1, prefix
//   caching later) can share them; a write into a shared partially filled block copies it first.
// - one state slot: fixed-size recurrent state (SWA rings, compressor partial state, Engram
//   history), `CacheSpec::bytes_per_slot` bytes whatever the length.
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
};

class KvManager {
 public:
  // bytes_per_block / bytes_per_slot: CacheSpec of the model (for byte accounting only).
  KvManager(int32_t n_blocks, int32_t n_slots, int block_tokens, size_t bytes_per_block, size_t bytes_per_slot);

  // Registers `seq` with a fresh state slot and no blocks. False when no slot is free.
  bool add(int64_t seq);
  bool has(int64_t seq) const { return seqs_.count(seq) != 0; }
  // Blocks `seq` would have to allocate to hold `n_tokens` positions (including the copy of a
  // shared partial last block).
  int32_t blocks_needed(int64_t seq, int64_t n_tokens) const;
  // Makes the table of `seq` cover `n_tokens` positions, all or nothing: false (and no change)
  // when too few blocks are free. Appends a CopyOp to `cow` when a shared partially filled last
  // block is replaced by a private copy.
  bool reserve(int64_t seq, int64_t n_tokens, std::vector<CopyOp>* cow = nullptr);
  // `child` becomes a copy of `parent`: shares every block (refcount + 1) and gets a new slot
  // whose contents must be copied (CopyOp in `copies`). False when no slot is free.
  bool fork(int64_t parent, int64_t child, std::vector<CopyOp>* copies);
  // Releases the slot and one reference of every block.
  void free(int64_t seq);

  const std::vector<int32_t>& blocks(int64_t seq) const;
  int32_t slot(int64_t seq) const;
  int64_t reserved_tokens(int64_t seq) const;

  int block_tokens() const { return block_tokens_; }
  int32_t total_blocks() const { return int32_t(refcount_.size()); }
  int32_t free_blocks() const { return int32_t(free_blocks_.size()); }
  int32_t total_slots() const { return int32_t(slot_used_.size()); }
  int32_t free_slots() const { return int32_t(free_slots_.size()); }
  size_t bytes_per_block() const { return bytes_per_block_; }
  size_t bytes_per_slot() const { return bytes_per_slot_; }
  size_t total_bytes() const { return total_blocks() * bytes_per_block_ + total_slots() * bytes_per_slot_; }
  size_t used_bytes() const {
    return size_t(total_blocks() - free_blocks()) * bytes_per_block_ +
           size_t(total_slots() - free_slots()) * bytes_per_slot_;
  }
  int32_t refcount(int32_t block) const { return refcount_.at(block); }
  size_t n_seqs() const { return seqs_.size(); }

  // Recomputes every refcount from the tables and checks it against the stored one, that the
  // free lists hold exactly the unreferenced blocks/slots once each, and that every table
  // covers its reserved tokens exactly. Aborts (DIL_CHECK) on a violation.
  void check_invariants() const;

 private:
  struct SeqState {
    std::vector<int32_t> blocks;
    int32_t slot = -1;
    int64_t n_tokens = 0;  // positions reserved
  };
  int32_t take_block();
  void drop_block(int32_t b);
  const SeqState& get(int64_t seq) const;

  int block_tokens_;
  size_t bytes_per_block_, bytes_per_slot_;
  std::vector<int32_t> refcount_;      // [n_blocks]
  std::vector<int32_t> free_blocks_;   // stack of unreferenced blocks
  std::vector<uint8_t> slot_used_;     // [n_slots]
  std::vector<int32_t> free_slots_;    // stack of unused slots
  std::unordered_map<int64_t, SeqState> seqs_;
};

}  // namespace dil::runtime
