#include "runtime/model_drafter.h"

#include "core/check.h"

namespace dil::runtime {

void ModelDrafter::propose(std::span<const DraftInput> in, std::vector<std::vector<int32_t>>* out) {
  std::vector<DraftRequest> req;
  req.reserve(in.size());
  for (const DraftInput& d : in) {
    DIL_CHECK(d.slot >= 0 && d.tokens.size() >= 2 && d.max_tokens >= 1, "draft input: slot ", d.slot, ", ",
              d.tokens.size(), " tokens");
    req.push_back({d.slot, int32_t(d.tokens.size()) - 2, d.tokens.back(), d.max_tokens, min_survival_});
  }
  model_.draft(req, out);
}

}  // namespace dil::runtime
