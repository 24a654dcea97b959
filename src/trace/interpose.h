// A Backend that runs every op of another backend (`inner`) through a hook: the hook sees each
// call's tensors by name and role (inputs, outputs, state updated in place) before and after
// the inner op runs, and may read or overwrite them. The trace tool (trace.h) records backend
// A's calls and replays them on backend B this way; a test hook perturbs one op's output.
// Memory (alloc, upload, download, fill, copy), weights and events go straight to `inner`;
// only the ops of backend.h that compute are hooked.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace dil::trace {

enum class Role : uint8_t { In, Out, InOut };

// One tensor argument of an op call. `t` points at the interposer's copy of the argument, which
// the inner op receives, so a hook can read or overwrite the memory it views.
struct Arg {
  const char* name = "";  // "x", "out", "ring", ...
  Tensor* t = nullptr;
  Role role = Role::In;
  bool state = false;  // recurrent state (ring, paged rows, compressor state): exact everywhere
  bool rows = false;   // KV rows an attention reads (the scale of Tolerance::abs_vs_rows)
  bool written = true; // an output the op writes (hc_mix's post / comb for the head: not)
};

// One op call: its tensors, the kernel-plan site that picks its implementation (backend/plan.h),
// and the flags that change its arithmetic between numerics modes.
struct Call {
  const char* op = "";
  std::vector<Arg> args;
  OpSite site;
  bool planned = true;  // false: no registry family (reset_state: exact by construction)
  int64_t rows = 0;     // the row count impl_for dispatches on
  bool round_bf16 = false;  // moe_experts, hc_pre: the fast numerics' internal BF16 roundings
};

// The implementation `be` runs for a call, and its tolerance against the CPU reference.
struct ImplInfo {
  std::string name;
  Tolerance tol;
};
ImplInfo implementation(Backend& be, const Call& c);

class CallHook {
 public:
  virtual ~CallHook() = default;
  // Runs `op` (the inner backend's call on c's tensors) with whatever the hook does around it.
  virtual void around(Backend& inner, Call& c, const std::function<void()>& op) = 0;
};

class InterposingBackend : public Backend {
 public:
  InterposingBackend(Backend& inner, CallHook& hook, std::string label);
  // load_model installs the kernel plan on this backend (Backend::install_plan is not
  // virtual); the inner backend dispatches on its own copy: call this after load_model (and
  // after set_numerics), before the first op.
  void sync_plan();
  // While set, ops run straight on the inner backend, unseen by the hook: the trace's synthesized
  // context (Model::randomize_cache QDQs the rows it writes) is set-up, not a traced step.
  void set_passthrough(bool on) { passthrough_ = on; }
  Backend& inner() { return in_; }

  Device device() const override { return in_.device(); }
  std::string name() const override { return label_ + "(" + in_.name() + ")"; }
  std::string plan_name() const override { return in_.plan_name(); }
  const std::vector<KernelImpl>& kernels() const override { return in_.kernels(); }

  Buffer alloc(size_t bytes) override { return in_.alloc(bytes); }
  Buffer alloc_scratch(size_t bytes) override { return in_.alloc_scratch(bytes); }
  void upload(Tensor dst, const void* src) override { in_.upload(dst, src); }
  void download(void* dst, const Tensor& src) override { in_.download(dst, src); }
  void fill(Tensor t, float v) override { in_.fill(t, v); }
  void copy(Tensor dst, const Tensor& src) override { in_.copy(dst, src); }
  void synchronize() override { in_.synchronize(); }
  Weight adopt_weight(const Weight& host) override { return in_.adopt_weight(host); }
  Tensor adopt_tensor(const Tensor& host) override { return in_.adopt_tensor(host); }
  int record_event() override { return in_.record_event(); }
  double elapsed_ms(int from, int to) override { return in_.elapsed_ms(from, to); }
  void hold(double ms) override { in_.hold(ms); }
  void clear_events() override { in_.clear_events(); }
  std::map<std::string, double> measure_ceilings() override { return in_.measure_ceilings(); }
  void* native_stream() override { return in_.native_stream(); }

  void embed(const Weight& table, const Tensor& ids, Tensor out) override;
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor out) override;
  void add(const Tensor& a, const Tensor& b, Tensor out) override;
  void linear(const Tensor& x, const Weight& w, int act_block, Tensor out) override;
  void grouped_linear(const Tensor& x, const Weight& w, int groups, Tensor out) override;
  void rope(Tensor x, const Tensor& pos, const RopeTable& table, bool inverse) override;
  void fp8_qdq(Tensor x, int cols, int block) override;
  void fp4_qdq(Tensor x, int block, bool e4m3_scale) override;
  void hadamard(Tensor x) override;
  void hc_mix(const Tensor& X, const HcArgs& a, Tensor pre, Tensor post, Tensor comb) override;
  void hc_collapse(const Tensor& X, const Tensor& pre, Tensor out) override;
  void hc_post(const Tensor& F, const Tensor& X, const Tensor& post, const Tensor& comb, Tensor out) override;
  void hc_expand(const Tensor& e, int n, Tensor X) override;
  void hc_pre(const Tensor& X, const HcArgs& a, const Tensor& collapse_pre, const Tensor& norm_w, Tensor pre,
              Tensor post, Tensor comb, Tensor xn) override;
  void sparse_attention(const AttnArgs& a, const StepMeta& m) override;
  using Backend::ring_write;
  void ring_write(const Tensor& kv_new, Tensor ring, const StepMeta& m, const kvpack::RowShape& pack) override;
  bool reads_packed_kv() const override { return in_.reads_packed_kv(); }
  void compressor(const CompressorArgs& a, const EmitPlan& plan, const StepMeta& m) override;
  using Backend::paged_write;
  void paged_write(const Tensor& rows, Tensor cache, int rows_per_block, const EmitPlan& plan, const StepMeta& m,
                   const kvpack::RowShape& pack) override;
  void indexer_topk(const IndexerArgs& a, const StepMeta& m) override;
  void moe_route(const MoeRouteArgs& a) override;
  void moe_experts(const MoeExpertsArgs& a) override;
  void swiglu(const Tensor& g, const Tensor& u, const Tensor& w, float limit, Tensor out) override;
  void engram_mix(const Tensor& X, const Tensor& kv, const Tensor& qk, const Tensor& mask, float eps,
                  Tensor out) override;
  void reset_state(Tensor state_kv, Tensor state_score, const std::vector<int32_t>& slots) override;

 private:
  // A call of a family with one implementation per backend (its site as op_sites lists it).
  Call simple(const char* op, int64_t rows) const;
  void run(Call& c, const std::function<void()>& op) {
    if (passthrough_) op();
    else hook_.around(in_, c, op);
  }

  Backend& in_;
  CallHook& hook_;
  std::string label_;
  bool passthrough_ = false;
};

}  // namespace dil::trace
