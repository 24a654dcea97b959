#include "model/load_meter.h"

#include <algorithm>

#include "dist/communicator.h"

namespace dil {
namespace {

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

// "layers.L.rest" -> L and rest; false for other names.
bool split_layer(const std::string& name, int* layer, std::string* rest) {
  if (!starts_with(name, "layers.")) return false;
  const size_t dot = name.find('.', 7);
  if (dot == std::string::npos) return false;
  *layer = std::stoi(name.substr(7, dot - 7));
  *rest = name.substr(dot + 1);
  return true;
}

}  // namespace

LoadTotals expected_load(const SafeTensors& st, const ModelConfig& cfg, const ModelOptions& opt) {
  int e_lo = 0, e_hi = cfg.n_routed;  // ExpertParallel's split
  if (opt.comm && opt.comm->size() > 1) {
    e_lo = int(int64_t(cfg.n_routed) * opt.comm->rank() / opt.comm->size());
    e_hi = int(int64_t(cfg.n_routed) * (opt.comm->rank() + 1) / opt.comm->size());
  }
  LoadTotals t;
  for (const auto& [name, e] : st.entries()) {
    int L = 0;
    std::string rest;
    if (split_layer(name, &L, &rest)) {
      if (!opt.layers.empty() && std::find(opt.layers.begin(), opt.layers.end(), L) == opt.layers.end()) continue;
      if (starts_with(rest, "engram.embed.") || rest == "engram.q_weight" || rest == "engram.k_weight") continue;
      if (starts_with(rest, "ffn.experts.")) {
        const int ex = std::stoi(rest.substr(12));
        if (ex < e_lo || ex >= e_hi) continue;
      }
    } else if (!starts_with(name, "embed.") && !starts_with(name, "head.") && !starts_with(name, "norm.") &&
               !starts_with(name, "hc_head_")) {
      continue;
    }
    t.tensors += 1;
    t.bytes += int64_t(e.nbytes);
  }
  return t;
}

LoadMeter::LoadMeter(LoadProgressFn fn, LoadTotals totals, double interval_s)
    : fn_(std::move(fn)), start_(std::chrono::steady_clock::now()), last_(start_), interval_(interval_s) {
  p_.tensors_total = totals.tensors;
  p_.bytes_total = totals.bytes;
  report();
}

void LoadMeter::bound(size_t bytes) {
  p_.tensors_done += 1;
  p_.bytes_done += int64_t(bytes);
  // A prediction that fell short must not show more than 100 %.
  p_.tensors_total = std::max(p_.tensors_total, p_.tensors_done);
  p_.bytes_total = std::max(p_.bytes_total, p_.bytes_done);
  if (!fn_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_ < interval_) return;
  last_ = now;
  report();
}

void LoadMeter::finish(std::string plan) {
  p_.tensors_total = p_.tensors_done;
  p_.bytes_total = p_.bytes_done;
  p_.done = true;
  p_.plan = std::move(plan);
  report();
}

void LoadMeter::report() {
  p_.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (fn_) fn_(p_);
}

std::string kernel_plan_summary(const Backend& be, const ModelOptions& opt) {
  std::string s = be.name() + " backend, " + numerics_name(opt.numerics) + " numerics";
  if (be.plan()) s += "; kernels: " + be.plan()->summary();  // the plan load_model installed
  return s;
}

}  // namespace dil
