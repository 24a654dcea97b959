// Host-side planning of one forward step: the per-token/per-sequence layout (StepMeta) and
// which compressed rows each compressor emits (EmitPlan). Both depend only on positions, so
// they are computed on the host and uploaded once; no device value is ever read back.
#pragma once
#include <vector>

#include "backend/backend.h"
#include "model/model.h"

namespace dil {

// Device copies live in `storage` (one buffer per step).
struct StepPlan {
  StepMeta meta;
  Tensor ids;  // [T] i32 token ids (device)
  std::vector<Buffer> storage;
};

StepPlan plan_step(const StepBatch& batch, int block_tokens, Backend& be);
// Rows a ratio-m compressor emits this step: for every sequence, each window w whose last
// token (w+1)*m-1 lies in the chunk, in (sequence, w) order; pos = w*m.
EmitPlan plan_emits(const StepMeta& m, int ratio, Backend& be, std::vector<Buffer>* storage);
// Uploads a host vector into a fresh device buffer kept in `storage`.
Tensor upload_i32(const std::vector<int32_t>& v, Backend& be, std::vector<Buffer>* storage);
// Slots of sequences that start at position 0 (their recurrent state must be reset).
std::vector<int32_t> fresh_slots(const StepMeta& m);

}  // namespace dil
