// The tensor inventory of a DeepSeek-V4.1 checkpoint (model-spec §2.3), derived from its
// config alone: every tensor's official name, dtype and shape. Used to validate a checkpoint
// before loading it and to size a real checkpoint from its config.json (inspect --config).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"

namespace dil {

struct TensorSpec {
  std::string name;
  DType dtype = DType::BF16;
  std::vector<int64_t> shape;
  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
};

// V4.1 inventory: backbone, then DSpark stages `mtp.0..n_mtp-1` (when `with_mtp`), then the
// vision tower and aligner (when the config has a vision_config). Order is deterministic.
std::vector<TensorSpec> tensor_schema_v41(const ModelConfig& cfg, bool with_mtp = true);

}  // namespace dil
