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
#include "model/step.h"
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
  // V4's MTP drafter (model/v4_mtp.cpp, model-spec §3.10), with ModelOptions::load_mtp.
  bool has_drafter() const override { return mtp_ != nullptr; }
  void draft(const std::vector<DraftRequest>& in, std::vector<std::vector<int32_t>>* out,
             std::vector<float>* logits = nullptr) override;

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
    int ring_slots = 0;  // rows of `ring` when it has more than the cache's slots (MTP: + draft slots)
  };
  // The MTP block `mtp.0` (model-spec §2.2, §3.10) and its per-slot state.
  struct Mtp {
    Layer block;  // ratio 0, bias routing; block.ring [n_slots + kDraftSlots, W, hd]
    Weight e_proj, h_proj;
    Tensor enorm, hnorm, norm;
    Hc hc_head;
    // [n_slots, n, D] activations: the target's final residual streams (before hc_head) at each
    // slot's last computed position, the input of the MTP pair (X_p, token p+1) the next step or
    // draft needs.
    Buffer hidden;
  };
  // Chains of draft steps run in these extra ring rows (copies of the sequences' rings), so that
  // a draft never touches a slot: at most this many sequences per chain (more: several chains).
  static constexpr int kDraftSlots = 64;
  struct Cache { int n_blocks = 0, n_slots = 0, block_tokens = 0; };

  void bind_block(Layer& l, const std::string& prefix, int ratio, bool hash);
  Tensor attention(Layer& l, const Tensor& x, const StepPlan& p, Scratch& s);
  void compress(Layer& l, Compressor& c, const Tensor& x, Buffer& skv, Buffer& sscore, Buffer& rows, int rows_dim,
                bool indexer, const StepPlan& p, Scratch& s);
  Tensor moe(Layer& l, const Tensor& x, const Tensor& ids, const ExpertParallel::Step& ep, Scratch& s);
  MoeExpertsArgs experts_args(Layer& l) const;  // this rank's expert lists and MoE numerics
  // forward / forward_device: logits downloaded into `host`, or left on the device in *dev.
  void run_step(const StepBatch& batch, std::vector<float>* host, Tensor* dev);
  void forward_idle(const ExpertParallel::Step& ep);  // a rank with no tokens joins every MoE collective
  // MTP (model/v4_mtp.cpp).
  void bind_mtp();
  // The block over pairs (H [T, n, D] target streams at positions p.meta.tok_pos, p.ids [T] the
  // tokens one position later): its output streams [T, n, D]; writes its ring rows (slots p.meta.h_slot).
  Tensor mtp_block(const Tensor& H, const StepPlan& p, Scratch& s);
  // After the backbone of a step (X [T, n, D] its final streams): the MTP block over every pair
  // the step completes -- (X_{p-1}, token p) for each computed token p > 0, X_{p-1} from the
  // slot's `hidden` for a chunk's first token -- then `hidden` = the chunk's last row.
  void mtp_after_step(const StepBatch& batch, const StepMeta& m, const Tensor& X, Scratch& s);
  void draft_chain(const DraftRequest* in, int S, int k, std::vector<std::vector<int32_t>>* out,
                   std::vector<float>* logits);
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
  std::unique_ptr<Mtp> mtp_;  // null unless ModelOptions::load_mtp
};

}  // namespace dil
