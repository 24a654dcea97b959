// Expert parallelism, shared by the V4 and V4.1 models (ModelOptions::comm, src/dist): this
// rank holds the routed experts [lo, hi) and runs them for every rank's tokens; attention and
// everything else stays on the rank that owns the sequence (data parallel).
//
// First version of the dispatch: all-gather + reduce-scatter. Every rank pads its T tokens to
// the step's maximum t_max (padding rows route to expert -1 and cost nothing), all-gathers the
// tokens and their routing (computed on the owning rank, so hash-routed layers need no token
// ids here), runs its own experts over all R*t_max rows and reduce-scatters the partial sums
// back to the owners. Why not all-to-all first: the collectives have fixed sizes known on the
// host before the step (no per-expert counts to exchange, so no host sync and
// graph-capturable), the reduction happens in the collective rather than in a combine kernel,
// and for decode-sized steps the payload is small enough that latency, not bytes, dominates.
// Its cost is R x the bytes of an all-to-all for large prefill steps; NCCL grouped send/recv
// (or the device API) replaces it when that matters (docs/architecture.md, "Multi-GPU").
#pragma once
#include <vector>

#include "backend/backend.h"
#include "model/model.h"
#include "model/profiler.h"
#include "model/scratch.h"

namespace dil {

// The shared expert of a MoE block: w2(swiglu(w1 x, w3 x)) -> [T, D] (x [T, D] f32|bf16; the
// intermediates and the result in x's dtype, as the official linear outputs).
Tensor shared_expert(Backend& be, const Tensor& x, const Weight& w1, const Weight& w2, const Weight& w3, int act_block,
                     float swiglu_limit, Scratch& s);

class ExpertParallel {
 public:
  // comm null (or one rank): every expert on this rank, no collectives.
  ExpertParallel(Communicator* comm, int n_routed);
  bool on() const { return comm_ != nullptr; }
  int lo() const { return lo_; }
  int hi() const { return hi_; }

  // The step as every rank sees it: the largest token count over ranks and the routing of
  // padding rows ([t_max, k] i32 of -1).
  struct Step {
    int64_t t_max = 0;
    Tensor no_route;
  };
  // Agrees on the step's token counts (batch.rank_tokens when the engine already did, else a
  // host exchange) before any device work. Returns false when no rank has tokens: then nobody
  // runs a forward, and no collective either.
  bool begin(const StepBatch& batch, int topk, Backend& be, Scratch& step, Step* out);

  // This rank's tokens x [T, D] (f32|bf16) with their routing (w [T, k] f32, idx [T, k] i32,
  // global expert ids) -> their routed sum [T, D] f32 over every rank's experts. `e` carries this rank's expert
  // lists (w1/w2/w3 holding experts [lo, hi)), act_block and swiglu_limit; its x, routing and
  // out are filled here. T may be 0 (a rank without tokens in the step).
  Tensor routed(Backend& be, StepProfiler* prof, MoeExpertsArgs e, const Tensor& x, const Tensor& w,
                const Tensor& idx, const Step& st, Scratch& s) const;
  // The routed sum [T, D] of x's tokens: routed() with several ranks, else this rank's experts
  // directly (`st` unused).
  Tensor experts(Backend& be, StepProfiler* prof, MoeExpertsArgs e, const Tensor& x, const Tensor& w,
                 const Tensor& idx, const Step& st, Scratch& s) const;

 private:
  Communicator* comm_ = nullptr;
  int rank_ = 0, size_ = 1;
  int lo_ = 0, hi_ = 0;
};

}  // namespace dil
