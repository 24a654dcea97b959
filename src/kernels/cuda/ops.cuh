// Launchers of the CUDA backend, one group per op family (one .cu file each). They enqueue
// work on ctx.stream and never wait for the device. Semantics: backend/backend.h and the CPU
// reference (src/kernels/cpu), which these must equal.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "kernels/cuda/arena.h"
#include "kernels/cuda/common.cuh"

namespace dil::cuda {

// A checkpoint weight as the kernels read it (device pointers, plain data).
struct WView {
  const void* w = nullptr;        // F32 / BF16 / E4M3 [N, K]; FP4: bytes [N, K/2]
  const uint8_t* scale = nullptr; // FP8: E8M0 [ceil(N/bn), ceil(K/bk)]; FP4: E8M0 [N, K/32]
  int kind = 0;                   // Weight::Kind as int
  int bn = 0, bk = 0;
  int pad_ = 0;                   // no uninitialised padding: tables are compared bytewise
  int64_t n = 0, k = 0;
  int64_t scale_cols = 0;
};
WView make_wview(const Weight& w);

struct Ctx {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  std::shared_ptr<Arena> arena;
  Buffer lt_workspace;         // cuBLASLt workspace
  // Scale layouts handed to cuBLASLt's block-scaled FP8 GEMM (BackendOptions::lt_fp8_layout "ab",
  // default "00"): a = 0: weight scales [N/128][ceil4(K/128)] (K blocks fastest), 1:
  // [K/128][ceil4(N/128)]; b = 0: activation scales [K/128][Mp] (tokens fastest), 1: [Mp][K/128].
  int lt_a_layout = 0, lt_b_layout = 0;
  bool lt_declined = false;  // cuBLASLt declined a planned configuration once (stderr said so)
  // Per-expert weight tables of moe_experts, uploaded once per expert list; the host copy
  // detects a list that changed (or a new list at a reused address) and triggers a re-upload.
  struct ExpertTable {
    std::vector<WView> host;
    Buffer dev;
  };
  std::unordered_map<const void*, ExpertTable> expert_tables;
  // sample_cluster per vocabulary size: 1 fits this device, -1 does not (absent: not yet asked).
  std::unordered_map<int64_t, int> sample_cluster_fit;
  // Weight data derived once at load (prepare_weight, from adopt_weight), keyed by the device
  // address of the checkpoint tensor it derives from (weights live as long as the backend):
  // the f32 block scales [N/128, K/128] of FP8 128x128 weights that cutlass_fp8 reads.
  std::unordered_map<const void*, Buffer> fp8_scales_f32;
  // and the BF16 dequantization [out, in] of FP8 weights the plan runs through grouped_linear's
  // dequant_bf16_lt (wo_a, as the official convert.py keeps it: BF16), so a call reads it
  // instead of dequantizing (prepare_bf16_copy, from adopt_weight).
  std::unordered_map<const void*, Buffer> bf16_copies;
  // moe_experts wgmma (moe_wgmma.cu), per expert list, made at its first call (map key: the w1
  // list's address; `key`: the w1, w2, w3 views it was made for, to notice a list that changed).
  struct MoeWgPrep {
    std::vector<WView> key;
    int act_block = 0;
    Buffer maps;          // [3][E] CUtensorMap: the FP4 tiles of w1, w3 and w2 (TMA)
    Buffer smax13, smax2; // FP8: largest E8M0 scale per (expert, weight-row block, 128-K block)
    bool fit = false;
  };
  std::unordered_map<const void*, MoeWgPrep> moe_wg;
  Buffer scratch(size_t bytes) { return arena->get(bytes); }
  // CTAs of a kernel that fit on the device at once (occupancy x multiprocessors), per (kernel,
  // threads, dynamic shared memory), asked once: grids of persistent kernels are one such wave.
  std::map<std::tuple<const void*, int, size_t>, int> resident_ctas;
  template <class Kern>
  int resident(Kern* k, int threads, size_t smem) {
    auto [it, fresh] = resident_ctas.try_emplace({reinterpret_cast<const void*>(k), threads, smem}, 0);
    if (fresh) {
      int per_sm = 0, sms = 0;
      DIL_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, threads, smem));
      DIL_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
      it->second = std::max(1, per_sm) * sms;
    }
    return it->second;
  }
  // Kernels written for it (pdl_wait before their inputs) launch with programmatic dependent
  // launch (launch_pdl); false: as plain launches (BackendOptions::pdl, DIL_PDL=0).
  bool pdl = true;
};

// Launches kernel k on c.stream, with programmatic stream serialization when c.pdl: k may start
// before the previous kernel of the stream ends, so k must call pdl_wait() (common.cuh) before
// it touches what an earlier kernel wrote. Checks the launch, naming `name`.
template <class... P, class... A>
void launch_pdl(const Ctx& c, const char* name, void (*k)(P...), dim3 grid, dim3 block, size_t smem, A&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = c.stream;
  cfg.attrs = attr;
  cfg.numAttrs = c.pdl ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, k, std::forward<A>(args)...);
  if (e != cudaSuccess) cuda_fail(name, cudaGetErrorString(e), __FILE__, __LINE__);
}

// elementwise.cu. Activation tensors are f32 or bf16 (backend.h); the typed pointer forms
// take float | bf16_t (common.cuh).
void fill_f32(Ctx& c, float* p, int64_t n, float v);
// Benchmarks: the stream's next op starts `ms` after this one starts (a one-thread spin).
void hold_stream(Ctx& c, double ms);
// out[i] = in[i], rounded to TO (instantiated for f32 <-> bf16).
template <class TI, class TO>
void convert(Ctx& c, const TI* in, TO* out, int64_t n);
// An f32 copy of an activation tensor (bf16 widened exactly) into out [numel] f32.
void to_f32(Ctx& c, const Tensor& in, float* out);
void add(Ctx& c, const Tensor& a, const Tensor& b, Tensor out);
void embed(Ctx& c, const Weight& table, const Tensor& ids, Tensor out);
void rms_norm(Ctx& c, const Tensor& x, const Tensor& w, float eps, Tensor out);
void rope(Ctx& c, Tensor x, const Tensor& pos, const RopeTable& t, bool inverse);
// FP8 act-quant QDQ (model-spec 3.1) of columns [0, cols) of `rows` rows in blocks of `block`:
// in [rows, ld_in] -> out [rows, ld_out]; in place when out == in (same ld), else only columns
// [0, cols) of out are written. Instantiated for every pair of float | bf16_t (QDQ'd values
// are exact in bf16, so a bf16 output holds them exactly).
template <class TI, class TO>
void fp8_qdq(Ctx& c, const TI* in, int64_t ld_in, TO* out, int64_t ld_out, int64_t rows, int cols, int block);
// In place on an activation tensor [R, d] (rows = numel / last dim).
void fp8_qdq(Ctx& c, Tensor x, int cols, int block);
void fp4_qdq(Ctx& c, Tensor x, int block, bool e4m3_scale);
void hadamard(Ctx& c, Tensor x);
void swiglu(Ctx& c, const Tensor& g, const Tensor& u, const Tensor& w, float limit, Tensor out);
void reset_state(Ctx& c, Tensor kv, Tensor score, const std::vector<int32_t>& slots);

// ceilings.cu: cuBLASLt BF16 / FP8 GEMM TFLOP/s and device copy GB/s (read + write), measured now.
std::map<std::string, double> measure_ceilings(cublasLtHandle_t lt, cudaStream_t stream);

// The launchers of op families with several implementations take the one the kernel plan
// chose (registry.cpp names; Backend::impl_for is the dispatch point).
// gemm.cu. out[m, :] = W . x[m, :] over `groups` independent groups (grouped_linear).
void linear(Ctx& c, const Tensor& x, const Weight& w, int act_block, Tensor out, const std::string& impl);
// What a device weight needs derived once, at load, by the linear paths (cutlass_fp8's f32
// block scales); a weight without it still runs, converting per call.
void prepare_weight(Ctx& c, const Weight& w);
// The BF16 copy of an FP8 weight (Ctx::bf16_copies), made once; the caller decides from the plan.
void prepare_bf16_copy(Ctx& c, const Weight& w);
void grouped_linear(Ctx& c, const Tensor& x, const Weight& w, int groups, Tensor out, const std::string& impl);
// The SIMT GEMM of linear / grouped_linear (its tiles, gemm_simt.cuh / gemv.cuh, are shared
// with the MoE): out[M, N] (ldo) = X[M, K] (ldx) . W^T, double accumulation rounded once.
// X and out are float | bf16_t (instantiated for all four pairs).
template <class TX, class TO>
void gemm_simt(Ctx& c, const TX* x, int64_t ldx, int64_t m, const WView& w, int64_t w_row0, TO* out, int64_t ldo,
               int groups, int64_t x_gstride, int64_t o_gstride, int64_t w_gstride);

// mhc.cu (the exact kernels; hc_post's "default")
void hc_mix(Ctx& c, const Tensor& X, const HcArgs& a, Tensor pre, Tensor post, Tensor comb);
void hc_collapse(Ctx& c, const Tensor& X, const Tensor& pre, Tensor out);
void hc_post_exact(Ctx& c, const Tensor& F, const Tensor& X, const Tensor& post, const Tensor& comb, Tensor out);
void hc_expand(Ctx& c, const Tensor& e, int n, Tensor X);
// mhc_fast.cu: the fused pre ("fused_fast": bf16 streams, f32 arithmetic; "composed": the exact
// hc_mix, hc_collapse and rms_norm in sequence), hc_mix ("fast_f32" | "default") and hc_post
// ("vec_f32" | "default") as the plan chose.
void hc_mix(Ctx& c, const Tensor& X, const HcArgs& a, Tensor pre, Tensor post, Tensor comb, const std::string& impl);
void hc_pre(Ctx& c, const Tensor& X, const HcArgs& a, const Tensor& collapse_pre, const Tensor& norm_w, Tensor pre,
            Tensor post, Tensor comb, Tensor xn, const std::string& impl);
void hc_post(Ctx& c, const Tensor& F, const Tensor& X, const Tensor& post, const Tensor& comb, Tensor out,
             const std::string& impl);

// attention.cu
void sparse_attention(Ctx& c, const AttnArgs& a, const StepMeta& m, const std::string& impl);
// pack.packed(): ring / cache are U8 packed rows, each row quantized once here (kv_packed.cuh).
void ring_write(Ctx& c, const Tensor& kv_new, Tensor ring, const StepMeta& m, const kvpack::RowShape& pack);
void paged_write(Ctx& c, const Tensor& rows, Tensor cache, int rows_per_block, const EmitPlan& plan,
                 const StepMeta& m, const kvpack::RowShape& pack);

// compressor.cu
void compressor(Ctx& c, const CompressorArgs& a, const EmitPlan& plan, const StepMeta& m);

// indexer.cu
void indexer_topk(Ctx& c, const IndexerArgs& a, const StepMeta& m, const std::string& impl);

// moe.cu
void moe_route(Ctx& c, const MoeRouteArgs& a);
void moe_experts(Ctx& c, const MoeExpertsArgs& a, const std::string& impl);

// sample.cu: Backend::sample (backend/sampling.h): sample_cluster when the vocabulary fits it,
// else one CTA per sampled row.
void sample(Ctx& c, const SampleArgs& a);
// sample_cluster.cu: a cluster of 8 CTAs per row, the row's slices in shared memory; false
// (nothing launched) when this device cannot hold a slice of this vocabulary.
bool sample_cluster(Ctx& c, const SampleArgs& a);

// engram.cu (V4.1)
void engram_mix(Ctx& c, const Tensor& X, const Tensor& kv, const Tensor& qk, const Tensor& mask, float eps,
                Tensor out);

}  // namespace dil::cuda
