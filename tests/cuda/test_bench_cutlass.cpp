// Timings of the V4-Flash projections in FP8 (issue 17; not tests: DISABLED_ unless asked for
// with --gtest_also_run_disabled_tests; scripts/gpu-check runs them), M = 1, 64, 512, 4096
// tokens, each against same-run peers on the same operands:
//   cutlass m64 / m128 / swap  the GEMM alone (gemm_cutlass.h) on pre-quantized e4m3 operands with
//                        1x128 / 128x128 f32 scales (M = 1 runs 4 rows: CUTLASS's minimum)
//   lt_fp8_tensor        cuBLASLt FP8 with per-tensor scales (what cuBLASLt offers on Hopper
//                        besides block scaling), fast accumulation off and on ("fastacc")
//   op <impl>            the whole linear op as the fast plan runs it (activation quantization
//                        included), and the same op forced to cublaslt_fp8 (block-scaled)
// TFLOP/s = 2 M N K / t; GB/s counts the weight, activation and bf16 output bytes once. The
// weight cycles through enough device copies to pass 256 MB (not served from L2 at small M).
// Device events around a loop of calls after 3 warm-ups.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>

#include "kernels/cuda/gemm_cutlass.h"
#include "parity.h"

namespace dil::test {
namespace {

#define BENCH_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call
#define BENCH_LT(call) ASSERT_EQ((call), CUBLAS_STATUS_SUCCESS) << #call

struct Shape {
  int64_t n, k;
  const char* what;
};

class CudaBenchCutlass : public CudaParity {
 protected:
  void SetUp() override {
    CudaParity::SetUp();
    if (IsSkipped()) return;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaEventCreate(&e0), cudaSuccess);
    ASSERT_EQ(cudaEventCreate(&e1), cudaSuccess);
    ASSERT_EQ(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
  }
  void TearDown() override {
    for (void* p : allocs) cudaFree(p);
    if (lt) cublasLtDestroy(lt);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (stream) cudaStreamDestroy(stream);
  }
  void* dmalloc(size_t bytes) {
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<size_t>(bytes, 16)) != cudaSuccess) return nullptr;
    allocs.push_back(p);
    return p;
  }
  template <class T>
  void* dcopy(const std::vector<T>& h) {
    void* p = dmalloc(h.size() * sizeof(T));
    if (p) cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
    return p;
  }
  // Milliseconds per call of fn(i) on `stream`, or a negative value when fn returned false.
  double time_stream(const std::function<bool(int)>& fn, int reps) {
    for (int i = 0; i < 3; ++i)
      if (!fn(i)) return -1;
    cudaEventRecord(e0, stream);
    for (int i = 0; i < reps; ++i) fn(i);
    cudaEventRecord(e1, stream);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    return ms / reps;
  }
  static void report(const std::string& impl, const Shape& s, int64_t M, double ms) {
    const std::string shape = std::string(s.what) + " M=" + std::to_string(M);
    if (ms < 0) {
      std::printf("BENCH | %-22s | %-30s | declined\n", impl.c_str(), shape.c_str());
    } else {
      const double flops = 2.0 * double(M) * double(s.n) * double(s.k);
      const double bytes = double(s.n * s.k + M * s.k + 2 * M * s.n);
      std::printf("BENCH | %-22s | %-30s | %9.4f ms | %8.1f TFLOP/s | %8.1f GB/s\n", impl.c_str(), shape.c_str(), ms,
                  flops / ms * 1e-9, bytes / ms * 1e-6);
    }
    std::fflush(stdout);
  }
  // cuBLASLt FP8 with per-tensor scales: D [M, N] bf16 = (sa sb) x [M, K] . w [N, K]^T.
  bool lt_tensor(const void* w, const void* x, void* d, int64_t M, int64_t N, int64_t K, const float* sa,
                 const float* sb, bool fast_accum, void* ws, size_t ws_bytes) {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    bool ok = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    int8_t fa = fast_accum ? 1 : 0;
    ok = ok && cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)) == 0 &&
         cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)) == 0 &&
         cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof(fa)) == 0 &&
         cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)) == 0 &&
         cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)) == 0;
    ok = ok && cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, uint64_t(K), uint64_t(N), K) == 0 &&
         cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, uint64_t(K), uint64_t(M), K) == 0 &&
         cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, uint64_t(N), uint64_t(M), N) == 0 &&
         cublasLtMatmulPreferenceCreate(&pref) == 0 &&
         cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                              sizeof(ws_bytes)) == 0;
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    const bool descs = ok;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    if (ok) st = cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &res, &found);
    ok = ok && st == CUBLAS_STATUS_SUCCESS && found > 0;
    const float alpha = 1.f, beta = 0.f;
    if (ok) st = cublasLtMatmul(lt, op, &alpha, w, la, x, lb, &beta, d, ld, d, ld, &res.algo, ws, ws_bytes, stream);
    ok = ok && st == CUBLAS_STATUS_SUCCESS;
    if (!ok && !lt_said) {  // why, once per run
      std::printf("BENCH | lt_fp8_tensor declined: %s, status %s, %d algorithms\n",
                  descs ? "heuristic or matmul" : "descriptor setup", cublasLtGetStatusString(st), found);
      lt_said = true;
    }
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    return ok;
  }

  cudaStream_t stream = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  cublasLtHandle_t lt = nullptr;
  bool lt_said = false;
  std::vector<void*> allocs;
};

TEST_F(CudaBenchCutlass, DISABLED_Fp8Projections) {
  const Shape shapes[] = {{1024, 4096, "wq_a [1024,4096]"},     {32768, 1024, "wq_b [32768,1024]"},
                          {512, 4096, "wkv [512,4096]"},         {4096, 8192, "wo_b [4096,8192]"},
                          {2048, 4096, "shared w1 [2048,4096]"}, {4096, 2048, "shared w2 [4096,2048]"},
                          {8192, 1024, "idx wq_b [8192,1024]"}};
  const int64_t kMaxM = 4096;
  const size_t ws_bytes = 64u << 20;
  void* ws = dmalloc(ws_bytes);
  // Activations for the largest M and K: e4m3 codes, power-of-two scales, a bf16 copy for the op.
  const int64_t maxK = 8192, maxN = 32768;
  void* xq = dcopy(rnd_fp8(size_t(kMaxM * maxK), 1700));
  std::vector<float> sx(size_t(maxK / 128 * kMaxM));
  for (size_t i = 0; i < sx.size(); ++i) sx[i] = std::ldexp(1.0f, -int(i % 7) - 4);
  void* xs = dcopy(sx);
  void* d = dmalloc(size_t(kMaxM * maxN) * 2);
  const std::vector<float> one = {1.0f};  // per-tensor scales, one allocation each (aligned)
  const float* s1 = static_cast<const float*>(dcopy(one));
  const float* s2 = static_cast<const float*>(dcopy(one));
  ASSERT_TRUE(ws && xq && xs && d && s1 && s2);
  auto fast = make_backend(BackendKind::CUDA, 0, test_options());
  fast->set_numerics(Numerics::Fast);
  BackendOptions lo = test_options();
  lo.force["linear"] = "cublaslt_fp8";
  auto ltb = make_backend(BackendKind::CUDA, 0, lo);
  ltb->set_numerics(Numerics::Fast);
  for (const Shape& s : shapes) {
    HostWeight hw = make_weight(Weight::Kind::FP8, s.n, s.k, 128, 1710);
    const double wbytes = double(s.n * s.k);
    const int copies = int(std::clamp<double>(std::ceil(256e6 / wbytes), 1, 64));
    std::vector<float> sw(hw.scale.size());
    for (size_t i = 0; i < sw.size(); ++i) sw[i] = std::ldexp(1.0f, int(hw.scale[i]) - 127);
    const float* sfb = static_cast<const float*>(dcopy(sw));
    std::vector<void*> wd;
    for (int i = 0; i < copies; ++i) wd.push_back(dcopy(hw.w));
    ASSERT_TRUE(sfb && wd.back());
    // The op-level weights: device copies in each backend (scales prepared at load there).
    std::vector<Weight> wf, wl;
    for (int i = 0; i < copies; ++i) {
      wf.push_back(fast->adopt_weight(hw.wt));
      wl.push_back(ltb->adopt_weight(hw.wt));
    }
    for (int64_t M : {int64_t(1), int64_t(64), int64_t(512), kMaxM}) {
      const int reps = M >= 512 ? 20 : std::max(copies, 50);
      const int64_t Mc = (M + 3) / 4 * 4;  // CUTLASS's rows
      for (dil::cuda::CutlassTile t :
           {dil::cuda::CutlassTile::M64, dil::cuda::CutlassTile::M128, dil::cuda::CutlassTile::Swap}) {
        dil::cuda::CutlassFp8Gemm g;
        g.a = xq;
        g.sfa = static_cast<const float*>(xs);
        g.sfb = sfb;
        g.d = d;
        g.m = int(Mc);
        g.n = int(s.n);
        g.k = int(s.k);
        const double ms = time_stream([&](int i) {
          g.b = wd[size_t(i % copies)];
          return dil::cuda::cutlass_fp8_run(t, g, ws, ws_bytes, stream);
        }, reps);
        report(std::string("cutlass ") + dil::cuda::cutlass_tile_name(t), s, M, ms);
      }
      for (bool fa : {false, true}) {
        const double ms = time_stream([&](int i) {
          return lt_tensor(wd[size_t(i % copies)], xq, d, M, s.n, s.k, s1, s2, fa, ws, ws_bytes);
        }, reps);
        report(fa ? "lt_fp8_tensor fastacc" : "lt_fp8_tensor", s, M, ms);
      }
      // The whole op (bf16 in and out) as each backend's plan runs it.
      auto xh = bf16_of(random_vec(size_t(M * s.k), 1720, 3.0f));
      for (Backend* be : {fast.get(), ltb.get()}) {
        std::vector<Weight>& ws_be = be == fast.get() ? wf : wl;
        Buffer xb = be->alloc(xh.size() * 2), ob = be->alloc(size_t(M * s.n) * 2);
        Tensor x(xb.data(), DType::BF16, {M, s.k}, Device::CUDA), o(ob.data(), DType::BF16, {M, s.n}, Device::CUDA);
        be->upload(x, xh.data());
        const std::string impl =
            be->impl_for(linear_site(ws_be[0], 128, DType::BF16, DType::BF16, Numerics::Fast), M).name;
        const double ms =
            event_ms_per_call(*be, [&](int i) { be->linear(x, ws_be[size_t(i % copies)], 128, o); }, reps);
        report("op " + impl, s, M, ms);
      }
    }
  }
}

}  // namespace
}  // namespace dil::test
