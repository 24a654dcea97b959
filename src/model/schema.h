// The tensor inventory a config implies (model-spec §2.2 for V4, §2.3 for V4.1): every name,
// dtype and shape the official checkpoint holds. Used to validate a checkpoint before any
// tensor is touched, and by `inspect --config` to list what a real checkpoint must contain.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/safetensors.h"
#include "model/config.h"

namespace dil {

struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  size_t nbytes() const;
};

std::vector<TensorSpec> expected_tensors(const ModelConfig& cfg, bool with_mtp = true);
std::vector<TensorSpec> expected_tensors_v4(const ModelConfig& cfg, bool with_mtp);
std::vector<TensorSpec> expected_tensors_v41(const ModelConfig& cfg, bool with_mtp);

struct ValidationReport {
  std::vector<std::string> errors;  // one line per problem, each naming the tensor and file
  size_t n_tensors = 0;
  size_t total_bytes = 0;
  bool ok() const { return errors.empty(); }
};

// Checks every tensor of `st` against `specs`: missing, unexpected, wrong dtype or shape.
// (File-level problems such as truncation are already errors when `st` is opened.)
ValidationReport validate_checkpoint(const SafeTensors& st, const std::vector<TensorSpec>& specs);

}  // namespace dil
