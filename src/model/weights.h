// Binding checkpoint tensors (already validated against the schema) to Weight/Tensor handles
// in a backend's memory.
#pragma once
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/safetensors.h"
#include "model/config.h"

namespace dil {

// A matrix's format from its stored dtype and shape (no data): FP8 (square blocks of
// `weight_block`), FP4 (I8 bytes holding two e2m1 each, 1x32 blocks), BF16 or F32. Shared by the
// binder and the kernel plan's op sites (model_op_sites), which see the schema only.
Weight matrix_format(const std::string& name, DType dtype, const std::vector<int64_t>& shape, int weight_block);

class LoadMeter;  // model/load_meter.h

class WeightBinder {
 public:
  // `meter` (optional) hears of every bound tensor until end_load(); the loader owns it.
  WeightBinder(const SafeTensors& st, Backend& be, const ModelConfig& cfg, LoadMeter* meter = nullptr)
      : st_(st), be_(be), cfg_(cfg), meter_(meter) {}
  // The model is built: later binds (none today) are not part of the load.
  void end_load() { meter_ = nullptr; }
  // A matrix: FP8 (+ `.scale`, square blocks of cfg.weight_block), FP4 (I8 + `.scale`, 1x32),
  // BF16 or F32. `name` is the prefix without ".weight".
  Weight matrix(const std::string& name);
  // Any other tensor as stored (norm weights, mHC params, sinks, biases, ape).
  Tensor tensor(const std::string& name);
  // An I64 table converted to I32 (tid2eid), owned by this binder.
  Tensor table_i32(const std::string& name);
  bool has(const std::string& name) const { return st_.find(name) != nullptr; }

 private:
  const SafeTensors& st_;
  Backend& be_;
  const ModelConfig& cfg_;
  LoadMeter* meter_;
  std::vector<Buffer> owned_;
  void count(const StEntry& e);
};

}  // namespace dil
