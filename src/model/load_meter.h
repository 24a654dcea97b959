// Load progress (include/dil/load_progress.h): how much loading will bind, and the meter the
// weight binder reports each tensor to. Reports are rate-limited here, so a callback may print
// each one and a load of 100k tensors still calls it only a few times a second.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "core/safetensors.h"
#include "dil/load_progress.h"
#include "model/config.h"
#include "model/model.h"

namespace dil {

struct LoadTotals {
  int64_t tensors = 0;
  int64_t bytes = 0;
};

// The tensors of `st` that the models bind to the backend under `opt`: embed, head, norm,
// hc_head_* and the blocks of the layers in opt.layers (all when empty), less the routed
// experts of other ranks (expert parallelism, the split of ExpertParallel), the Engram tables
// (they stay memory-mapped; only looked-up rows are read) and the Engram q/k weights
// (multiplied on the host). Not bound: MTP/DSpark stages (not run yet) and the vision tower.
// A prediction of what V4Model/V41Model bind; test_load_progress checks it against them.
LoadTotals expected_load(const SafeTensors& st, const ModelConfig& cfg, const ModelOptions& opt);

class LoadMeter {
 public:
  // `fn` empty: counts only. Reports the start at once.
  LoadMeter(LoadProgressFn fn, LoadTotals totals, double interval_s);
  // One tensor of `bytes` bound; reports when interval_s passed since the last report.
  void bound(size_t bytes);
  // The final report (done = true, `plan`). The totals become what was bound.
  void finish(std::string plan);
  const LoadProgress& progress() const { return p_; }

 private:
  void report();
  LoadProgressFn fn_;
  LoadProgress p_;
  std::chrono::steady_clock::time_point start_, last_;
  std::chrono::duration<double> interval_;
};

// HOOK for the kernel plan (design.md: which implementation runs each op is decided once, at
// load, by the backend's plan): the one-line summary the final load line prints. Today the
// backend's name and the numerics mode.
std::string kernel_plan_summary(const Backend& be, const ModelOptions& opt);

}  // namespace dil
