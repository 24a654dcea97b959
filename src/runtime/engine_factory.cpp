// make_engine: backend + real model from EngineOptions. Kept apart from engine.cpp so the
// engine (and its tests with a fake model) builds without the model loader.
#include "core/check.h"
#include "runtime/engine_internal.h"

namespace dil {

std::unique_ptr<Engine> make_engine(const EngineOptions& opts) {
  if (opts.model_dir.empty()) DIL_FAIL("make_engine: no model_dir");
  auto backend = make_backend(parse_backend_kind(opts.device), opts.device_index);
  ModelOptions mo;
  mo.numerics = parse_numerics(opts.numerics);
  mo.load_mtp = false;  // the engine does not run speculative decoding yet
  mo.on_progress = opts.on_load_progress;
  auto model = load_model(opts.model_dir, *backend, mo);
  return runtime::make_engine_with_model(opts, std::move(model), std::move(backend));
}

}  // namespace dil
