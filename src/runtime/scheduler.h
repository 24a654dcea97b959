// Token-budget scheduler (the vLLM v1 style, serving-notes §2.2, §2.4).
//
// Every step each running sequence gets a token count: what it still has to compute (a
// prefill chunk of any size, or 1 decode token), capped by what is left of
// max_num_batched_tokens. Running sequences go first, oldest first; then waiting ones are
// admitted in arrival order (FCFS) while the budget, max_num_seqs, a state slot and the blocks
// of their first chunk are available. The queue never skips its head, so no request starves.
//
// With a prefix cache (prefix_cache.h), admission first looks the sequence's tokens up: a hit
// shares the cached blocks, copies the snapshot into the new slot (a CopyOp before the forward)
// and starts the sequence at the hit. A chunk never runs past one of the sequence's snapshot
// positions (Sequence::snapshot_at), so after the step its state there can be recorded.
//
// Speculative decoding: a running sequence with a draft (Sequence::draft) whose known tokens
// fit the budget gets them plus as much of its draft as the rest of the budget allows (drafts
// count in max_num_batched_tokens and in the blocks reserved); otherwise its draft is dropped.
//
// When a running sequence cannot get the blocks for its chunk, the newest running sequence is
// preempted by recomputation: all its blocks and its slot are freed, it goes back to the
// waiting queue in arrival order and later recomputes prompt + generated tokens from position 0
// (from a prefix-cache hit where there is one). Cached blocks nobody reads are reclaimed before
// anyone is preempted. No admissions happen in a step that preempted (they would be the next
// victims).
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "runtime/kv_manager.h"
#include "runtime/prefix_cache.h"
#include "runtime/sequence.h"

namespace dil::runtime {

struct ScheduledChunk {
  Sequence* seq = nullptr;
  int start = 0;      // first position computed (== seq->num_computed)
  int n_tokens = 0;
  bool sample = false;  // the chunk reaches the end of the known tokens: sample the next one
  // Speculative decoding: the chunk also scores seq->draft[0..n_draft) after the known tokens
  // (n_tokens includes them); only a chunk that reaches the end of the known tokens drafts.
  int n_draft = 0;
};

struct Schedule {
  std::vector<ScheduledChunk> chunks;   // running order (oldest first), then admissions
  std::vector<Sequence*> preempted;
  std::vector<CopyOp> copies;           // to run, in order, before the forward (copy-on-write, restores)
  int n_tokens = 0;
};

struct PrefixCacheCounters {
  int64_t queries = 0;  // tokens of the admitted sequences looked up (vLLM's prefix_cache_queries)
  int64_t hits = 0;     // of which found in the cache (vLLM's prefix_cache_hits)
};

class Scheduler {
 public:
  // `cache`: nullptr = no prefix cache.
  Scheduler(int max_num_seqs, int max_num_batched_tokens, KvManager& kv, PrefixCache* cache = nullptr);
  void add(Sequence* s);      // a new sequence: to the waiting queue
  void finish(Sequence* s);   // removes it from the queues and frees its cache state
  Schedule schedule();
  // After the step's forward (num_computed advanced): records the snapshots of the chunks that
  // ended at a snapshot position; their copies go to `copies` (to run before the next forward).
  void after_forward(const Schedule& s, std::vector<CopyOp>* copies);
  // `child` (not queued) becomes a running copy of `parent` (fork: shared blocks, its slot a
  // copy, in `copies`). False when max_num_seqs or the slots do not allow another sequence.
  bool fork(Sequence* parent, Sequence* child, std::vector<CopyOp>* copies);
  size_t n_running() const { return running_.size(); }
  size_t n_waiting() const { return waiting_.size(); }
  int64_t preemptions() const { return preemptions_; }
  const PrefixCacheCounters& prefix_counters() const { return counters_; }

 private:
  void preempt(Sequence* s);
  bool admit(Sequence* s, int budget, Schedule* out);
  int chunk_tokens(Sequence* s, int budget) const;
  void plan_snapshots(Sequence* s, const PrefixMatch& m) const;
  int max_num_seqs_, max_num_batched_tokens_;
  KvManager& kv_;
  PrefixCache* cache_;
  std::map<int64_t, Sequence*> running_;  // by arrival id
  std::map<int64_t, Sequence*> waiting_;  // by arrival id (preempted ones return to their place)
  int64_t preemptions_ = 0;
  PrefixCacheCounters counters_;
};

}  // namespace dil::runtime
