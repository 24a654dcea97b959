// DeepSeek-V4.1 (V4.1-Flash) text forward, written once against Backend& (model-spec §4):
// layer roles with shared compressed KV / indexer keys / top-k / candidate blocks (§4.1, §4.3),
// single-pass mHC without an hc head (§4.2), Engram before its layers (§4.5), V4.1 MoE routing
// (§4.4). Per-request state: SWA rings, ratio-2 compressor state, the paged compressed rows and
// indexer keys of the kv sources, and the Engram look-back history (host), so a chunked
// prefill or a decode step computes exactly what the full forward computes. Prefill chunks
// replay the layers from the last kv source on over their trailing rows only (model/replay.h).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "model/engram_hash.h"
#include "model/block.h"
#include "model/expert_parallel.h"
#include "model/kv_layout.h"
#include "model/model.h"
#include "model/replay.h"
#include "model/scratch.h"
#include "model/step.h"
#include "model/weights.h"

namespace dil {

class V41Model : public Model {
 public:
  // `tokenizer_json`: the model folder's tokenizer.json (Engram's compressed-token map).
  // `meter`: load progress of the binding (the loader's; used only during construction).
  V41Model(ModelConfig cfg, std::unique_ptr<SafeTensors> st, Backend& be, const ModelOptions& opt,
           const std::string& tokenizer_json, LoadMeter* meter = nullptr);
  const ModelConfig& config() const override { return cfg_; }
  CacheSpec cache_spec(int block_tokens) const override;
  void allocate_cache(int n_blocks, int n_slots, int block_tokens) override;
  void forward(const StepBatch& batch, std::vector<float>* logits) override;
  Tensor forward_device(const StepBatch& batch) override;
  void copy_cache(const std::vector<CacheCopy>& ops) override;  // model/cache_copy.cpp
  void randomize_cache(uint64_t seed) override;
  // Rows each backbone layer ran attention + MoE on in the last forward, [n_layers] (0: not
  // active or no step yet): the replay's instrumentation for tests and benchmarks.
  const std::vector<int64_t>& layer_rows() const { return layer_rows_; }
  // V4.1's DSpark drafter (model/v41_dspark.cpp, model-spec §4.7), with ModelOptions::load_mtp.
  bool has_drafter() const override { return dsp_ != nullptr; }
  void draft(const std::vector<DraftRequest>& in, std::vector<std::vector<int32_t>>* out,
             std::vector<float>* logits = nullptr) override {
    draft_dspark(in, out, logits, nullptr);
  }
  // The same, with (tests) the draft logits after the Markov bias, [k, in.size(), vocab] f32
  // (k = the largest r.n, position-major as Model::draft), and the confidence head's logits
  // conf [in.size(), dspark_block_size] f32 (before any sigmoid / calibration).
  void draft_dspark(const std::vector<DraftRequest>& in, std::vector<std::vector<int32_t>>* out,
                    std::vector<float>* logits, std::vector<float>* conf);

 private:
  struct Engram {
    int index = -1;             // position in cfg.engram_layers
    const StEntry* table = nullptr;  // embed.weight e4m3 [rows, hd] (host mapping)
    const StEntry* scale = nullptr;  // embed.scale e8m0 [rows, hd/32]
    Weight wkv;                 // [(n+1)*D, cols*hd] FP8
    Buffer qk_buf;
    Tensor qk;                  // [n, D] f32 q_weight * k_weight
  };
  struct Layer : BlockWeights {  // + the common weights (model/block.h)
    int index = 0, ratio = 0, kv_src = -1, idx_src = -1;
    bool kv_source = false, index_source = false, cand_source = false, uses_cand = false;
    bool active = true;  // built and run (ModelOptions::layers)
    std::string kind;    // profiler label "layer:<role>-r<ratio>" (bench extrapolation)
    Weight cwkv, cwgate, iwk, iwq_b, iweights;  // compressor, indexer
    Tensor cnorm, iknorm;
    Tensor gate_bias, gate_bias_vl;
    Engram engram;
    bool has_engram = false;
    // A DSpark block (mtp.s): non-causal attention over its ring of context rows and the draft
    // block, MoE of dspark_n_routed experts top dspark_topk.
    bool drafter = false;
    // cache: every layer's SWA ring; kv sources: compressed rows, indexer keys, ratio-2 state
    Buffer ring, comp_rows, idx_rows, cstate_kv, cstate_score;
  };
  struct Cache { int n_blocks = 0, n_slots = 0, block_tokens = 0; };
  // The DSpark drafter `mtp.0..2` (model-spec §2.3, §4.7) and where its context comes from.
  struct Dspark {
    explicit Dspark(int n_routed) : ep(nullptr, n_routed) {}
    // Layer.ring [n_slots, W, hd]: the context rows of the sequence's positions (slot state).
    std::vector<Layer> blocks;
    Weight main_proj;             // mtp.0 [D, targets * D]
    Tensor main_norm, norm;       // mtp.0.main_norm, mtp.2.norm [D]
    Weight markov_embed, markov_head;  // [V, R] each
    Weight conf_x, conf_m;        // confidence_head.proj [1, D + R] as its columns [0, D), [D, D + R)
    // Per target layer: the active backbone layer at whose entry its stream mean is taken (the
    // target itself; a benchmark's layer subset without it: the next active layer, else the
    // last), in the order of dspark_target_layer_ids.
    std::vector<int> record;
    ExpertParallel ep;            // the drafter's experts, single rank (loader.cpp check_drafter)
  };
  // The context rows a step writes (the trailing min(n, W) rows of every chunk): planned with
  // the step, before its first kernel.
  struct DsparkStep {
    RowSpans spans;   // [n_seqs] per chunk
    StepMeta meta;    // those rows as a step
    Tensor perm;      // [targets * R] i32 gather rows: (row r, target k) <- k * R + r
    int64_t rows = 0;
  };
  // Per-step selections shared down a group (model-spec §4.3): the latest index source's
  // top-k rows and the candidate source's blocks.
  struct Shared { Tensor sel, cand; };

  void bind_layer(Layer& l, int L);
  Tensor attention(Layer& l, const Tensor& x, const StepMeta& m, Shared& sh, Scratch& s);
  Tensor window_rows(Layer& l, const Tensor& x, const Tensor& pos, Scratch& s);
  void write_source_rows(Layer& l, const Tensor& x, const StepPlan& p, Scratch& s);
  Tensor moe(Layer& l, const Tensor& x, const ExpertParallel::Step& ep, Scratch& s);
  MoeExpertsArgs experts_args(Layer& l) const;  // this rank's expert lists and MoE numerics
  // forward / forward_device: logits downloaded into `host`, or left on the device in *dev.
  void run_step(const StepBatch& batch, std::vector<float>* host, Tensor* dev);
  void forward_idle(const ExpertParallel::Step& ep);  // a rank with no tokens joins every MoE collective
  // Engram over the rows `rows` of the step `m` (X, out: [those rows, n, D]).
  void engram(Layer& l, const StepBatch& batch, const StepMeta& m, const RowSpans& rows, const Tensor& X,
              Tensor out, Scratch& s);
  // [T, hc_mult] f32 rows (1, 0, .., 0) on the device (one_hot_, grown by an upload when needed).
  Tensor one_hot_pre(int64_t T);
  // DSpark (model/v41_dspark.cpp).
  void bind_dspark();
  DsparkStep plan_dspark(const StepBatch& batch, const StepMeta& m, Scratch& step);
  // At the entry of backbone layer L (X [cur rows, n, D], laid out by `cur`): the stream mean of
  // the context rows into means [targets, ds.rows, D] for every target recorded at L.
  void dspark_record(int L, const Tensor& X, const RowSpans& cur, const DsparkStep& ds, Tensor means, Scratch& s);
  // After the backbone: main_x of the context rows and their ring rows in every block.
  void dspark_context(const DsparkStep& ds, const Tensor& means, Scratch& s);
  int act_block() const { return quantizes(numerics_) ? cfg_.act_block : 0; }
  Tensor act(Scratch& s, std::initializer_list<int64_t> dims) const { return s.make(act_, dims); }

  ModelConfig cfg_;
  std::unique_ptr<SafeTensors> st_;
  Backend& be_;
  Numerics numerics_;
  bool official_;  // the official quantization points (official or fast numerics)
  DType act_;      // activations between ops (activation_dtype(numerics_))
  KvRowShapes kv_;  // the cache's row formats (model/kv_layout.h stored_kv_rows; unpacked: rows of act_)
  WeightBinder binder_;
  ExpertParallel ep_;  // routed experts held by this rank, the EP collectives
  EngramHash ehash_;
  Weight embed_, head_;
  Tensor norm_;
  std::vector<Layer> layers_;
  ReplaySchedule replay_;
  bool replay_on_ = true;
  std::vector<int64_t> layer_rows_;
  std::vector<Buffer> rope_bufs_;
  Cache cache_;
  // Engram look-back per slot: the token ids of the last max_ngram-1 positions (host).
  std::vector<std::vector<int32_t>> hist_;
  std::vector<int32_t> hist_next_;  // [n_slots] position the history ends at
  // [one_hot_rows_, hc_mult] f32 rows (1, 0, .., 0): the first sublayer's collapse weights,
  // copied on the device each step (grown, by an upload before the step's first kernel, when
  // a step has more rows than any before).
  Buffer one_hot_;
  int64_t one_hot_rows_ = 0;
  static constexpr int32_t kSynthetic = -1;  // randomize_cache: any continuation position
  std::unique_ptr<Dspark> dsp_;  // null unless ModelOptions::load_mtp
};

}  // namespace dil
