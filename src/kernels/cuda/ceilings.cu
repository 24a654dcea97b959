// Hardware ceilings measured in the same run as a benchmark (design.md, performance method):
// cuBLASLt dense BF16 and FP8 (e4m3, per-tensor scale) GEMM rates at 8192^3 on random data
// (never zeros: METHOD.md saw zeros run 13% faster), and device-to-device copy bandwidth
// counting bytes read plus bytes written.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <map>
#include <string>

#include "kernels/cuda/common.cuh"

namespace dil {
namespace cuda {

namespace {

__global__ void random_bytes(uint8_t* p, size_t n, int kind, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15; h *= 0x2c1b3c6du; h ^= h >> 12;
    if (kind == 0) {  // bf16 pairs: values in [-1, 1)
      if (i % 2 == 0) {
        float v = float(int32_t(h & 0xffff) - 32768) / 32768.0f;
        __nv_bfloat16 b = __float2bfloat16(v);
        uint16_t bits = *reinterpret_cast<uint16_t*>(&b);
        p[i] = uint8_t(bits & 0xff);
        if (i + 1 < n) p[i + 1] = uint8_t(bits >> 8);
      }
    } else {  // e4m3 codes without NaN (exponent field <= 14)
      p[i] = uint8_t(h & 0xf7);
    }
  }
}

double gemm_tflops(cublasLtHandle_t lt, cudaStream_t st, cudaDataType_t ab, int64_t n) {
  uint8_t *A, *B, *D;
  void* ws;
  const size_t esz = ab == CUDA_R_16BF ? 2 : 1, ws_bytes = size_t(64) << 20;
  DIL_CUDA(cudaMalloc(&A, size_t(n * n) * esz));
  DIL_CUDA(cudaMalloc(&B, size_t(n * n) * esz));
  DIL_CUDA(cudaMalloc(&D, size_t(n * n) * 2));
  DIL_CUDA(cudaMalloc(&ws, ws_bytes));
  random_bytes<<<1024, 256, 0, st>>>(A, size_t(n * n) * esz, ab == CUDA_R_16BF ? 0 : 1, 1);
  random_bytes<<<1024, 256, 0, st>>>(B, size_t(n * n) * esz, ab == CUDA_R_16BF ? 0 : 1, 2);
  DIL_LAUNCH_CHECK("random_bytes");
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, ld;
  cublasLtMatmulPreference_t pref;
  DIL_CUBLAS(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  DIL_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  DIL_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  DIL_CUBLAS(cublasLtMatrixLayoutCreate(&la, ab, uint64_t(n), uint64_t(n), n));
  DIL_CUBLAS(cublasLtMatrixLayoutCreate(&lb, ab, uint64_t(n), uint64_t(n), n));
  DIL_CUBLAS(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, uint64_t(n), uint64_t(n), n));
  DIL_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  DIL_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes)));
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  DIL_CUBLAS(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &heur, &found));
  double tflops = 0;
  if (found > 0) {
    const float alpha = 1.0f, beta = 0.0f;
    auto launch = [&] {
      DIL_CUBLAS(cublasLtMatmul(lt, op, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &heur.algo, ws, ws_bytes, st));
    };
    for (int i = 0; i < 3; ++i) launch();
    cudaEvent_t e0, e1;
    DIL_CUDA(cudaEventCreate(&e0));
    DIL_CUDA(cudaEventCreate(&e1));
    const int iters = 20;
    DIL_CUDA(cudaEventRecord(e0, st));
    for (int i = 0; i < iters; ++i) launch();
    DIL_CUDA(cudaEventRecord(e1, st));
    DIL_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    DIL_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    tflops = 2.0 * double(n) * double(n) * double(n) * iters / (double(ms) * 1e-3) / 1e12;
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatmulDescDestroy(op);
  DIL_CUDA(cudaFree(A));
  DIL_CUDA(cudaFree(B));
  DIL_CUDA(cudaFree(D));
  DIL_CUDA(cudaFree(ws));
  return tflops;
}

double copy_gbps(cudaStream_t st) {
  const size_t bytes = size_t(4) << 30;
  uint8_t *a, *b;
  DIL_CUDA(cudaMalloc(&a, bytes));
  DIL_CUDA(cudaMalloc(&b, bytes));
  random_bytes<<<1024, 256, 0, st>>>(a, bytes, 1, 3);
  DIL_LAUNCH_CHECK("random_bytes");
  DIL_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, st));
  cudaEvent_t e0, e1;
  DIL_CUDA(cudaEventCreate(&e0));
  DIL_CUDA(cudaEventCreate(&e1));
  const int iters = 10;
  DIL_CUDA(cudaEventRecord(e0, st));
  for (int i = 0; i < iters; ++i) DIL_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, st));
  DIL_CUDA(cudaEventRecord(e1, st));
  DIL_CUDA(cudaEventSynchronize(e1));
  float ms = 0;
  DIL_CUDA(cudaEventElapsedTime(&ms, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  DIL_CUDA(cudaFree(a));
  DIL_CUDA(cudaFree(b));
  return 2.0 * double(bytes) * iters / (double(ms) * 1e-3) / 1e9;
}

}  // namespace

std::map<std::string, double> measure_ceilings(cublasLtHandle_t lt, cudaStream_t st) {
  std::map<std::string, double> r;
  r["bf16_gemm_tflops"] = gemm_tflops(lt, st, CUDA_R_16BF, 8192);
  r["fp8_gemm_tflops"] = gemm_tflops(lt, st, CUDA_R_8F_E4M3, 8192);
  r["hbm_copy_gbps"] = copy_gbps(st);
  return r;
}

}  // namespace cuda
}  // namespace dil
