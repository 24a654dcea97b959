// Token-budget scheduler (the vLLM v1 style, serving-notes §2.2, §2.4).
//
// Every step each running sequence gets a token count: what it still has to compute (a
// prefill chunk of any size, or 1 decode token), capped by what is left of
// max_num_batched_tokens. Running sequences go first, oldest first; then waiting ones are
// admitted in arrival order (FCFS) while the budget, max_num_seqs, a state slot and the blocks
// of their first chunk are available. The queue never skips its head, so no request starves.
//
// When a running sequence cannot get the blocks for its chunk, the newest running sequence is
// preempted by recomputation: all its blocks and its slot are freed, it goes back to the
// waiting queue in arrival order and later recomputes prompt + generated tokens from position 0.
// No admissions happen in a step that preempted (they would be the next victims).
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "runtime/kv_manager.h"
#include "runtime/sequence.h"

namespace dil::runtime {

struct ScheduledChunk {
  Sequence* seq = nullptr;
  int start = 0;      // first position computed (== seq->num_computed)
  int n_tokens = 0;
  bool sample = false;  // the chunk reaches the end of the known tokens: sample the next one
};

struct Schedule {
  std::vector<ScheduledChunk> chunks;   // running order (oldest first), then admissions
  std::vector<Sequence*> preempted;
  int n_tokens = 0;
};

class Scheduler {
 public:
  Scheduler(int max_num_seqs, int max_num_batched_tokens, KvManager& kv);
  void add(Sequence* s);      // a new sequence: to the waiting queue
  void finish(Sequence* s);   // removes it from the queues and frees its cache state
  Schedule schedule();
  size_t n_running() const { return running_.size(); }
  size_t n_waiting() const { return waiting_.size(); }
  int64_t preemptions() const { return preemptions_; }

 private:
  void preempt(Sequence* s);
  int max_num_seqs_, max_num_batched_tokens_;
  KvManager& kv_;
  std::map<int64_t, Sequence*> running_;  // by arrival id
  std::map<int64_t, Sequence*> waiting_;  // by arrival id (preempted ones return to their place)
  int64_t preemptions_ = 0;
};

}  // namespace dil::runtime
