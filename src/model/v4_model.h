// DeepSeek-V4 (V4-Flash, V4-Pro) forward, written once against Backend& (model-spec §3).
#pragma once
#include <memory>
#include <vector>

#include "core/safetensors.h"
#include "model/block.h"
#include "model/expert_parallel.h"
#include "model/kv_layout.h"
#include "model/model.h"
#include "model/scratch.h"
#include "model/weights.h"

namespace dil {

class V4Model : public Model {
 public:
  // `meter`: load progress of the binding (the loader's; used only during construction).
  V4Model(ModelConfig cfg, std::unique_ptr<SafeTensors> st, Backend& be, const ModelOptions& opt,
          LoadMeter* meter = nullptr);
  const ModelConfig& config() const override { return cfg_; }
  CacheSpec cache_spec(int block_tokens) const override;
  void allocate_cache(int n_blocks, int n_slots, int block_tokens) override;
  void forward(const StepBatch& batch, std::vector<float>* logits) override;
  Tensor forward_device(const StepBatch& batch) override;
  void copy_cache(const std::vector<CacheCopy>& ops) override;  // model/cache_copy.cpp
  void randomize_cache(uint64_t seed) override;

 private:
  using Hc = HcWeights;
  struct Compressor {
    Weight wkv, wgate;
    Tensor ape, norm;
    int dc = 0;
    bool overlap = false;
  };
  struct Layer : BlockWeights {  // + the common weights (model/block.h)
    int id = 0;
    int ratio = 0;
    Compressor comp, icomp;       // main compressor; indexer compressor (ratio 4)
    Weight iwq_b, iweights;        // indexer
    Tensor gate_bias, tid2eid;
    // cache
    Buffer ring, comp_rows, idx_rows, cstate_kv, cstate_score, istate_kv, istate_score;
  };
  struct Cache { int n_blocks = 0, n_slots = 0, block_tokens = 0; };

  void bind_block(Layer& l, const std::string& prefix, int ratio, bool hash);
  Tensor attention(Layer& l, const Tensor& x, const StepMeta& m, Scratch& s);
  void compress(Layer& l, Compressor& c, const Tensor& x, Buffer& skv, Buffer& sscore, Buffer& rows, int rows_dim,
                bool indexer, const StepMeta& m, Scratch& s);
  Tensor moe(Layer& l, const Tensor& x, const Tensor& ids, const ExpertParallel::Step& ep, Scratch& s);
  MoeExpertsArgs experts_args(Layer& l) const;  // this rank's expert lists and MoE numerics
  // forward / forward_device: logits downloaded into `host`, or left on the device in *dev.
  void run_step(const StepBatch& batch, std::vector<float>* host, Tensor* dev);
  void forward_idle(const ExpertParallel::Step& ep);  // a rank with no tokens joins every MoE collective
  // mHC pre of a sublayer and the norm after it (one fused op): xn = norm(collapse(X)).
  void hc_pre(const Tensor& X, const Hc& hc, const Tensor& norm_w, Tensor xn, Tensor post, Tensor comb, Scratch& s);

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
  Weight embed_, head_;
  Tensor norm_;
  Hc hc_head_;
  std::vector<Layer> layers_;
  std::vector<Buffer> rope_bufs_;
  Cache cache_;
  ExpertParallel ep_;  // routed experts held by this rank, the EP collectives
};

}  // namespace dil
