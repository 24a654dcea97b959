#include "runtime/scheduler.h"

#include <algorithm>

#include "core/check.h"

namespace dil::runtime {

Scheduler::Scheduler(int max_num_seqs, int max_num_batched_tokens, KvManager& kv)
    : max_num_seqs_(max_num_seqs), max_num_batched_tokens_(max_num_batched_tokens), kv_(kv) {
  DIL_CHECK(max_num_seqs > 0 && max_num_batched_tokens > 0, "bad scheduler limits");
}

void Scheduler::add(Sequence* s) {
  s->status = Sequence::Status::Waiting;
  s->num_computed = 0;
  waiting_.emplace(s->id, s);
}

void Scheduler::finish(Sequence* s) {
  running_.erase(s->id);
  waiting_.erase(s->id);
  if (kv_.has(s->id)) kv_.free(s->id);
  s->status = Sequence::Status::Finished;
}

void Scheduler::preempt(Sequence* s) {
  kv_.free(s->id);
  running_.erase(s->id);
  s->num_computed = 0;
  s->status = Sequence::Status::Waiting;
  ++s->preemptions;
  ++preemptions_;
  waiting_.emplace(s->id, s);
}

Schedule Scheduler::schedule() {
  Schedule out;
  int budget = max_num_batched_tokens_;
  std::vector<CopyOp> cow;  // stays empty: the engine never forks (yet)

  // 1. Running sequences, oldest first. Victims are taken from the newest end, which has not
  //    been scheduled in this step yet; `end` shrinks as they go.
  std::vector<Sequence*> run;
  for (auto& [id, s] : running_) run.push_back(s);
  size_t end = run.size();
  for (size_t i = 0; i < end && budget > 0; ++i) {
    Sequence* s = run[i];
    const int n = std::min(s->len() - s->num_computed, budget);
    DIL_CHECK(n > 0, "running sequence ", s->id, " has nothing to compute");
    bool ok = false;
    for (;;) {
      if (kv_.reserve(s->id, s->num_computed + n, &cow)) {
        ok = true;
        break;
      }
      Sequence* victim = run[--end];
      preempt(victim);
      out.preempted.push_back(victim);
      if (victim == s) break;
    }
    if (!ok) break;
    out.chunks.push_back({s, s->num_computed, n, s->num_computed + n == s->len()});
    budget -= n;
  }

  // 2. Waiting sequences in arrival order, never skipping the head.
  while (out.preempted.empty() && budget > 0 && !waiting_.empty() && int(running_.size()) < max_num_seqs_) {
    Sequence* s = waiting_.begin()->second;
    const int n = std::min(s->len() - s->num_computed, budget);
    if (!kv_.add(s->id)) break;
    if (!kv_.reserve(s->id, s->num_computed + n, &cow)) {
      kv_.free(s->id);
      break;
    }
    waiting_.erase(waiting_.begin());
    running_.emplace(s->id, s);
    s->status = Sequence::Status::Running;
    out.chunks.push_back({s, s->num_computed, n, s->num_computed + n == s->len()});
    budget -= n;
  }
  DIL_CHECK(cow.empty(), "copy-on-write without a fork");
  out.n_tokens = max_num_batched_tokens_ - budget;
  return out;
}

}  // namespace dil::runtime
