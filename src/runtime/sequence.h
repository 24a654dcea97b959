// One request as the engine thread sees it. Owned by the engine; the scheduler and the KV
// manager refer to it by pointer / by `id`.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "dil/engine.h"

namespace dil::runtime {

class Stream;

struct Sequence {
  enum class Status : uint8_t { Waiting, Running, Finished };
  int64_t id = 0;                // arrival order: lower = older (FCFS and preemption order)
  std::string request_id;
  std::vector<int32_t> tokens;   // prompt followed by the generated tokens
  int prompt_len = 0;
  int num_computed = 0;          // leading tokens whose state is in the cache
  SamplingParams sampling;
  StopParams stop;
  std::shared_ptr<TokenConstraint> constraint;  // structured output, or null
  uint64_t seed = 0;             // the request's seed or one drawn from the engine's generator
  Status status = Status::Waiting;
  int preemptions = 0;
  std::shared_ptr<Stream> stream;
  // Prefix cache (prefix_cache.h): positions, ascending, where this sequence's state is recorded
  // in the cache; the scheduler ends a chunk at each, the step after it records the snapshot.
  std::vector<int> snapshot_at;
  // Prompt tokens it did not compute: the prefix-cache hit of its first admission, or the whole
  // prompt for a choice forked from another request's prefill; -1 until admitted.
  int cached_tokens = -1;
  // Fork (n > 1, or any requests with the same prompt in flight together): a follower waits for
  // its leader's prefill instead of queueing, then shares its blocks and a copy of its slot.
  Sequence* leader = nullptr;
  std::vector<Sequence*> followers;
  // Speculative decoding (drafter.h): the drafter's proposal for the tokens after the last one,
  // set before scheduling; the scheduler truncates it to the budget (it counts there) and the
  // step verifies what it kept. Empty when not drafting.
  std::vector<int32_t> draft;

  int len() const { return int(tokens.size()); }
  int num_generated() const { return len() - prompt_len; }
};

}  // namespace dil::runtime
