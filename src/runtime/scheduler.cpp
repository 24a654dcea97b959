#include "runtime/scheduler.h"

#include <algorithm>

#include "core/check.h"

namespace dil::runtime {

Scheduler::Scheduler(int max_num_seqs, int max_num_batched_tokens, KvManager& kv, PrefixCache* cache)
    : max_num_seqs_(max_num_seqs), max_num_batched_tokens_(max_num_batched_tokens), kv_(kv), cache_(cache) {
  DIL_CHECK(max_num_seqs > 0 && max_num_batched_tokens > 0, "bad scheduler limits");
}

void Scheduler::add(Sequence* s) {
  s->status = Sequence::Status::Waiting;
  s->num_computed = 0;
  s->snapshot_at.clear();
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
  s->snapshot_at.clear();
  s->draft.clear();
  s->status = Sequence::Status::Waiting;
  ++s->preemptions;
  ++preemptions_;
  waiting_.emplace(s->id, s);
}

// What is left to compute, within the budget, never past the next snapshot position.
int Scheduler::chunk_tokens(Sequence* s, int budget) const {
  int n = std::min(s->len() - s->num_computed, budget);
  if (!s->snapshot_at.empty()) n = std::min(n, s->snapshot_at.front() - s->num_computed);
  return n;
}

// Where to record this sequence's state (prefix_cache.h): the end of its prompt, and where it
// diverges from what the cache holds when that saves at least a block over today's hit. A
// position must leave a token to compute, as every hit must.
void Scheduler::plan_snapshots(Sequence* s, const PrefixMatch& m) const {
  s->snapshot_at.clear();
  const int64_t diverge = std::min<int64_t>(m.shared, s->len() - 1);
  if (diverge - m.tokens >= kv_.block_tokens() && diverge < s->prompt_len) s->snapshot_at.push_back(int(diverge));
  if (s->prompt_len > m.tokens) s->snapshot_at.push_back(s->prompt_len);
}

bool Scheduler::admit(Sequence* s, int budget, Schedule* out) {
  s->draft.clear();  // admissions compute known tokens only (a prefix hit may end anywhere)
  if (!kv_.add(s->id)) return false;
  PrefixMatch m;
  if (cache_) {
    m = cache_->lookup(s->tokens, s->len() - 1);
    if (m.tokens > 0) kv_.adopt(s->id, m.blocks, m.tokens);
    plan_snapshots(s, m);
  }
  s->num_computed = int(m.tokens);
  const int n = chunk_tokens(s, budget);
  if (!kv_.reserve(s->id, s->num_computed + n, &out->copies)) {
    kv_.free(s->id);  // the hit's blocks go back to the cache
    s->num_computed = 0;
    s->snapshot_at.clear();
    return false;
  }
  if (m.tokens > 0) out->copies.push_back({CopyOp::Kind::Slot, m.snapshot, kv_.slot(s->id)});
  if (cache_) {
    counters_.queries += s->len();
    counters_.hits += m.tokens;
  }
  if (s->cached_tokens < 0) s->cached_tokens = int(std::min<int64_t>(m.tokens, s->prompt_len));
  waiting_.erase(s->id);
  running_.emplace(s->id, s);
  s->status = Sequence::Status::Running;
  out->chunks.push_back({s, s->num_computed, n, s->num_computed + n == s->len()});
  return true;
}

Schedule Scheduler::schedule() {
  Schedule out;
  int budget = max_num_batched_tokens_;

  // 1. Running sequences, oldest first. Victims are taken from the newest end, which has not
  //    been scheduled in this step yet; `end` shrinks as they go.
  std::vector<Sequence*> run;
  for (auto& [id, s] : running_) run.push_back(s);
  size_t end = run.size();
  for (size_t i = 0; i < end && budget > 0; ++i) {
    Sequence* s = run[i];
    int n = chunk_tokens(s, budget);
    DIL_CHECK(n > 0, "running sequence ", s->id, " has nothing to compute");
    const bool reaches_end = s->num_computed + n == s->len();
    if (!reaches_end || n >= budget) s->draft.clear();
    if (int(s->draft.size()) > budget - n) s->draft.resize(size_t(budget - n));
    int n_draft = int(s->draft.size());
    n += n_draft;
    bool ok = false;
    for (;;) {
      if (kv_.reserve(s->id, s->num_computed + n, &out.copies)) {
        ok = true;
        break;
      }
      if (n_draft > 0) {  // a draft never preempts anyone: drop it first
        n -= n_draft;
        n_draft = 0;
        s->draft.clear();
        continue;
      }
      Sequence* victim = run[--end];
      preempt(victim);
      out.preempted.push_back(victim);
      if (victim == s) break;
    }
    if (!ok) {
      s->draft.clear();
      break;
    }
    out.chunks.push_back({s, s->num_computed, n, reaches_end, n_draft});
    budget -= n;
  }

  // 2. Waiting sequences in arrival order, never skipping the head.
  while (out.preempted.empty() && budget > 0 && !waiting_.empty() && int(running_.size()) < max_num_seqs_) {
    if (!admit(waiting_.begin()->second, budget, &out)) break;
    budget -= out.chunks.back().n_tokens;
  }
  out.n_tokens = max_num_batched_tokens_ - budget;
  return out;
}

void Scheduler::after_forward(const Schedule& sch, std::vector<CopyOp>* copies) {
  for (const ScheduledChunk& c : sch.chunks) {
    Sequence* s = c.seq;
    const int end = c.start + c.n_tokens;
    auto& at = s->snapshot_at;
    while (!at.empty() && at.front() <= end) {
      // Before the prompt's end it is a divergence point: a prefix other prompts share.
      if (at.front() == end && cache_) cache_->insert(s->id, s->tokens, end, end < s->prompt_len, copies);
      at.erase(at.begin());
    }
  }
}

bool Scheduler::fork(Sequence* parent, Sequence* child, std::vector<CopyOp>* copies) {
  DIL_CHECK(parent->status == Sequence::Status::Running, "fork of sequence ", parent->id, " that is not running");
  if (int(running_.size()) >= max_num_seqs_) return false;
  if (!kv_.fork(parent->id, child->id, copies)) return false;
  child->num_computed = parent->num_computed;
  child->snapshot_at.clear();
  child->status = Sequence::Status::Running;
  running_.emplace(child->id, child);
  return true;
}

}  // namespace dil::runtime
