// The CPU reference backend: the executable specification of every op in backend/backend.h.
// Plain loops over host memory. Numerics (model-spec §3.1, design.md "Numerics"):
// - activations are f32; every reduction (dot products, norms, softmax sums, weighted sums)
//   accumulates in double and is rounded once to f32;
// - each output element is computed by a fixed loop that depends only on its own row's
//   inputs, so a token's result is bit-identical whatever else is in the batch;
// - transcendental functions (exp, sigmoid, cos/sin, softplus) are evaluated in double and
//   rounded once to f32, which a CUDA kernel can reproduce with its double-precision math.
// The per-op comments in each .cpp state the exact formula.
#pragma once
#include <memory>

#include "backend/backend.h"

namespace dil {

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(BackendOptions o = {}) : Backend(std::move(o)) {}
  Device device() const override { return Device::CPU; }
  std::string name() const override { return "cpu"; }
  std::string plan_name() const override { return "cpu"; }
  const std::vector<KernelImpl>& kernels() const override;

  // memory.cpp
  Buffer alloc(size_t bytes) override;
  Buffer alloc_scratch(size_t bytes) override;
  void upload(Tensor dst, const void* host_src) override;
  void download(void* host_dst, const Tensor& src) override;
  void fill(Tensor t, float value) override;
  void copy(Tensor dst, const Tensor& src) override;
  void synchronize() override {}
  Weight adopt_weight(const Weight& host) override { return host; }
  Tensor adopt_tensor(const Tensor& host) override { return host; }
  MemoryInfo memory_info() override;  // the system's MemTotal / MemAvailable; no peak tracking
  void embed(const Weight& table, const Tensor& ids, Tensor out) override;
  void add(const Tensor& a, const Tensor& b, Tensor out) override;

  // linear.cpp
  void linear(const Tensor& x, const Weight& w, int act_block, Tensor out) override;
  void grouped_linear(const Tensor& x, const Weight& w, int groups, Tensor out) override;

  // norm_rope.cpp
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor out) override;
  void rope(Tensor x, const Tensor& pos, const RopeTable& table, bool inverse) override;

  // quant.cpp
  void fp8_qdq(Tensor x, int cols, int block) override;
  void fp4_qdq(Tensor x, int block, bool e4m3_scale) override;
  void hadamard(Tensor x) override;

  // hc.cpp
  void hc_mix(const Tensor& X, const HcArgs& a, Tensor pre, Tensor post, Tensor comb) override;
  void hc_collapse(const Tensor& X, const Tensor& pre, Tensor out) override;
  void hc_post(const Tensor& F, const Tensor& X, const Tensor& post, const Tensor& comb, Tensor out) override;
  void hc_expand(const Tensor& e, int n, Tensor X) override;
  void hc_pre(const Tensor& X, const HcArgs& a, const Tensor& collapse_pre, const Tensor& norm_w, Tensor pre,
              Tensor post, Tensor comb, Tensor xn) override;

  // attention.cpp
  void sparse_attention(const AttnArgs& a, const StepMeta& m) override;
  using Backend::ring_write;
  void ring_write(const Tensor& kv_new, Tensor ring, const StepMeta& m, const kvpack::RowShape& pack) override;
  bool reads_packed_kv() const override { return true; }

  // compressor.cpp
  void compressor(const CompressorArgs& a, const EmitPlan& plan, const StepMeta& m) override;
  using Backend::paged_write;
  void paged_write(const Tensor& rows, Tensor cache, int rows_per_block, const EmitPlan& plan, const StepMeta& m,
                   const kvpack::RowShape& pack) override;
  void reset_state(Tensor state_kv, Tensor state_score, const std::vector<int32_t>& slots) override;

  // indexer.cpp
  void indexer_topk(const IndexerArgs& a, const StepMeta& m) override;

  // engram.cpp
  void engram_mix(const Tensor& X, const Tensor& kv, const Tensor& qk, const Tensor& mask, float eps,
                  Tensor out) override;

  // moe.cpp
  void moe_route(const MoeRouteArgs& a) override;
  void moe_experts(const MoeExpertsArgs& a) override;
  void swiglu(const Tensor& g, const Tensor& u, const Tensor& w, float limit, Tensor out) override;
};

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& o = {});

}  // namespace dil
