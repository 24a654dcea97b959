// CudaBackend: the Backend interface on one CUDA device. Owns the stream, the caching arena,
// the cuBLASLt handle and the device copies of adopted weights; each op forwards to its
// family's launcher (ops.cuh). Nothing here waits for the device except download() and
// synchronize().
#include "kernels/cuda/cuda_backend.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/cuda/ops.cuh"
#include "kernels/cuda/registry.h"

namespace dil {
namespace cuda {

[[noreturn]] void cuda_fail(const char* call, const char* what, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: CUDA call failed: %s: %s\n", file, line, call, what);
  std::fflush(stderr);
  std::abort();
}

WView make_wview(const Weight& w) {
  WView v;
  v.w = w.w.data;
  v.scale = w.scale.empty() ? nullptr : w.scale.ptr<uint8_t>();
  v.kind = int(w.kind);
  v.bn = w.block_out;
  v.bk = w.block_in;
  v.n = w.out;
  v.k = w.in;
  if (w.kind == Weight::Kind::FP8) {
    DIL_CHECK(v.scale && v.bn > 0 && v.bk > 0, "FP8 weight without block scales");
    v.scale_cols = ceil_div(w.in, w.block_in);
  } else if (w.kind == Weight::Kind::FP4) {
    DIL_CHECK(v.scale, "FP4 weight without scales");
    v.scale_cols = ceil_div(w.in, 32);
  }
  return v;
}

namespace {

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const BackendOptions& o) : Backend(o) {
    int n = cuda_device_count();
    if (device < 0 || device >= n) DIL_FAIL("CUDA device ", device, " not available (", n, " visible)");
    c_.device = device;
    c_.pdl = options().pdl;
    DIL_CUDA(cudaSetDevice(device));
    DIL_CUDA(cudaStreamCreateWithFlags(&c_.stream, cudaStreamNonBlocking));
    DIL_CUBLAS(cublasLtCreate(&c_.lt));
    c_.arena = std::make_shared<cuda::Arena>(device);
    c_.lt_workspace = c_.arena->get(size_t(32) << 20);
    const std::string& l = o.lt_fp8_layout;
    DIL_CHECK(l.size() == 2 && (l[0] == '0' || l[0] == '1') && (l[1] == '0' || l[1] == '1'),
              "lt_fp8_layout must be two digits 0/1, got '", l, "'");
    c_.lt_a_layout = l[0] == '1';
    c_.lt_b_layout = l[1] == '1';
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(c_.stream);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    c_.expert_tables.clear();
    c_.moe_wg.clear();
    owned_.clear();
    c_.lt_workspace.reset();
    cublasLtDestroy(c_.lt);
    cudaStreamDestroy(c_.stream);
  }

  Device device() const override { return Device::CUDA; }
  void* native_stream() override { return c_.stream; }
  std::string name() const override { return str_cat("cuda:", c_.device); }
  std::string plan_name() const override { return "cuda"; }
  const std::vector<KernelImpl>& kernels() const override { return cuda_kernel_registry(); }

  Buffer alloc(size_t bytes) override {
    Buffer b = c_.arena->get(bytes);
    DIL_CUDA(cudaMemsetAsync(b.data(), 0, bytes, c_.stream));
    return b;
  }
  Buffer alloc_scratch(size_t bytes) override {
    Buffer b = c_.arena->get(bytes);
    if (options().poison_scratch) DIL_CUDA(cudaMemsetAsync(b.data(), 0xff, bytes, c_.stream));
    return b;
  }
  void upload(Tensor dst, const void* host_src) override {
    DIL_CHECK(dst.device == Device::CUDA, "upload: destination not on CUDA");
    DIL_CUDA(cudaMemcpyAsync(dst.data, host_src, dst.nbytes(), cudaMemcpyHostToDevice, c_.stream));
  }
  void download(void* host_dst, const Tensor& src) override {
    DIL_CHECK(src.device == Device::CUDA, "download: source not on CUDA");
    DIL_CUDA(cudaMemcpyAsync(host_dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost, c_.stream));
    DIL_CUDA(cudaStreamSynchronize(c_.stream));  // the host reads the result next
  }
  void fill(Tensor t, float value) override {
    DIL_CHECK(t.dtype == DType::F32, "fill: f32 only");
    cuda::fill_f32(c_, t.ptr<float>(), t.numel(), value);
  }
  void copy(Tensor dst, const Tensor& src) override {
    DIL_CHECK(dst.nbytes() == src.nbytes(), "copy: size mismatch ", dst.nbytes(), " vs ", src.nbytes());
    DIL_CUDA(cudaMemcpyAsync(dst.data, src.data, src.nbytes(), cudaMemcpyDeviceToDevice, c_.stream));
  }
  void synchronize() override { DIL_CUDA(cudaStreamSynchronize(c_.stream)); }
  MemoryInfo memory_info() override {
    DIL_CUDA(cudaSetDevice(c_.device));
    size_t free = 0, total = 0;
    DIL_CUDA(cudaMemGetInfo(&free, &total));
    MemoryInfo m;
    m.total = total;
    m.available = free + c_.arena->bytes_cached();
    m.in_use = c_.arena->bytes_in_use();
    m.peak_in_use = c_.arena->peak_in_use();
    m.tracks_peak = true;
    return m;
  }
  void reset_memory_peak() override { c_.arena->reset_peak(); }

  Weight adopt_weight(const Weight& host) override {
    Weight w = host;
    if (!host.w.empty()) w.w = adopt_tensor(host.w);
    if (!host.scale.empty()) w.scale = adopt_tensor(host.scale);
    cuda::prepare_weight(c_, w);
    if (wants_bf16_copy(w)) cuda::prepare_bf16_copy(c_, w);
    return w;
  }
  // True when the installed plan runs a grouped_linear site of w's format through
  // dequant_bf16_lt (fast numerics' wo_a from 64 rows): that path then reads a BF16 copy made
  // here, at load (counted before the KV pool is sized), instead of dequantizing per call. A
  // weight of another op with the same shape and format would get an unused copy: none in V4 /
  // V4.1 (wo_a is [o_groups * o_lora_rank, H * head_dim / o_groups]).
  bool wants_bf16_copy(const Weight& w) const {
    if (w.kind != Weight::Kind::FP8 || !plan()) return false;
    for (const PlanEntry& e : plan()->entries()) {
      const OpSite& s = e.site;
      if (s.op != "grouped_linear" || s.wkind != int(w.kind) || s.n != w.out || s.k != w.in ||
          s.block_out != w.block_out || s.block_in != w.block_in)
        continue;
      for (const KernelImpl* k : e.impls)
        if (k->name == "dequant_bf16_lt") return true;
    }
    return false;
  }
  Tensor adopt_tensor(const Tensor& host) override {
    if (host.empty()) return host;
    if (host.device == Device::CUDA) return host;
    Buffer b = c_.arena->get(host.nbytes());
    Tensor t = host;
    t.data = b.data();
    t.device = Device::CUDA;
    upload(t, host.data);
    owned_.push_back(std::move(b));
    return t;
  }

  void embed(const Weight& table, const Tensor& ids, Tensor out) override { cuda::embed(c_, table, ids, out); }
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor out) override {
    cuda::rms_norm(c_, x, w, eps, out);
  }
  void add(const Tensor& a, const Tensor& b, Tensor out) override { cuda::add(c_, a, b, out); }
  void linear(const Tensor& x, const Weight& w, int act_block, Tensor out) override {
    const int64_t rows = w.in ? x.numel() / w.in : 0;
    cuda::linear(c_, x, w, act_block, out, impl_for(linear_site(w, act_block, x.dtype, out.dtype, numerics()), rows).name);
  }
  void grouped_linear(const Tensor& x, const Weight& w, int groups, Tensor out) override {
    const OpSite s = grouped_linear_site(w, groups, x.dtype, out.dtype, numerics());
    cuda::grouped_linear(c_, x, w, groups, out, impl_for(s, x.size(0)).name);
  }
  void rope(Tensor x, const Tensor& pos, const RopeTable& table, bool inverse) override {
    cuda::rope(c_, x, pos, table, inverse);
  }
  void fp8_qdq(Tensor x, int cols, int block) override { cuda::fp8_qdq(c_, x, cols, block); }
  void fp4_qdq(Tensor x, int block, bool e4m3_scale) override { cuda::fp4_qdq(c_, x, block, e4m3_scale); }
  void hadamard(Tensor x) override { cuda::hadamard(c_, x); }

  void hc_mix(const Tensor& X, const HcArgs& a, Tensor pre, Tensor post, Tensor comb) override {
    cuda::hc_mix(c_, X, a, pre, post, comb, impl_for(simple_site("hc_mix", X.dtype, numerics()), X.size(0)).name);
  }
  void hc_collapse(const Tensor& X, const Tensor& pre, Tensor out) override { cuda::hc_collapse(c_, X, pre, out); }
  void hc_post(const Tensor& F, const Tensor& X, const Tensor& post, const Tensor& comb, Tensor out) override {
    cuda::hc_post(c_, F, X, post, comb, out, impl_for(simple_site("hc_post", X.dtype, numerics()), X.size(0)).name);
  }
  void hc_expand(const Tensor& e, int n, Tensor X) override { cuda::hc_expand(c_, e, n, X); }
  void hc_pre(const Tensor& X, const HcArgs& a, const Tensor& collapse_pre, const Tensor& norm_w, Tensor pre,
              Tensor post, Tensor comb, Tensor xn) override {
    cuda::hc_pre(c_, X, a, collapse_pre, norm_w, pre, post, comb, xn,
                 impl_for(simple_site("hc_pre", X.dtype, numerics()), X.size(0)).name);
  }

  void sparse_attention(const AttnArgs& a, const StepMeta& m) override {
    const int K = a.comp_idx.empty() ? 0 : int(a.comp_idx.size(1));
    const OpSite s = attention_site(int(a.q.size(1)), int(a.q.size(2)), a.comp.empty() ? 0 : a.comp_ratio, K,
                                    a.q.dtype, numerics(), a.non_causal);
    cuda::sparse_attention(c_, a, m, impl_for(s, a.q.size(0)).name);
  }
  using Backend::ring_write;
  // Fast numerics store the official packed rows (model/kv_layout.h): the writers quantize each
  // row once, the fast attention and indexer kernels dequantize on load (exact, in BF16).
  bool reads_packed_kv() const override { return true; }
  void ring_write(const Tensor& kv_new, Tensor ring, const StepMeta& m, const kvpack::RowShape& pack) override {
    cuda::ring_write(c_, kv_new, ring, m, pack);
  }
  void compressor(const CompressorArgs& a, const EmitPlan& plan, const StepMeta& m) override {
    cuda::compressor(c_, a, plan, m);
  }
  using Backend::paged_write;
  void paged_write(const Tensor& rows, Tensor cache, int rows_per_block, const EmitPlan& plan, const StepMeta& m,
                   const kvpack::RowShape& pack) override {
    cuda::paged_write(c_, rows, cache, rows_per_block, plan, m, pack);
  }
  void indexer_topk(const IndexerArgs& a, const StepMeta& m) override {
    const int cand = !a.cand_out.empty() ? 1 : !a.cand_in.empty() ? 2 : 0;
    const OpSite s = indexer_site(int(a.q.size(1)), int(a.q.size(2)), a.topk, cand, a.cand_block, a.cand_topk,
                                  a.q.dtype, numerics());
    cuda::indexer_topk(c_, a, m, impl_for(s, a.q.size(0)).name);
  }

  void moe_route(const MoeRouteArgs& a) override { cuda::moe_route(c_, a); }
  void moe_experts(const MoeExpertsArgs& a) override {
    DIL_CHECK(a.w1 && !a.w1->empty(), "moe_experts: no experts");
    const OpSite s = moe_experts_site((*a.w1)[0], a.act_block, a.x.dtype, a.out.dtype, numerics());
    cuda::moe_experts(c_, a, impl_for(s, a.x.size(0)).name);
  }
  void swiglu(const Tensor& g, const Tensor& u, const Tensor& w, float limit, Tensor out) override {
    cuda::swiglu(c_, g, u, w, limit, out);
  }
  void engram_mix(const Tensor& X, const Tensor& kv, const Tensor& qk, const Tensor& mask, float eps,
                  Tensor out) override {
    cuda::engram_mix(c_, X, kv, qk, mask, eps, out);
  }
  void sample(const SampleArgs& a) override { cuda::sample(c_, a); }
  void reset_state(Tensor state_kv, Tensor state_score, const std::vector<int32_t>& slots) override {
    cuda::reset_state(c_, state_kv, state_score, slots);
  }

  // Device events: marking does not stall the stream; elapsed_ms waits for the later event.
  int record_event() override {
    if (n_events_ == events_.size()) {
      cudaEvent_t e;
      DIL_CUDA(cudaEventCreate(&e));
      events_.push_back(e);
    }
    DIL_CUDA(cudaEventRecord(events_[n_events_], c_.stream));
    return int(n_events_++);
  }
  double elapsed_ms(int from, int to) override {
    DIL_CHECK(from >= 0 && to >= from && size_t(to) < n_events_, "bad event ids ", from, " ", to);
    DIL_CUDA(cudaEventSynchronize(events_[size_t(to)]));
    float ms = 0.f;
    DIL_CUDA(cudaEventElapsedTime(&ms, events_[size_t(from)], events_[size_t(to)]));
    return double(ms);
  }
  void clear_events() override { n_events_ = 0; }  // the events are reused
  void hold(double ms) override { cuda::hold_stream(c_, ms); }
  std::map<std::string, double> measure_ceilings() override {
    synchronize();
    return cuda::measure_ceilings(c_.lt, c_.stream);
  }

 private:
  cuda::Ctx c_;
  std::vector<Buffer> owned_;  // device copies of adopted weights and tensors
  std::vector<cudaEvent_t> events_;  // pool for record_event; the first n_events_ are in use
  size_t n_events_ = 0;
};

}  // namespace
}  // namespace cuda

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::unique_ptr<Backend> make_cuda_backend(int device, const BackendOptions& o) {
  return std::make_unique<cuda::CudaBackend>(device, o);
}

}  // namespace dil
