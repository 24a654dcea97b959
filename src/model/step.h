// Host-side planning of one forward step: the per-token/per-sequence layout (StepMeta) and
// which compressed rows each compressor emits (EmitPlan). Both depend only on positions, so
// they are computed on the host and uploaded once; no device value is ever read back.
#pragma once
#include <array>
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
// Device copies of m's host vectors (into `storage`).
void upload_meta(StepMeta& m, Backend& be, std::vector<Buffer>* storage);
// Rows a ratio-m compressor emits this step: for every sequence, each window w whose last
// token (w+1)*m-1 lies in the chunk, in (sequence, w) order; pos = w*m.
EmitPlan plan_emits(const StepMeta& m, int ratio, Backend& be, std::vector<Buffer>* storage);
// Uploads a host vector into a fresh device buffer kept in `storage`.
Tensor upload_i32(const std::vector<int32_t>& v, Backend& be, std::vector<Buffer>* storage);
// Slots of sequences that start at position 0 (their recurrent state must be reset).
std::vector<int32_t> fresh_slots(const StepMeta& m);
// Step rows whose logits the batch asks for, in chunk order (model.h: SeqChunk). `m` may be a
// layout holding only each chunk's trailing rows (decoder replay, model/replay.h): the last
// token of chunk s is row h_q_start[s] + h_len[s] - 1; an all_logits chunk must be whole.
std::vector<int64_t> logit_rows(const StepBatch& batch, const StepMeta& m);
// The two RoPE tables of a model: [0] plain (ratio-0 layers), [1] compress_rope_theta + YaRN.
// Their device memory goes to `storage`.
std::array<RopeTable, 2> make_rope_tables(const ModelConfig& cfg, Backend& be, std::vector<Buffer>* storage);
// Uniform [-1, 1) f32 contents for a cache buffer (benchmarks' synthesized context); no-op
// for an unallocated buffer.
void fill_uniform(Backend& be, Buffer& b, uint64_t seed, DType dt = DType::F32);  // values in [-1, 1), f32 or bf16
// The same for a cache of packed rows (pack.packed()): uniform [-1, 1) rows of pack.d values,
// each quantized as the writers do (kvpack::pack_row), so that readers see valid rows.
void fill_uniform_packed(Backend& be, Buffer& b, uint64_t seed, const kvpack::RowShape& pack);

}  // namespace dil
