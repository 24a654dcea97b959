// Progress of loading a model's weights (ModelOptions::on_progress, EngineOptions::
// on_load_progress). Plain data, no dependencies: the model reports, the program prints.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

namespace dil {

struct LoadProgress {
  // Tensors bound to the backend so far (a matrix's weight and its scale are two), and their
  // bytes: what the backend copies to its memory (the CPU adopts the memory map; a GPU copies,
  // which reads the file).
  int64_t tensors_done = 0, tensors_total = 0;
  int64_t bytes_done = 0, bytes_total = 0;
  double elapsed_s = 0;  // since the first tensor was bound
  // The last report: every tensor is bound; `plan` then holds the kernel plan's summary
  // (kernel_plan_summary in model/load_meter.h).
  bool done = false;
  std::string plan;
};

// Called on the loading thread: at the start, at most every ModelOptions::progress_interval_s
// while binding, and once with done = true. Must not throw.
using LoadProgressFn = std::function<void(const LoadProgress&)>;

}  // namespace dil
