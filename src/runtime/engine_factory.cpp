// make_engine: backend + real model from EngineOptions. Kept apart from engine.cpp so the
// engine (and its tests with a fake model) builds without the model loader.
#include "core/check.h"
#include "runtime/engine_internal.h"
#include "runtime/model_drafter.h"
#include "runtime/ngram_drafter.h"

namespace dil {

namespace runtime {

std::unique_ptr<Drafter> make_drafter(const EngineOptions& opts, const ModelConfig& cfg) {
  const std::string& m = opts.speculative;
  // Checked before "off" returns: a confidence cut without DSpark is a mistake to report.
  if (!(opts.dspark_min_survival >= 0.0 && opts.dspark_min_survival <= 1.0))
    DIL_FAIL("dspark_min_survival must be in [0, 1], got ", opts.dspark_min_survival);
  if (opts.dspark_min_survival > 0.0 && m != "dspark")
    DIL_FAIL("dspark_min_survival is DSpark's confidence cut: it needs speculative 'dspark', not '", m, "'");
  if (m == "off") return nullptr;
  if (opts.num_speculative_tokens < 1)
    DIL_FAIL("num_speculative_tokens must be >= 1 with speculative decoding, got ", opts.num_speculative_tokens);
  if (m == "ngram") return std::make_unique<NgramDrafter>(opts.num_speculative_tokens);
  // The model's own drafter: made by build() once the model (which runs it) is loaded.
  if (m == "mtp") {
    if (cfg.arch != Arch::V4 || cfg.n_mtp < 1)
      DIL_FAIL("speculative 'mtp' needs V4's MTP layer (mtp.0); ", cfg.model_type, " has ",
               cfg.arch == Arch::V4 ? "num_nextn_predict_layers 0" : "DSpark stages instead (--speculative dspark)");
    return nullptr;
  }
  if (m == "dspark") {
    if (cfg.arch != Arch::V41 || cfg.n_mtp < 1)
      DIL_FAIL("speculative 'dspark' needs V4.1's DSpark stages (mtp.0..2); ", cfg.model_type, " has ",
               cfg.arch == Arch::V41 ? "num_nextn_predict_layers 0" : "an MTP layer instead (--speculative mtp)");
    if (opts.num_speculative_tokens > cfg.dspark_block_size)
      DIL_FAIL("speculative 'dspark' drafts at most dspark_block_size = ", cfg.dspark_block_size,
               " tokens per step; --num-speculative-tokens is ", opts.num_speculative_tokens);
    return nullptr;
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
  // The drafter weights (mtp.*) are bound only when the drafter that runs them is asked for.
  mo.load_mtp = from_opts && (opts.speculative == "mtp" || opts.speculative == "dspark");
  mo.on_progress = opts.on_load_progress;
  mo.load_format = opts.load_format;
  mo.layers = opts.layers;
  auto model = load_model(opts.model_dir, *backend, mo);
  if (mo.load_mtp)
    drafter = std::make_unique<ModelDrafter>(*model, opts.num_speculative_tokens, opts.dspark_min_survival);
  return make_engine_with_model(opts, std::move(model), std::move(backend), nullptr, nullptr, std::move(drafter));
}

}  // namespace

std::unique_ptr<Engine> make_engine_with_drafter(const EngineOptions& opts, std::unique_ptr<Drafter> drafter) {
  return build(opts, std::move(drafter), false);
}

}  // namespace runtime

std::unique_ptr<Engine> make_engine(const EngineOptions& opts) { return runtime::build(opts, nullptr, true); }

}  // namespace dil
