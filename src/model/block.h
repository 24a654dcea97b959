// What every V4 and V4.1 block has (model-spec §3, §4): its common weights, bound once for both
// models, and the attention core + output projection that both run the same way. Each model's
// Layer derives from BlockWeights and adds its own (compressors, indexer, Engram, cache).
#pragma once
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/expert_parallel.h"
#include "model/profiler.h"
#include "model/scratch.h"
#include "model/weights.h"

namespace dil {

struct HcWeights {
  Tensor fn, base, scale;
};

struct BlockWeights {
  Tensor attn_norm, ffn_norm, q_norm, kv_norm, sink;
  HcWeights hc_attn, hc_ffn;
  Weight wq_a, wq_b, wkv, wo_a, wo_b;
  Weight gate;
  std::vector<Weight> w1, w2, w3;  // routed experts [ep.lo(), ep.hi()) of this rank
  Weight sw1, sw2, sw3;            // shared expert
  RopeTable rope;
};

// Binds the common weights of block prefix `p` ("layers.L.").
void bind_block_weights(WeightBinder& b, const std::string& p, const ExpertParallel& ep, BlockWeights* l);

// Attention core over a (its out filled here; q, rows, sink, indices set by the caller), the
// window ring write of `kv` [T, hd] (none when a.non_causal), then the output path: inverse RoPE at the query position,
// wo_a per group, wo_b. -> [T, D] in the activation dtype `act` (that of a.q).
Tensor attention_output(Backend& be, StepProfiler* prof, const ModelConfig& cfg, const BlockWeights& l, AttnArgs& a,
                        const Tensor& kv, const StepMeta& m, int act_block, Scratch& s);

}  // namespace dil
