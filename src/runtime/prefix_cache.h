// The prefix cache over the hybrid state (issue 22; serving-notes §2.3).
//
// What a prefix of n tokens leaves behind has two parts:
// - the paged blocks of positions [0, n): compressed rows and indexer keys (V4.1: of the kv
//   sources). A full block never changes once its last position is computed, so it can be
//   shared read-only by every sequence with the same prefix.
// - the state slot at position n: SWA rings (the last window), compressor partial state (V4's
//   overlap rows included), V4.1's Engram look-back. It is a function of the prefix, but it is
//   overwritten as the sequence goes on, so it is kept as a snapshot: a copy of the slot, taken
//   right after the step whose chunk ended at n (the scheduler cuts chunks there).
// A hit at n adopts the blocks, copies the snapshot into the new sequence's slot and starts it at
// position n, which computes exactly what the sequence computed cold (chunking never changes the
// result). A hit inside a block (n not a multiple of block_tokens) shares that partial block too;
// the sequence's first write into it copies it (copy-on-write at the first divergent block).
//
// Index: full blocks are keyed by a hash chain, key_i = H(key_{i-1}, tokens of block i) with
// key_-1 = H(salt), where the salt carries everything besides token ids that changes the state
// (model, numerics mode, block size; image hashes when images come); every hit is also checked
// token by token, so a hash collision is a miss, never a wrong reuse. A partial tail (a prefix
// that ends inside a block) hangs off its last full block and is matched by comparing tokens.
// Entries are named by their block (each cached block belongs to one entry).
//
// Where snapshots are taken (the trade-off: a V4-Flash slot is ~24 MB in f32, ~13 blocks' worth,
// so one per block is far too much): at the end of each prompt (what the next turn of a chat
// extends), and where a prompt first diverges from what the cache holds when that is at least a
// block past the prompt's hit (a shared system prompt: from the third request on, every request
// hits it). A hit must leave at least one token to compute (the logits of the last one).
//
// Eviction is LRU and on demand (KvManager's Reclaimer): a block comes back by evicting the
// least recently used leaf entry no sequence holds; a slot by dropping the least recently used
// cold snapshot (never hit, not a divergence point), else the least recently used hot one (a
// partial entry goes with its snapshot). A sequence holding a cached block holds its
// ancestors too, so every cached block no sequence holds is reachable that way.
#pragma once
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/kv_manager.h"

namespace dil::runtime {

struct PrefixMatch {
  int64_t tokens = 0;           // positions the hit covers (0: no hit)
  std::vector<int32_t> blocks;  // [ceil(tokens / block_tokens)] blocks holding them (to share)
  int32_t snapshot = -1;        // slot holding the state at `tokens`
  int64_t shared = 0;           // longest prefix of the query the cache holds tokens of (>= tokens)
};

class PrefixCache final : public Reclaimer {
 public:
  PrefixCache(KvManager& kv, const std::string& salt);

  // The longest cached prefix of `tokens` that ends at most at `limit` and has a snapshot.
  // Marks what it matched as used (LRU).
  PrefixMatch lookup(std::span<const int32_t> tokens, int64_t limit);
  // Records the first `n` positions of `seq`: `tokens` (its token ids), the blocks of its table
  // (a full block already cached under the same key replaces the sequence's own copy in its
  // table) and, when the cache has no snapshot of that prefix yet, a copy of its slot taken now
  // (appended to `copies`, to run before the next step writes the slot). False when no snapshot
  // exists afterwards (no slot to spare, a hash collision, or a copy of a cached block that its
  // forks read too: it stays, and nothing past it is recorded).
  // `shared`: the position is where prompts diverge (a prefix others share): its snapshot is
  // hot from the start (evicted after the cold ones, see snap_key).
  bool insert(int64_t seq, std::span<const int32_t> tokens, int64_t n, bool shared, std::vector<CopyOp>* copies);

  bool reclaim_block() override;
  bool reclaim_slot() override;

  int64_t evictions() const { return evictions_; }  // entries dropped to give memory back
  // Parent/child links, the LRU sets, the hash index and the reclaim reachability (a cached block
  // a sequence holds has its parent held too). Aborts on a violation.
  void check_invariants() const;

 private:
  struct Entry {
    bool live = false;
    bool full = false;              // covers block_tokens positions; else a partial tail (a leaf)
    int32_t parent = -1;            // the parent entry's block; -1: the root
    uint64_t key = 0;               // chain hash (full entries)
    int32_t snapshot = -1;          // slot with the state after this entry's last token
    uint64_t used = 0;              // LRU tick
    bool hot = false;               // its snapshot was hit, or records a shared prefix
    std::vector<int32_t> tokens;    // the token ids of the positions this entry covers
    std::vector<int32_t> children;  // blocks of the child entries
  };
  uint64_t chain_key(uint64_t parent_key, std::span<const int32_t> block) const;
  std::vector<int32_t>& children_of(int32_t parent) { return parent < 0 ? root_children_ : entries_[size_t(parent)].children; }
  const std::vector<int32_t>& children_of(int32_t parent) const {
    return parent < 0 ? root_children_ : entries_[size_t(parent)].children;
  }
  int32_t add_entry(int32_t block, int32_t parent, bool full, uint64_t key, std::span<const int32_t> tokens);
  static constexpr uint64_t kHot = 1ull << 63;
  std::pair<uint64_t, int32_t> snap_key(int32_t b) const;
  void touch(int32_t b, bool hot = false);
  void drop_snapshot(int32_t b);
  void evict(int32_t b);

  KvManager& kv_;
  uint64_t salt_;
  uint64_t tick_ = 0;
  int64_t evictions_ = 0;
  std::vector<Entry> entries_;                        // [n_blocks] by block
  std::vector<int32_t> root_children_;
  std::unordered_map<uint64_t, int32_t> index_;       // full entries: chain key -> block
  std::set<std::pair<uint64_t, int32_t>> leaves_;     // (used, block) of entries without children
  std::set<std::pair<uint64_t, int32_t>> snapshots_;  // snap_key of entries with a snapshot
};

}  // namespace dil::runtime
