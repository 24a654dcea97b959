// Engine construction around an already built model (tests use a fake model; make_engine
// loads the real one). Not part of the public API: it exposes Model.
#pragma once
#include <memory>

#include "backend/backend.h"
#include "dil/engine.h"
#include "model/model.h"

namespace dil::runtime {

// Takes ownership of `model` and of `backend` (may be null when the model needs none); the
// backend outlives the model. Sizes and allocates the cache (model->allocate_cache) and starts
// the engine thread. Throws dil::Error on options that cannot work (block size, pool smaller
// than max_model_len).
std::unique_ptr<Engine> make_engine_with_model(const EngineOptions& opts, std::unique_ptr<Model> model,
                                               std::unique_ptr<Backend> backend = nullptr);

// Pool geometry for `opts` and a model's cache spec (the engine's start-up arithmetic).
struct PoolPlan {
  int64_t n_blocks = 0;
  int n_slots = 0;
};
PoolPlan plan_pool(const EngineOptions& opts, const CacheSpec& spec);

}  // namespace dil::runtime
