// Dense projections. Paths (the kernel plan chooses one per op site and row regime; the
// requirements are in registry.cpp):
// - FP8 with 128x128 blocks and activation blocks of 128 (V4 official numerics): activations
//   quantized to e4m3 with ue8m0 scales per 128 by our kernel, then cuBLASLt's block-scaled
//   FP8 GEMM (A = weights, BLK128x128_32F scales; B = activations, VEC128_32F scales).
// - BF16: cuBLASLt BF16 GEMM with the f32 activations split into two bf16 terms
//   (hi = bf16(x), lo = bf16(x - hi)), so the result keeps ~16 mantissa bits of x where a
//   single bf16 cast would keep 8; fp32 accumulation.
// - other FP8 weights (V4.1's 32x32 blocks; wo_a, whose activations are not quantized) at 64
//   rows or more: dequantized to BF16 per call, then cuBLASLt BF16 (linear_dequant_lt).
// - everything else (fewer rows, FP4, F32, shapes cuBLASLt rejects): the SIMT kernel of
//   gemm_simt.cuh, after an activation QDQ when asked.
#include <cstdio>

#include "kernels/cuda/gemv.cuh"

namespace dil::cuda {
namespace {

__global__ void gemm_simt_kernel(const float* x, int64_t ldx, int64_t M, WView w, int64_t w_row0, float* out,
                                 int64_t ldo, int64_t x_gstride, int64_t o_gstride, int64_t w_gstride) {
  int g = blockIdx.z;
  int64_t m0 = int64_t(blockIdx.y) * kBM, n0 = int64_t(blockIdx.x) * kBN;
  int64_t N = w_gstride ? w_gstride : w.n;
  gemm_tile(x + g * x_gstride, ldx, nullptr, m0, M, w, w_row0 + g * w_gstride, n0, N, w.k, out + g * o_gstride, ldo);
}

// x f32 [M, K] -> q e4m3 [Mp, K] (rows >= M zero) and scales f32 [K/128, Mp] (token-fastest,
// the VEC128_32F layout), with the rounding of fp8_qdq: s = pow2_ceil(max(amax,1e-4)/448).
__global__ void act_quant_kernel(const float* x, int64_t M, int64_t Mp, int64_t K, uint8_t* q, float* sc,
                                 bool k_fastest) {
  int64_t gw = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  int lane = threadIdx.x & 31;
  int64_t nb = K / 128;
  if (gw >= Mp * nb) return;
  int64_t m = gw / nb, b = gw % nb;
  uint8_t* qr = q + m * K + b * 128;
  if (m >= M) {
    for (int c = lane; c < 128; c += 32) qr[c] = 0;
    if (lane == 0) sc[k_fastest ? m * nb + b : b * Mp + m] = 1.0f;
    return;
  }
  const float* xr = x + m * K + b * 128;
  float v[4];
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[i] = xr[lane + 32 * i];
    amax = fmaxf(amax, fabsf(v[i]));
  }
  amax = fmaxf(warp_max(amax), 1e-4f);
  float s = d_pow2_ceil(amax * (1.0f / 448.0f));
#pragma unroll
  for (int i = 0; i < 4; ++i) qr[lane + 32 * i] = d_f32_to_e4m3(d_round_e4m3(fminf(fmaxf(v[i] / s, -448.f), 448.f)));
  if (lane == 0) sc[k_fastest ? m * nb + b : b * Mp + m] = s;
}

__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(const float* x, int64_t ldx, int64_t M, WView w,
                                                            int64_t w_row0, float* out, int64_t ldo, int64_t x_gstride,
                                                            int64_t o_gstride, int64_t w_gstride) {
  int g = blockIdx.z;
  int64_t m0 = int64_t(blockIdx.y) * kGemvRows, n0 = int64_t(blockIdx.x) * kGemvThreads;
  int64_t N = w_gstride ? w_gstride : w.n;
  gemv_tile(x + g * x_gstride, ldx, nullptr, m0, M, w, w_row0 + g * w_gstride, n0, N, w.k, out + g * o_gstride, ldo);
}

// E8M0 [nbo, nbk] -> f32 [nbo, nbk_pad] (K blocks fastest) or [nbk, nbo_pad] (transposed):
// the BLK128x128_32F scales of a row-major weight.
__global__ void weight_scale_kernel(const uint8_t* s, int64_t nbo, int64_t nbk, bool transposed, float* out) {
  int64_t nbk_pad = (nbk + 3) / 4 * 4, nbo_pad = (nbo + 3) / 4 * 4;
  int64_t n = transposed ? nbk * nbo_pad : nbo * nbk_pad;
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  int64_t r, c;  // weight block row (N), block column (K)
  if (transposed) {
    c = i / nbo_pad;
    r = i % nbo_pad;
  } else {
    r = i / nbk_pad;
    c = i % nbk_pad;
  }
  out[i] = (r < nbo && c < nbk) ? d_e8m0_to_f32(s[r * nbk + c]) : 1.0f;
}

__global__ void split_bf16_kernel(const float* x, int64_t n, uint16_t* hi, uint16_t* lo) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float v = x[i];
    float h = d_round_bf16(v);
    hi[i] = uint16_t(__float_as_uint(h) >> 16);
    lo[i] = uint16_t(__float_as_uint(d_round_bf16(v - h)) >> 16);
  }
}

__global__ void sum_halves_kernel(const float* d, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = d[i] + d[n + i];
}

__global__ void bf16_to_f32_kernel(const uint16_t* a, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = d_bf16_to_f32(a[i]);
}

// FP8 block-scaled weight rows [n0, n0 + rows) -> BF16 [rows, K]: e4m3 * 2^(e8m0 - 127) is exact
// in BF16 (4 significant bits) for block scales >= 2^-124.
__global__ void dequant_fp8_bf16_kernel(WView w, int64_t n0, int64_t rows, uint16_t* out) {
  const uint8_t* q = static_cast<const uint8_t*>(w.w);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * w.k;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = n0 + i / w.k, k = i % w.k;
    const float v = d_e4m3_to_f32(q[r * w.k + k]) * d_e8m0_to_f32(w.scale[(r / w.bn) * w.scale_cols + k / w.bk]);
    out[i] = uint16_t(__float_as_uint(v) >> 16);
  }
}
// f32 -> BF16 for values known to be exact in BF16 (FP8-QDQ'd activations).
__global__ void f32_to_bf16_exact_kernel(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = uint16_t(__float_as_uint(x[i]) >> 16);
}

void lt_declined(Ctx& c, const std::string& impl, int64_t rows, const Weight& w) {
  if (!c.lt_declined) std::fprintf(stderr, "dil cuda: cuBLASLt declined %s at %lld rows x [%lld x %lld]; the SIMT GEMM ran "
                                    "(reported once per process)\n", impl.c_str(), (long long)rows, (long long)w.out,
                                    (long long)w.in);
  c.lt_declined = true;
}

unsigned stride_grid(int64_t n) { return unsigned(std::min<int64_t>(ceil_div(n, 256), 132 * 16)); }

// RAII holders for cuBLASLt descriptors.
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtDescs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// D[n_out x n_cols] (col-major, ld n_out) = op(A)^T-style TN GEMM: A [k x n_out] col-major
// (a row-major [n_out, k] weight), B [k x n_cols] col-major (row-major activations).
// Returns false when cuBLASLt has no algorithm for this configuration.
// ldb / ldd: leading dimensions of B and D (0: packed, k and n_out); beta 1 accumulates into D.
bool lt_matmul(Ctx& c, cudaDataType_t ab_type, cudaDataType_t d_type, const void* A, const void* B, void* D,
               int64_t n_out, int64_t n_cols, int64_t k, const float* a_scale, const float* b_scale,
               int64_t ldb = 0, int64_t ldd = 0, float beta = 0.f) {
  LtDescs s;
  DIL_CUBLAS(cublasLtMatmulDescCreate(&s.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  DIL_CUBLAS(cublasLtMatmulDescSetAttribute(s.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  DIL_CUBLAS(cublasLtMatmulDescSetAttribute(s.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (a_scale) {
    int8_t fast = 0;
    DIL_CUBLAS(cublasLtMatmulDescSetAttribute(s.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
    cublasLtMatmulMatrixScale_t ma = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    cublasLtMatmulMatrixScale_t mb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    DIL_CUBLAS(cublasLtMatmulDescSetAttribute(s.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof(ma)));
    DIL_CUBLAS(cublasLtMatmulDescSetAttribute(s.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof(mb)));
    DIL_CUBLAS(cublasLtMatmulDescSetAttribute(s.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof(a_scale)));
    DIL_CUBLAS(cublasLtMatmulDescSetAttribute(s.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof(b_scale)));
  }
  DIL_CUBLAS(cublasLtMatrixLayoutCreate(&s.a, ab_type, uint64_t(k), uint64_t(n_out), k));
  DIL_CUBLAS(cublasLtMatrixLayoutCreate(&s.b, ab_type, uint64_t(k), uint64_t(n_cols), ldb ? ldb : k));
  DIL_CUBLAS(cublasLtMatrixLayoutCreate(&s.d, d_type, uint64_t(n_out), uint64_t(n_cols), ldd ? ldd : n_out));
  DIL_CUBLAS(cublasLtMatmulPreferenceCreate(&s.pref));
  size_t ws = c.lt_workspace.bytes();
  DIL_CUBLAS(cublasLtMatmulPreferenceSetAttribute(s.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(c.lt, s.op, s.a, s.b, s.d, s.d, s.pref, 1, &res, &found);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) return false;
  float alpha = 1.f;
  DIL_CUBLAS(cublasLtMatmul(c.lt, s.op, &alpha, A, s.a, B, s.b, &beta, D, s.d, D, s.d, &res.algo,
                            c.lt_workspace.data(), ws, c.stream));
  return true;
}

bool linear_fp8_lt(Ctx& c, const Tensor& x, const Weight& w, Tensor out) {
  int64_t M = x.numel() / w.in, N = w.out, K = w.in;
  int64_t Mp = (M + 15) / 16 * 16;
  int64_t nbk = K / 128, nbo = N / 128;
  int64_t n_ws = (nbk + 3) / 4 * 4 * ((nbo + 3) / 4 * 4);
  Buffer q = c.scratch(size_t(Mp * K));
  Buffer xs = c.scratch(size_t(nbk * Mp) * 4);
  Buffer ws = c.scratch(size_t(n_ws) * 4);
  act_quant_kernel<<<grid_for(Mp * nbk * 32, 256), 256, 0, c.stream>>>(x.ptr<float>(), M, Mp, K,
                                                                       static_cast<uint8_t*>(q.data()),
                                                                       static_cast<float*>(xs.data()),
                                                                       c.lt_b_layout == 1);
  DIL_LAUNCH_CHECK("act_quant_kernel");
  weight_scale_kernel<<<grid_for(n_ws, 256), 256, 0, c.stream>>>(w.scale.ptr<uint8_t>(), nbo, nbk,
                                                                 c.lt_a_layout == 1, static_cast<float*>(ws.data()));
  DIL_LAUNCH_CHECK("weight_scale_kernel");
  Buffer d = c.scratch(size_t(Mp * N) * 4);
  if (lt_matmul(c, CUDA_R_8F_E4M3, CUDA_R_32F, w.w.data, q.data(), d.data(), N, Mp, K,
                static_cast<float*>(ws.data()), static_cast<float*>(xs.data()))) {
    DIL_CUDA(cudaMemcpyAsync(out.data, d.data(), size_t(M * N) * 4, cudaMemcpyDeviceToDevice, c.stream));
    return true;
  }
  // Hopper's block-scaled FP8 kernels may only write bf16: take that, then widen.
  if (lt_matmul(c, CUDA_R_8F_E4M3, CUDA_R_16BF, w.w.data, q.data(), d.data(), N, Mp, K,
                static_cast<float*>(ws.data()), static_cast<float*>(xs.data()))) {
    bf16_to_f32_kernel<<<stride_grid(M * N), 256, 0, c.stream>>>(static_cast<uint16_t*>(d.data()), M * N,
                                                                out.ptr<float>());
    DIL_LAUNCH_CHECK("bf16_to_f32_kernel");
    return true;
  }
  return false;
}

bool linear_bf16_lt(Ctx& c, const Tensor& x, const Weight& w, Tensor out) {
  int64_t M = x.numel() / w.in, N = w.out, K = w.in;
  Buffer xs = c.scratch(size_t(2 * M * K) * 2);
  uint16_t* hi = static_cast<uint16_t*>(xs.data());
  split_bf16_kernel<<<stride_grid(M * K), 256, 0, c.stream>>>(x.ptr<float>(), M * K, hi, hi + M * K);
  DIL_LAUNCH_CHECK("split_bf16_kernel");
  Buffer d = c.scratch(size_t(2 * M * N) * 4);
  if (!lt_matmul(c, CUDA_R_16BF, CUDA_R_32F, w.w.data, hi, d.data(), N, 2 * M, K, nullptr, nullptr)) return false;
  sum_halves_kernel<<<stride_grid(M * N), 256, 0, c.stream>>>(static_cast<float*>(d.data()), M * N,
                                                              out.ptr<float>());
  DIL_LAUNCH_CHECK("sum_halves_kernel");
  return true;
}

// FP8 weights cuBLASLt cannot scale (V4.1's 32x32 blocks; activations not quantized, as wo_a)
// at prefill sizes: the weight (rows [w_row0, w_row0 + N)) dequantized once per call into a
// BF16 scratch (exact), then cuBLASLt BF16 with f32 accumulation. FP8-QDQ'd activations
// (quant) are exact in BF16: one GEMM; others are split into hi + lo BF16 terms, a second
// GEMM accumulating into the same output (beta 1), ~2^-17 per activation as the BF16 path.
// x [M, K] with row stride ldx; out [M, N] with row stride ldo.
bool linear_dequant_lt(Ctx& c, const float* x, int64_t ldx, int64_t M, const Weight& w, int64_t w_row0, int64_t N,
                       bool quant, int act_block, float* out, int64_t ldo) {
  const int64_t K = w.in;
  Buffer wb = c.scratch(size_t(N * K) * 2);
  dequant_fp8_bf16_kernel<<<stride_grid(N * K), 256, 0, c.stream>>>(make_wview(w), w_row0, N,
                                                                    static_cast<uint16_t*>(wb.data()));
  DIL_LAUNCH_CHECK("dequant_fp8_bf16_kernel");
  // Activations packed [M, K] (or [2M, K]: hi rows then lo rows).
  Buffer xb = c.scratch(size_t((quant ? 1 : 2) * M * K) * 2);
  uint16_t* xh = static_cast<uint16_t*>(xb.data());
  Buffer xq;
  if (quant) {
    xq = c.scratch(size_t(M * K) * 4);
    DIL_CUDA(cudaMemcpy2DAsync(xq.data(), size_t(K) * 4, x, size_t(ldx) * 4, size_t(K) * 4, size_t(M),
                               cudaMemcpyDeviceToDevice, c.stream));
    fp8_qdq(c, static_cast<float*>(xq.data()), M, K, int(K), act_block);
    f32_to_bf16_exact_kernel<<<stride_grid(M * K), 256, 0, c.stream>>>(static_cast<float*>(xq.data()), M * K, xh);
    DIL_LAUNCH_CHECK("f32_to_bf16_exact_kernel");
  } else {
    xq = c.scratch(size_t(M * K) * 4);
    DIL_CUDA(cudaMemcpy2DAsync(xq.data(), size_t(K) * 4, x, size_t(ldx) * 4, size_t(K) * 4, size_t(M),
                               cudaMemcpyDeviceToDevice, c.stream));
    split_bf16_kernel<<<stride_grid(M * K), 256, 0, c.stream>>>(static_cast<float*>(xq.data()), M * K, xh, xh + M * K);
    DIL_LAUNCH_CHECK("split_bf16_kernel");
  }
  if (!lt_matmul(c, CUDA_R_16BF, CUDA_R_32F, wb.data(), xh, out, N, M, K, nullptr, nullptr, K, ldo, 0.f)) return false;
  if (!quant && !lt_matmul(c, CUDA_R_16BF, CUDA_R_32F, wb.data(), xh + M * K, out, N, M, K, nullptr, nullptr, K, ldo,
                           1.f))
    return false;
  return true;
}


}  // namespace

void gemm_simt(Ctx& c, const float* x, int64_t ldx, int64_t m, const WView& w, int64_t w_row0, float* out,
               int64_t ldo, int groups, int64_t x_gstride, int64_t o_gstride, int64_t w_gstride) {
  int64_t N = w_gstride ? w_gstride : w.n;
  if (m == 0 || N == 0) return;
  if (m <= 4 * kGemvRows) {  // decode-sized: each weight read once per 4 rows
    dim3 g(unsigned(ceil_div(N, kGemvThreads)), unsigned(ceil_div(m, kGemvRows)), unsigned(groups));
    gemv_kernel<<<g, kGemvThreads, 0, c.stream>>>(x, ldx, m, w, w_row0, out, ldo, x_gstride, o_gstride, w_gstride);
    DIL_LAUNCH_CHECK("gemv_kernel");
    return;
  }
  dim3 grid(unsigned(ceil_div(N, kBN)), unsigned(ceil_div(m, kBM)), unsigned(groups));
  gemm_simt_kernel<<<grid, kGemmThreads, 0, c.stream>>>(x, ldx, m, w, w_row0, out, ldo, x_gstride, o_gstride,
                                                        w_gstride);
  DIL_LAUNCH_CHECK("gemm_simt_kernel");
}

void linear(Ctx& c, const Tensor& x, const Weight& w, int act_block, Tensor out, const std::string& impl) {
  DIL_CHECK(x.dtype == DType::F32 && out.dtype == DType::F32, "linear: f32 activations");
  DIL_CHECK(x.size(-1) == w.in, "linear: x ", x.shape_str(), " vs weight in ", w.in);
  int64_t M = x.numel() / w.in;
  DIL_CHECK(out.numel() == M * w.out, "linear: out ", out.shape_str(), " vs ", M, "x", w.out);
  if (M == 0) return;
  const bool quant = act_block > 0 && (w.kind == Weight::Kind::FP8 || w.kind == Weight::Kind::FP4);
  static_assert(sizeof(WView) < 4096, "WView is passed by value");
  // The plan chose `impl` at load from the weight's format (registry.cpp). cuBLASLt's heuristic
  // may still decline a row count at run time: then the exact SIMT kernel runs and stderr says
  // so once per process (Ctx::lt_declined), so a benchmark cannot hide it.
  bool ran = false;
  if (impl == "cublaslt_fp8") ran = linear_fp8_lt(c, x, w, out);
  else if (impl == "cublaslt_bf16_split") ran = linear_bf16_lt(c, x, w, out);
  else if (impl == "dequant_bf16_lt")
    ran = linear_dequant_lt(c, x.ptr<float>(), w.in, M, w, 0, w.out, quant, act_block, out.ptr<float>(), w.out);
  else DIL_CHECK(impl == "simt", "linear: implementation '", impl, "' has no launcher");
  if (ran) return;
  if (impl != "simt") lt_declined(c, impl, M, w);
  const float* xin = x.ptr<float>();
  Buffer xq;
  if (quant) {  // activation QDQ (same numerics as the FP8 GEMM's on-the-fly quantization)
    xq = c.scratch(size_t(M * w.in) * 4);
    DIL_CUDA(cudaMemcpyAsync(xq.data(), xin, size_t(M * w.in) * 4, cudaMemcpyDeviceToDevice, c.stream));
    fp8_qdq(c, static_cast<float*>(xq.data()), M, w.in, int(w.in), act_block);
    xin = static_cast<float*>(xq.data());
  }
  gemm_simt(c, xin, w.in, M, make_wview(w), 0, out.ptr<float>(), w.out, 1, 0, 0, 0);
}

void grouped_linear(Ctx& c, const Tensor& x, const Weight& w, int groups, Tensor out, const std::string& impl) {
  // x [T, G, K], W [G*N, K], out [T, G, N]
  DIL_CHECK(x.dtype == DType::F32 && out.dtype == DType::F32, "grouped_linear: f32 activations");
  int64_t K = w.in, N = w.out / groups;
  DIL_CHECK(w.out % groups == 0, "grouped_linear: ", w.out, " rows not divisible by ", groups);
  int64_t T = x.numel() / (int64_t(groups) * K);
  DIL_CHECK(x.numel() == T * groups * K && out.numel() == T * groups * N, "grouped_linear: shapes ",
            x.shape_str(), " ", out.shape_str());
  if (T == 0) return;
  if (impl == "dequant_bf16_lt_split") {
    bool ok = true;
    for (int g = 0; g < groups && ok; ++g)
      ok = linear_dequant_lt(c, x.ptr<float>() + g * K, int64_t(groups) * K, T, w, g * N, N, false, 0,
                             out.ptr<float>() + g * N, int64_t(groups) * N);
    if (ok) return;
    lt_declined(c, impl, T, w);
  } else {
    DIL_CHECK(impl == "simt", "grouped_linear: implementation '", impl, "' has no launcher");
  }
  gemm_simt(c, x.ptr<float>(), groups * K, T, make_wview(w), 0, out.ptr<float>(), groups * N, groups, K, N, N);
}

}  // namespace dil::cuda
