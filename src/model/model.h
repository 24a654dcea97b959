// What the runtime sees of a model: load, cache sizing, and one forward step over a batch of
// sequence chunks (prefill chunks and decode tokens mixed). The runtime never sees tensor
// contents; the model never sees requests or scheduling.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/numerics.h"
#include "dil/load_progress.h"
#include "model/config.h"
#include "model/profiler.h"

namespace dil {

class Communicator;  // dist/communicator.h

struct ModelOptions {
  Numerics numerics = Numerics::Official;
  // Bind and run the model's drafter (V4: the MTP block mtp.0, model-spec §3.10) for speculative
  // decoding: the checkpoint must carry it. Every forward then also runs the drafter's block over
  // the step's tokens (its window ring, Model::draft), which costs one more layer per token.
  bool load_mtp = false;
  // "safetensors": the checkpoint in the model folder. "dummy": random weights in the
  // official formats generated from config.json alone (benchmarks; `dir` may then be the
  // config file itself).
  std::string load_format = "safetensors";
  uint64_t seed = 1;
  // Backbone layers to build and run (empty: all). Benchmarks run a subset of a model that
  // does not fit one GPU and extrapolate.
  std::vector<int> layers;
  // V4.1 decoder replay (model/replay.h): the layers from the last kv source on compute only the
  // trailing rows of a prefill chunk that its last token and the next step depend on. Exact: the
  // same function as every layer on every row. Off: comparisons and benchmark baselines.
  bool decoder_replay = true;
  // Expert parallelism (src/dist): with a communicator of R > 1 ranks this rank loads and runs
  // only the routed experts [rank*E/R, (rank+1)*E/R); attention and dense weights are
  // replicated and each rank runs attention on its own sequences (data parallel). Every rank
  // must call forward() for every step, with an empty batch when it has no tokens.
  // nullptr or R = 1: the single-rank model, no communicator calls.
  Communicator* comm = nullptr;
  // Load progress (tensors and bytes bound, model/load_meter.h): called at the start, at most
  // every progress_interval_s while binding, and once when done. Empty: no reports.
  LoadProgressFn on_progress;
  double progress_interval_s = 0.25;
  // Plain KV rows (the activation dtype) even where the mode stores the official packed rows
  // (model/kv_layout.h kv_format): the trace, whose two sides must hold the same layout.
  bool plain_kv = false;
};

// One sequence's share of a step. Its recurrent state lives in `slot`; its compressed rows
// live in the KV blocks listed in `blocks` (logical block i holds tokens
// [i*block_tokens, (i+1)*block_tokens)). A chunk with start_pos == 0 resets the slot.
struct SeqChunk {
  int32_t slot = 0;
  int32_t start_pos = 0;
  int32_t n_tokens = 0;
  std::vector<int32_t> blocks;
  bool want_logits = true;  // logits of the chunk's last token
  bool all_logits = false;  // logits of every token of the chunk (tools/tests)
};

// One sequence's draft request (Model::draft): the slot after a forward that computed every
// position up to `pos`, and `token`, the sampled token at pos + 1 (not computed yet).
struct DraftRequest {
  int32_t slot = 0;
  int32_t pos = 0;
  int32_t token = 0;
  int n = 1;  // draft tokens wanted (>= 1)
  // DSpark only (V4's MTP ignores it): keep the drafts while the product of sigmoid(confidence
  // logit) over their positions is >= this (0: all n).
  double min_survival = 0.0;
};

struct StepBatch {
  std::vector<int32_t> tokens;  // concatenation of every chunk's tokens
  std::vector<SeqChunk> seqs;
  // Expert-parallel runs: every rank's token count for this step, in rank order, agreed on the
  // host before the step (the engine or DpEngine exchanges them through the Communicator) so that the forward
  // never waits on the host. Empty: forward() agrees itself, before any device work.
  std::vector<int64_t> rank_tokens;
};

// One copy inside the cache, for the runtime's fork (n > 1) and prefix cache: Block copies a
// paged block (every layer's compressed rows and indexer keys of its positions), Slot copies a
// state slot (every layer's SWA ring and compressor partial state, V4.1's Engram look-back).
struct CacheCopy {
  enum class Kind : uint8_t { Block, Slot };
  Kind kind = Kind::Block;
  int32_t src = 0, dst = 0;
};

// Bytes the cache needs, for the runtime's accounting (exact for the layout in use).
struct CacheSpec {
  int block_tokens = 128;     // tokens per paged block (multiple of every compression ratio and of 128)
  size_t bytes_per_block = 0; // compressed rows + indexer keys of block_tokens tokens, all layers
  size_t bytes_per_slot = 0;  // per-sequence fixed state: SWA rings, compressor state, history
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  virtual CacheSpec cache_spec(int block_tokens) const = 0;
  virtual void allocate_cache(int n_blocks, int n_slots, int block_tokens) = 0;
  // Runs one step. `logits` receives [rows, vocab] f32 on the host, rows in chunk order:
  // all tokens of an all_logits chunk, else the last token of a want_logits chunk.
  virtual void forward(const StepBatch& batch, std::vector<float>* logits) = 0;
  // The same step with the logits left where the head wrote them: [rows, vocab] f32 in memory
  // the model owns, valid until its next forward (the engine samples them there with
  // Backend::sample, so only token ids and logprobs cross to the host). Empty when no row
  // wants logits. The default (models without a device head: the runtime's test fakes) runs
  // forward() and returns its host logits as a CPU tensor.
  virtual Tensor forward_device(const StepBatch& batch) {
    forward(batch, &host_logits_);
    const int64_t v = config().vocab_size, rows = v ? int64_t(host_logits_.size()) / v : 0;
    if (rows == 0) return {};
    return Tensor(host_logits_.data(), DType::F32, {rows, v}, Device::CPU);
  }
  // Runs the copies in order, after the work already issued and before the next forward, on the
  // device (no host synchronisation; host-side state such as the Engram look-back is copied on
  // the host, in the same order). A slot restored from a copy continues where its source was.
  virtual void copy_cache(const std::vector<CacheCopy>& ops) = 0;
  // Speculative decoding with the model's own drafter (loaded with ModelOptions::load_mtp): for
  // every request, up to r.n greedy draft tokens for positions pos + 2, pos + 3, ... (*out)[i].
  // Runs between forwards; reads the slot's state and leaves it unchanged.
  // `logits` (tests): the drafter's logits of every step, [k, in.size(), vocab] f32 on the host
  // (k = the largest r.n), for at most 64 requests.
  virtual bool has_drafter() const { return false; }
  virtual void draft(const std::vector<DraftRequest>& in, std::vector<std::vector<int32_t>>* out,
                     std::vector<float>* logits = nullptr) {
    DIL_FAIL("this model has no drafter loaded");
  }
  // Benchmarks: per-module timing of the following steps (nullptr: off), and random contents
  // for every cache block and state slot (a synthesized long context).
  void set_profiler(StepProfiler* p) { prof_ = p; }
  virtual void randomize_cache(uint64_t seed) { DIL_FAIL("randomize_cache is not supported by this model"); }

 protected:
  StepProfiler* prof_ = nullptr;
  // [rows, vocab] f32 on `be`: the head's output of forward_device, grown as needed.
  Tensor device_logits(Backend& be, int64_t rows, int64_t vocab) {
    const size_t bytes = size_t(rows * vocab) * 4;
    if (logits_buf_.bytes() < bytes) logits_buf_ = be.alloc(bytes);
    return Tensor(logits_buf_.data(), DType::F32, {rows, vocab}, be.device());
  }

 private:
  std::vector<float> host_logits_;  // forward_device's default
  Buffer logits_buf_;
};

// Loads config.json + safetensors from `dir`, validates every tensor, resolves the backend's
// kernel plan for the model's op sites (failing before any weight is bound when nothing can run
// one) and installs it, then builds the model on `be`.
std::unique_ptr<Model> load_model(const std::string& dir, Backend& be, const ModelOptions& opt);

// Every op site of the model the config describes (backend/plan.h), in the numerics mode, for
// the given backbone layers (empty: all): what the forward calls, layer kind by layer kind,
// with the weight formats of the schema. The backends check every call against the installed
// plan, so this list and the forward cannot drift apart unnoticed.
// `mtp`: also the drafter's sites (ModelOptions::load_mtp).
std::vector<OpSite> model_op_sites(const ModelConfig& cfg, Numerics n, const std::vector<int>& layers = {},
                                   bool mtp = false);
// The config of a model folder, a config.json, or (load_format dummy) either.
ModelConfig load_model_config(const std::string& dir_or_config);

}  // namespace dil
