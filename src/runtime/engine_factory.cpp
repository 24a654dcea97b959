// make_engine: backend + real model from EngineOptions. Kept apart from engine.cpp so the
// engine (and its tests with a fake model) builds without the model loader.
#include "core/check.h"
#include "runtime/engine_internal.h"
#include "runtime/ngram_drafter.h"

namespace dil {

namespace runtime {

std::unique_ptr<Drafter> make_drafter(const EngineOptions& opts, const ModelConfig& cfg) {
  const std::string& m = opts.speculative;
  if (m == "off") return nullptr;
  if (opts.num_speculative_tokens < 1)
    DIL_FAIL("num_speculative_tokens must be >= 1 with speculative decoding, got ", opts.num_speculative_tokens);
  if (m == "ngram") return std::make_unique<NgramDrafter>(opts.num_speculative_tokens);
  if (m == "mtp" || m == "dspark") {
    const char* want = m == "mtp" ? "V4's MTP layer (mtp.0)" : "V4.1's DSpark drafter (mtp.0..2)";
    DIL_FAIL("speculative '", m, "': ", want, " is not implemented yet (", cfg.model_type,
             "); use 'ngram' or 'off'");
  }
  DIL_FAIL("unknown speculative method '", m, "' (off, ngram, mtp, dspark)");
}

namespace {

std::unique_ptr<Engine> build(const EngineOptions& opts, std::unique_ptr<Drafter> drafter, bool from_opts) {
  if (opts.model_dir.empty()) DIL_FAIL("make_engine: no model_dir");
  const ModelConfig cfg = load_model_config(opts.model_dir);
  if (from_opts) drafter = make_drafter(opts, cfg);  // before the load: a bad option fails fast
  auto backend = make_backend(parse_backend_kind(opts.device), opts.device_index);
  ModelOptions mo;
  mo.numerics = parse_numerics(opts.numerics);
  // The drafter weights (mtp.*) are bound only by the drafters that run them (none yet).
  mo.load_mtp = false;
  mo.on_progress = opts.on_load_progress;
  auto model = load_model(opts.model_dir, *backend, mo);
  return make_engine_with_model(opts, std::move(model), std::move(backend), nullptr, nullptr, std::move(drafter));
}

}  // namespace

std::unique_ptr<Engine> make_engine_with_drafter(const EngineOptions& opts, std::unique_ptr<Drafter> drafter) {
  return build(opts, std::move(drafter), false);
}

}  // namespace runtime

std::unique_ptr<Engine> make_engine(const EngineOptions& opts) { return runtime::build(opts, nullptr, true); }

}  // namespace dil
