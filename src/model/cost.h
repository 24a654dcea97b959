// FLOPs and bytes of one forward step, per module, from the config alone: the floor that every
// benchmark result is compared with (design.md, performance method). Counts follow
// model-spec §3/§4: GEMM FLOPs are 2*m*n*k; attention counts QK and PV over the rows each query
// actually reads (window + selected / all visible compressed rows); the indexer counts its
// scores over every visible (or candidate) row. Bytes count each weight once, the KV rows the
// step reads once and the activations each module reads and writes once (f32).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "model/config.h"

namespace dil {

struct ModuleCost {
  double flops = 0;
  double bytes = 0;
  bool fp8_gemm = false;  // FLOPs run on FP8 tensor cores in an optimized engine
};

// One step in which each of `n_seqs` sequences feeds `new_tokens` tokens after `cached`
// tokens of context; `layers` are the backbone layers counted (empty: all). `replay`: V4.1's
// decoder replay (model/replay.h) as the model runs it: each layer counts the rows it computes
// (kv sources' compressors every token, attention + MoE the replay's out rows, window rows the
// kv rows), positions those of the chunk's trailing rows. Ignored for V4.
std::map<std::string, ModuleCost> step_cost(const ModelConfig& c, const std::vector<int>& layers, int64_t n_seqs,
                                            int64_t cached, int64_t new_tokens, bool replay = false);

}  // namespace dil
