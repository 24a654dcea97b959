// Engine construction around an already built model (tests use a fake model; make_engine
// loads the real one). Not part of the public API: it exposes Model.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "dil/engine.h"
#include "model/model.h"
#include "runtime/drafter.h"

namespace dil::runtime {

// Lockstep of a data-parallel rank (dp_engine.h), called on the engine thread. With a hook the
// loop never blocks on its own queue (the hook paces idle iterations) and joins every step of
// the job: it runs a forward whenever any rank has tokens, an empty one when it has none.
class StepHook {
 public:
  virtual ~StepHook() = default;
  // Once per loop iteration, before the engine drains its command queue: the host message
  // round. May call `self.submit`/`self.cancel` (the commands are handled this iteration).
  // `idle`: nothing running or waiting here. Returns true when the job stops after this
  // iteration (every rank gets the same answer in the same iteration).
  virtual bool round(Engine& self, bool idle) = 0;
  // After scheduling: this rank's token count -> every rank's, in rank order.
  virtual std::vector<int64_t> agree(int64_t n_tokens) = 0;
  // A forward failed: the ranks' collectives are out of step, so the rank must end.
  [[noreturn]] virtual void fatal(const std::string& what) = 0;
};

// Takes ownership of `model` and of `backend` (may be null when the model needs none); the
// backend outlives the model. Sizes and allocates the cache (model->allocate_cache) and starts
// the engine thread. Throws dil::Error on options that cannot work (block size, pool smaller
// than max_model_len).
// `memory`: the backend whose memory sizes the pool when the options leave it automatic
// (null: `backend`; both null: the host's memory).
// `drafter`: speculative decoding's proposer (drafter.h; null: no speculation). It replaces
// whatever opts.speculative would choose (tests inject their own drafters here).
std::unique_ptr<Engine> make_engine_with_model(const EngineOptions& opts, std::unique_ptr<Model> model,
                                               std::unique_ptr<Backend> backend = nullptr,
                                               StepHook* hook = nullptr,  // hook outlives the engine
                                               Backend* memory = nullptr, std::unique_ptr<Drafter> drafter = nullptr);
// make_engine with a given drafter (tests: oracle and random proposers on the real model).
std::unique_ptr<Engine> make_engine_with_drafter(const EngineOptions& opts, std::unique_ptr<Drafter> drafter);
// The drafter opts.speculative names, for a model of config `cfg` (null for "off", and for "mtp":
// the model runs that one, made once it is loaded).
std::unique_ptr<Drafter> make_drafter(const EngineOptions& opts, const ModelConfig& cfg);

// Pool geometry for `opts` and a model's cache spec (the engine's start-up arithmetic,
// pool_sizing.cpp).
struct PoolPlan {
  int64_t n_blocks = 0;
  int n_slots = 0;        // for sequences
  int n_extra_slots = 0;  // for prefix-cache snapshots only
  int n_spec_slots = 0;   // speculative decoding: a verify step's snapshot of each drafting sequence
  int64_t budget_bytes = 0;  // the byte budget the pool was cut from (0: kv_blocks given)
  std::string sizing;        // where the budget came from, for the start-up log
};
// The automatic budget (EngineOptions with neither kv_blocks nor kv_memory_bytes).
struct KvBudget {
  int64_t bytes = 0;
  bool automatic = false;
  std::string how;
  int64_t scratch_bytes = 0;  // the profiled step's scratch high-water mark (0: not profiled)
};
// Measures the device (CUDA: a profiling forward of the largest step; see pool_sizing.cpp) or
// the host memory (CPU, or no backend). Leaves the model's cache reallocated to a minimal one.
KvBudget auto_kv_budget(const EngineOptions& opts, const CacheSpec& spec, Model& model, Backend* be);
// Blocks the pool needs at least: one sequence of max_model_len plus the block a
// copy-on-write of its shared partial last block takes (engine.cpp).
int64_t pool_blocks_needed(const EngineOptions& opts);
// Every slot plus max_num_seqs sequences of max_model_len: the most the limits can use.
int64_t pool_bytes_at_limits(const EngineOptions& opts, const CacheSpec& spec);
PoolPlan plan_pool(const EngineOptions& opts, const CacheSpec& spec, const KvBudget& budget = {},
                   bool speculative = false);

}  // namespace dil::runtime
