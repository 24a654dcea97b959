#include "model/expert_parallel.h"

#include <algorithm>

#include "dist/communicator.h"
#include "model/step.h"

namespace dil {

ExpertParallel::ExpertParallel(Communicator* comm, int n_routed) {
  if (comm && comm->size() > 1) {
    comm_ = comm;
    rank_ = comm->rank();
    size_ = comm->size();
    if (size_ > n_routed) DIL_FAIL(size_, " expert-parallel ranks for ", n_routed, " routed experts");
  }
  lo_ = int(int64_t(n_routed) * rank_ / size_);
  hi_ = int(int64_t(n_routed) * (rank_ + 1) / size_);
}

bool ExpertParallel::begin(const StepBatch& batch, int topk, Backend& be, Scratch& step, Step* out) {
  DIL_CHECK(on(), "ExpertParallel::begin on a single rank");
  const std::vector<int64_t> counts =
      batch.rank_tokens.empty() ? comm_->exchange({int64_t(batch.tokens.size())}) : batch.rank_tokens;
  DIL_CHECK(counts.size() == size_t(size_) && counts[size_t(rank_)] == int64_t(batch.tokens.size()),
            "rank_tokens does not match this rank's batch");
  out->t_max = 0;
  for (int64_t c : counts) out->t_max = std::max(out->t_max, c);
  if (out->t_max == 0) return false;
  out->no_route = upload_i32(std::vector<int32_t>(size_t(out->t_max * topk), -1), be, step.storage());
  return true;
}

Tensor ExpertParallel::experts(Backend& be, StepProfiler* prof, MoeExpertsArgs e, const Tensor& x, const Tensor& w,
                               const Tensor& idx, const Step& st, Scratch& s) const {
  if (on()) return routed(be, prof, e, x, w, idx, st, s);
  ProfileScope ps(prof, "moe experts");
  Tensor out = s.f32({x.size(0), x.size(1)});  // [T, D] f32: the sum stays f32 until the shared expert joins it
  e.x = x; e.route_w = w; e.route_idx = idx; e.out = out;
  be.moe_experts(e);
  return out;
}

Tensor shared_expert(Backend& be, const Tensor& x, const Weight& w1, const Weight& w2, const Weight& w3, int act_block,
                     float swiglu_limit, Scratch& s) {
  const int64_t T = x.size(0), D = x.size(1), I = w1.out;
  const DType act = x.dtype;
  Tensor g = s.make(act, {T, I}), u = s.make(act, {T, I}), h = s.make(act, {T, I}), out = s.make(act, {T, D});
  be.linear(x, w1, act_block, g);
  be.linear(x, w3, act_block, u);
  be.swiglu(g, u, Tensor(), swiglu_limit, h);
  be.linear(h, w2, act_block, out);
  return out;
}

Tensor ExpertParallel::routed(Backend& be, StepProfiler* prof, MoeExpertsArgs e, const Tensor& x, const Tensor& w,
                              const Tensor& idx, const Step& st, Scratch& s) const {
  const int64_t T = x.size(0), Tm = st.t_max, R = size_, D = x.size(1), k = idx.size(1);
  DIL_CHECK(T <= Tm, "expert parallel: ", T, " tokens above the agreed maximum ", Tm);
  Tensor xp = x, wp = w, ip = idx;  // [Tm, D] f32|bf16, [Tm, k] f32, [Tm, k] i32
  if (T < Tm) {
    xp = s.make(x.dtype, {Tm, D});
    wp = s.f32({Tm, k});
    ip = s.i32({Tm, k});
    be.copy(ip, st.no_route);
    if (T > 0) {
      be.copy(xp.rows(0, T), x);
      be.copy(wp.rows(0, T), w);
      be.copy(ip.rows(0, T), idx);
    }
  }
  Tensor xa = s.make(x.dtype, {R * Tm, D}), wa = s.f32({R * Tm, k}), ia = s.i32({R * Tm, k});  // every rank's rows
  {
    ProfileScope ps(prof, "moe dispatch");
    comm_->all_gather(xp, xa);
    comm_->all_gather(wp, wa);
    comm_->all_gather(ip, ia);
  }
  Tensor part = s.f32({R * Tm, D});  // this rank's experts' share of every token's routed sum
  {
    ProfileScope ps(prof, "moe experts");
    e.x = xa; e.route_w = wa; e.route_idx = ia; e.out = part; e.expert_offset = lo_;
    be.moe_experts(e);
  }
  Tensor mine = s.f32({Tm, D});  // [Tm, D] routed sums of this rank's (padded) tokens
  {
    ProfileScope ps(prof, "moe combine");
    comm_->reduce_scatter(part, mine);
  }
  return mine.rows(0, T);
}

}  // namespace dil
