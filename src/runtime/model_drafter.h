// The model's own drafter as the engine's proposer (--speculative mtp: V4's MTP layer,
// model-spec §3.10, model/v4_mtp.cpp; --speculative dspark: V4.1's DSpark, §4.7,
// model/v41_dspark.cpp). Every drafting sequence has all its tokens but the last computed, so
// its slot holds the state after position len - 2 and the draft starts from that position and
// the last token (MTP: the pair of its streams and the token; DSpark: the anchor of the draft
// block): Model::draft.
#pragma once
#include "model/model.h"
#include "runtime/drafter.h"

namespace dil::runtime {

class ModelDrafter final : public Drafter {
 public:
  // min_survival: DraftRequest::min_survival of every request (DSpark's confidence cut).
  ModelDrafter(Model& model, int k, double min_survival = 0.0) : model_(model), k_(k), min_survival_(min_survival) {}
  int max_draft_tokens() const override { return k_; }
  void propose(std::span<const DraftInput> in, std::vector<std::vector<int32_t>>* out) override;

 private:
  Model& model_;  // the engine's model (it owns both)
  int k_;
  double min_survival_;
};

}  // namespace dil::runtime
