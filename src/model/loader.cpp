#include <filesystem>

#include "core/check.h"
#include "dist/communicator.h"
#include "model/dummy_weights.h"
#include "model/load_meter.h"
#include "model/model.h"
#include "model/schema.h"
#include "model/v41_model.h"
#include "model/v4_model.h"

namespace dil {

namespace {
bool has_prefix(const SafeTensors& st, const std::string& prefix) {
  auto it = st.entries().lower_bound(prefix);
  return it != st.entries().end() && it->first.rfind(prefix, 0) == 0;
}

// The kernel plan for the model's op sites, resolved and installed before any weight is bound:
// a request nothing can run fails here, naming the site and the unmet requirements.
void plan_for(const ModelConfig& cfg, Backend& be, const ModelOptions& opt) {
  be.install_plan(be.make_plan(model_op_sites(cfg, opt.numerics, opt.layers, opt.load_mtp), opt.numerics));
}

// ModelOptions::load_mtp needs a drafter this build runs and its weights.
void check_drafter(const ModelConfig& cfg, bool has_weights, const ModelOptions& opt) {
  if (!opt.load_mtp) return;
  const bool v4 = cfg.arch == Arch::V4;
  if (cfg.n_mtp < 1)
    DIL_FAIL(cfg.model_type, ": config.json has no ", v4 ? "MTP layer" : "DSpark stages",
             " (num_nextn_predict_layers 0)");
  if (!has_weights)
    DIL_FAIL("the checkpoint has no mtp.* tensors (",
             v4 ? "V4's MTP layer, model-spec §2.2" : "V4.1's DSpark stages, model-spec §2.3", ")");
  if (opt.comm && opt.comm->size() > 1)
    DIL_FAIL("the ", v4 ? "MTP" : "DSpark", " drafter does not run with expert parallelism yet");
}

// The model of `cfg` over `st`, binding its weights under a load meter (progress reports).
std::unique_ptr<Model> build(ModelConfig cfg, std::unique_ptr<SafeTensors> st, Backend& be, const ModelOptions& opt,
                             const std::string& tokenizer_json) {
  LoadMeter meter(opt.on_progress, expected_load(*st, cfg, opt), opt.progress_interval_s);
  std::unique_ptr<Model> m;
  if (cfg.arch == Arch::V4) m = std::make_unique<V4Model>(std::move(cfg), std::move(st), be, opt, &meter);
  else m = std::make_unique<V41Model>(std::move(cfg), std::move(st), be, opt, tokenizer_json, &meter);
  meter.finish(kernel_plan_summary(be, opt));
  return m;
}
}  // namespace

ModelConfig load_model_config(const std::string& dir) {
  namespace fs = std::filesystem;
  return load_config(fs::is_directory(dir) ? (fs::path(dir) / "config.json").string() : dir);
}

std::unique_ptr<Model> load_model(const std::string& dir, Backend& be, const ModelOptions& opt) {
  namespace fs = std::filesystem;
  std::unique_ptr<SafeTensors> st;
  ModelConfig cfg;
  if (opt.load_format == "dummy") {
    cfg = load_model_config(dir);
    for (int L : opt.layers)
      if (L < 0 || L >= cfg.n_layers) DIL_FAIL("layer ", L, " outside [0, ", cfg.n_layers, ")");
    plan_for(cfg, be, opt);
    // Expert parallelism: only this rank's experts (the model binds no others).
    int e_lo = 0, e_hi = -1;
    if (opt.comm && opt.comm->size() > 1) {
      e_lo = int(int64_t(cfg.n_routed) * opt.comm->rank() / opt.comm->size());
      e_hi = int(int64_t(cfg.n_routed) * (opt.comm->rank() + 1) / opt.comm->size());
    }
    check_drafter(cfg, true, opt);
    st = std::make_unique<SafeTensors>(make_dummy_checkpoint(cfg, opt.layers, opt.seed, e_lo, e_hi, opt.load_mtp));
    // Engram layers need the tokenizer.json of a model folder (a bare config file has none:
    // the model then says so).
    const fs::path tok = fs::path(dir) / "tokenizer.json";
    const bool has_tok = fs::is_directory(dir) && fs::exists(tok);
    return build(std::move(cfg), std::move(st), be, opt, has_tok ? tok.string() : "");
  }
  if (opt.load_format != "safetensors") DIL_FAIL("unknown load format '", opt.load_format, "' (safetensors or dummy)");
  if (!fs::is_directory(dir)) DIL_FAIL("model folder ", dir, " does not exist");
  cfg = load_config((fs::path(dir) / "config.json").string());
  st = std::make_unique<SafeTensors>(SafeTensors::open(dir));
  // MTP / DSpark weights are validated (and later used) when the checkpoint carries them.
  const bool with_mtp = has_prefix(*st, "mtp.");
  check_drafter(cfg, with_mtp, opt);
  ValidationReport rep = validate_checkpoint(*st, expected_tensors(cfg, with_mtp));
  if (!rep.ok()) {
    std::string msg = "checkpoint " + dir + " does not match its config.json (" + std::to_string(rep.errors.size()) +
                      " problems):";
    for (size_t i = 0; i < rep.errors.size() && i < 20; ++i) msg += "\n  " + rep.errors[i];
    if (rep.errors.size() > 20) msg += "\n  ...";
    DIL_FAIL(msg);
  }
  const std::string tok = (fs::path(dir) / "tokenizer.json").string();
  if (cfg.arch == Arch::V41 && !cfg.engram_layers.empty() && !fs::exists(tok))
    DIL_FAIL("model folder ", dir, " has no tokenizer.json (V4.1's Engram hashes derive from it)");
  plan_for(cfg, be, opt);
  return build(std::move(cfg), std::move(st), be, opt, tok);
}

}  // namespace dil
