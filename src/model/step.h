// Host-side planning of one forward step: the per-token/per-sequence layout (StepMeta) and
// which compressed rows each compressor emits (EmitPlan). Both depend only on positions, so
// they are computed on the host and uploaded once; no device value is ever read back.
#pragma once
#include <array>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"

namespace dil {

// Device copies live in `storage`: one buffer and one upload per step, issued before the
// step's first kernel, so the forward itself never waits on the host for an input (a copy
// from pageable memory mid-forward may stall the launches, and a CUDA graph cannot hold it).
struct StepPlan {
  StepMeta meta;
  Tensor ids;  // [T] i32 token ids (device)
  std::vector<std::pair<int, EmitPlan>> emits;  // per compressor ratio given to plan_step
  std::vector<Buffer> storage;
  // The emits of a ratio planned by plan_step (aborts for one it was not given).
  const EmitPlan& emit(int ratio) const;
};

// `emit_ratios`: the compressor ratios of the model's layers (each planned once).
StepPlan plan_step(const StepBatch& batch, int block_tokens, Backend& be, const std::vector<int>& emit_ratios = {});
// Device copies of m's host vectors (into `storage`, one upload).
void upload_meta(StepMeta& m, Backend& be, std::vector<Buffer>* storage);
// Rows a ratio-m compressor emits this step: for every sequence, each window w whose last
// token (w+1)*m-1 lies in the chunk, in (sequence, w) order; pos = w*m. Host vectors only.
EmitPlan plan_emits_host(const StepMeta& m, int ratio);
// The same with its device copies (one upload; for sub-steps plan_step did not plan).
EmitPlan plan_emits(const StepMeta& m, int ratio, Backend& be, std::vector<Buffer>* storage);

// Several host i32 vectors packed into one device buffer with one upload: add() each, then
// upload(), then tensor() gives each one's device view (16-word aligned, shape {n}).
class StepStaging {
 public:
  int add(const std::vector<int32_t>& v);  // returns the handle for tensor()
  void upload(Backend& be, std::vector<Buffer>* storage);
  Tensor tensor(int handle) const;

 private:
  std::vector<int32_t> host_;                   // [words] the packed vectors
  std::vector<std::pair<int64_t, int64_t>> at_;  // per handle: word offset, length
  void* dev_ = nullptr;
  Device device_ = Device::CPU;
};
// Uploads a host vector into a fresh device buffer kept in `storage`.
Tensor upload_i32(const std::vector<int32_t>& v, Backend& be, std::vector<Buffer>* storage);
// Slots of sequences that start at position 0 (their recurrent state must be reset).
std::vector<int32_t> fresh_slots(const StepMeta& m);
// Step rows whose logits the batch asks for, in chunk order (model.h: SeqChunk). `m` may be a
// layout holding only each chunk's trailing rows (decoder replay, model/replay.h): the last
// token of chunk s is row h_q_start[s] + h_len[s] - 1; an all_logits chunk must be whole.
std::vector<int64_t> logit_rows(const StepBatch& batch, const StepMeta& m);
// dst.rows(i) = src.rows(rows[i]) for every i, one device copy per run of consecutive rows (a
// decode step's logit rows are one run: one launch instead of one per sequence).
void copy_rows(Backend& be, const Tensor& src, const std::vector<int64_t>& rows, Tensor dst);
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
