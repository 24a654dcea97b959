// Placeholder until the V4.1 inventory lands (issue 3): V4.1 checkpoints are rejected clearly.
#include "core/check.h"
#include "model/schema.h"

namespace dil {
std::vector<TensorSpec> expected_tensors_v41(const ModelConfig&, bool) {
  DIL_FAIL("DeepSeek-V4.1 checkpoints are not supported yet");
}
}  // namespace dil
