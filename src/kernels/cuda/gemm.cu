// Dense projections. The kernel plan chooses one path per op site and row regime (the
// requirements are in registry.cpp). x and out are f32 or bf16 activations (backend.h); each
// path is one template over their storage types (float | bf16_t).
// - cublaslt_fp8: FP8 weights with 128x128 blocks and activation blocks of 128 (V4; official
//   and fast numerics): x quantized to e4m3 with ue8m0 scales per 128 by our kernel (reading
//   f32 or bf16), then cuBLASLt's block-scaled FP8 GEMM (A = weights, BLK128x128_32F scales;
//   B = activations, VEC128_32F scales) writing D in out's dtype (f32 or bf16) itself.
// - cutlass_fp8 (fast numerics, bf16 in and out; V4's FP8 128x128 weights, act_block 128):
//   x quantized by the same kernel (activation scales [K/128, Mp] f32, tokens fastest), then
//   CUTLASS's Hopper blockwise FP8 GEMM (gemm_cutlass.h) with the weight's f32 block scales
//   prepared once at load (prepare_weight), BF16 D written by its epilogue.
// - cublaslt_bf16 (fast numerics): BF16 weight x BF16 activations in one cuBLASLt BF16 GEMM,
//   f32 accumulation, D written by cuBLASLt in out's dtype.
// - cublaslt_bf16_split (reference / official: f32 activations): x split into two bf16 terms
//   (hi = bf16(x), lo = bf16(x - hi)), so the result keeps ~16 mantissa bits of x where a
//   single bf16 cast would keep 8; fp32 accumulation, the halves summed.
// - dequant_bf16_lt (other FP8 weights with FP8-quantized activations: V4.1's 32x32 blocks)
//   at 64 rows or more: the weight dequantized to BF16 per call (exact), x QDQ'd straight into
//   BF16 (exact), one cuBLASLt BF16 GEMM writing out's dtype.
// - grouped_linear (wo_a), per group: the weight's rows dequantized to BF16; official: f32 x
//   split hi + lo (dequant_bf16_lt_split, two GEMMs); fast: the bf16 x read in place by one
//   GEMM per group (dequant_bf16_lt).
// - gemv (fast numerics, at most kGvMaxRows rows: gemv_fast.cu): bf16 x (QDQ'd into a bf16
//   scratch first where the op quantizes) streamed against BF16 / FP8 / FP4 weights read once,
//   f32 accumulation, out's dtype. gemv_stream (gemv_stream.cu): the same sums with the weight
//   streamed through shared memory by bulk copies (the plan's choice for weights of >= 256 MB:
//   the head).
// - simt: everything else (fewer rows, FP4, F32, shapes cuBLASLt rejects): the exact SIMT
//   kernels of gemm_simt.cuh / gemv.cuh, after an activation QDQ when asked.
#include <cstdio>

#include "kernels/cuda/gemm_cutlass.h"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/gemv_fast.cuh"

namespace dil::cuda {
namespace {

template <class TX, class TO>
__global__ void gemm_simt_kernel(const TX* x, int64_t ldx, int64_t M, WView w, int64_t w_row0, TO* out, int64_t ldo,
                                 int64_t x_gstride, int64_t o_gstride, int64_t w_gstride) {
  int g = blockIdx.z;
  int64_t m0 = int64_t(blockIdx.y) * kBM, n0 = int64_t(blockIdx.x) * kBN;
  int64_t N = w_gstride ? w_gstride : w.n;
  gemm_tile(x + g * x_gstride, ldx, nullptr, m0, M, w, w_row0 + g * w_gstride, n0, N, w.k, out + g * o_gstride, ldo);
}

// The e4m3 code of y, |y| <= 448 (clamped by the caller), rounded to nearest even: the code of
// d_round_e4m3 then d_f32_to_e4m3 (core/dtype.cpp f32_to_e4m3), in integer steps instead of
// frexpf / ldexpf / divisions, which made the act-quant kernel compute-bound (checked equal to
// f32_to_e4m3 for every finite f32 in [-448, 448]). Below 2^-6 the grid is 2^-9 (code 8 is
// 2^-6, the first normal); above, the f32 mantissa rounds to 3 bits and the carry moves into
// the exponent.
__device__ __forceinline__ uint8_t e4m3_code_rn(float y) {
  const uint32_t b = __float_as_uint(y);
  const uint8_t sign = uint8_t((b >> 24) & 0x80u);
  uint32_t a = b & 0x7fffffffu;
  const float af = __uint_as_float(a);
  if (af >= 448.0f) return sign | 0x7e;
  if (af < 0.015625f) return sign | uint8_t(__float2int_rn(af * 512.0f));
  a += 0x7ffffu + ((a >> 20) & 1u);
  a &= 0xfff00000u;
  const uint32_t code = ((((a >> 23) - 127u + 7u) << 3) | ((a >> 20) & 7u));
  return sign | uint8_t(code > 0x7eu ? 0x7eu : code);
}

// x [M, K] (f32 | bf16) -> q e4m3 [Mp, K] (rows >= M zero) and scales f32 [K/128, Mp]
// (token-fastest, the VEC128_32F layout; [Mp, K/128] with k_fastest), with the rounding of
// fp8_qdq: s = pow2_ceil(max(amax,1e-4)/448).
template <class TX>
__global__ void act_quant_kernel(const TX* x, int64_t M, int64_t Mp, int64_t K, uint8_t* q, float* sc,
                                 bool k_fastest) {
  int64_t gw = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  int lane = threadIdx.x & 31;
  int64_t nb = K / 128;
  if (gw >= Mp * nb) return;
  int64_t m = gw / nb, b = gw % nb;
  uint8_t* qr = q + m * K + b * 128;
  if (m >= M) {
    reinterpret_cast<uint32_t*>(qr)[lane] = 0;
    if (lane == 0) sc[k_fastest ? m * nb + b : b * Mp + m] = 1.0f;
    return;
  }
  // Lane l holds block elements 4l .. 4l+3: one 8- or 16-byte load where x's base is 16-byte
  // aligned (its rows then are: K is a multiple of 128), else four, and one 4-byte store. The
  // amax is order-free, so codes and scales do not depend on the element-to-lane map.
  const TX* xr = x + m * K + b * 128 + 4 * lane;
  float v[4];
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = ld_act(xr[i]);
  } else if constexpr (std::is_same_v<TX, float>) {
    const float4 f = *reinterpret_cast<const float4*>(xr);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  } else {
    const uint2 u = *reinterpret_cast<const uint2*>(xr);
    v[0] = __uint_as_float(u.x << 16), v[1] = __uint_as_float(u.x & 0xffff0000u);
    v[2] = __uint_as_float(u.y << 16), v[3] = __uint_as_float(u.y & 0xffff0000u);
  }
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) amax = fmaxf(amax, fabsf(v[i]));
  const float s = d_act_scale(warp_max(amax));
  const float inv_s = 1.0f / s;  // a power of two: v * inv_s is v / s exactly
  uint32_t packed = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) packed |= uint32_t(e4m3_code_rn(fminf(fmaxf(v[i] * inv_s, -448.f), 448.f))) << (8 * i);
  *reinterpret_cast<uint32_t*>(qr + 4 * lane) = packed;
  if (lane == 0) sc[k_fastest ? m * nb + b : b * Mp + m] = s;
}

template <class TX, class TO>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(const TX* x, int64_t ldx, int64_t M, WView w,
                                                            int64_t w_row0, TO* out, int64_t ldo, int64_t x_gstride,
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

// E8M0 [n] -> f32 [n], same layout: the weight block scales CUTLASS reads ([N/128, K/128], K
// blocks fastest, as the checkpoint stores them).
__global__ void e8m0_f32_kernel(const uint8_t* s, int64_t n, float* out) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = d_e8m0_to_f32(s[i]);
}

__global__ void split_bf16_kernel(const float* x, int64_t n, uint16_t* hi, uint16_t* lo) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float v = x[i];
    float h = d_round_bf16(v);
    hi[i] = uint16_t(__float_as_uint(h) >> 16);
    lo[i] = uint16_t(__float_as_uint(d_round_bf16(v - h)) >> 16);
  }
}

// out[m, n] (row stride ldo) = d[m, n] + d[M + m, n] (d: [2M, N] f32, the hi and lo halves'
// products), rounded to out's dtype.
template <class TO>
__global__ void sum_halves_kernel(const float* d, int64_t M, int64_t N, TO* out, int64_t ldo) {
  const int64_t n = M * N;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = i / N, c = i % N;
    st_act(out + m * ldo + c, d[i] + d[n + i]);
  }
}

// in [M, N] f32 (row stride ld_in) -> out [M, N] (row stride ld_out), rounded to out's dtype.
template <class TO>
__global__ void convert_rows_kernel(const float* in, int64_t ld_in, TO* out, int64_t ld_out, int64_t M, int64_t N) {
  const int64_t n = M * N;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = i / N, c = i % N;
    st_act(out + m * ld_out + c, in[m * ld_in + c]);
  }
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

// The WView of weight rows [n0, n0 + rows) (FP8: n0 a multiple of the block rows).
WView group_rows(const Weight& w, int64_t n0, int64_t rows) {
  WView v = make_wview(w);
  const int64_t row_bytes = w.kind == Weight::Kind::FP4 ? w.in / 2 : w.in * int64_t(dtype_size(w.w.dtype));
  v.w = static_cast<const uint8_t*>(v.w) + n0 * row_bytes;
  if (w.kind == Weight::Kind::FP8) {
    DIL_CHECK(n0 % w.block_out == 0, "group_rows: row ", n0, " inside a ", w.block_out, "-row scale block");
    v.scale += (n0 / w.block_out) * v.scale_cols;
  } else if (w.kind == Weight::Kind::FP4) {
    v.scale += n0 * v.scale_cols;
  }
  v.n = rows;
  return v;
}

void lt_declined(Ctx& c, const std::string& impl, int64_t rows, const Weight& w) {
  if (!c.lt_declined) std::fprintf(stderr, "dil cuda: cuBLASLt declined %s at %lld rows x [%lld x %lld]; the SIMT GEMM ran "
                                    "(reported once per process)\n", impl.c_str(), (long long)rows, (long long)w.out,
                                    (long long)w.in);
  c.lt_declined = true;
}

template <class T>
constexpr bool is_bf16 = std::is_same_v<T, bf16_t>;
// cuBLASLt's type of an activation storage type.
template <class T>
cudaDataType_t lt_type() {
  return is_bf16<T> ? CUDA_R_16BF : CUDA_R_32F;
}

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

// cublaslt_fp8. x [M, K] -> out [M, N], both packed.
template <class TX, class TO>
bool linear_fp8_lt(Ctx& c, const TX* x, int64_t M, const Weight& w, TO* out) {
  const int64_t N = w.out, K = w.in;
  const int64_t Mp = (M + 15) / 16 * 16;  // cuBLASLt's block-scaled FP8 takes tokens in multiples of 16
  const int64_t nbk = K / 128, nbo = N / 128;
  const int64_t n_ws = (nbk + 3) / 4 * 4 * ((nbo + 3) / 4 * 4);
  Buffer q = c.scratch(size_t(Mp * K));           // [Mp, K] e4m3
  Buffer xs = c.scratch(size_t(nbk * Mp) * 4);    // activation scales, f32
  Buffer ws = c.scratch(size_t(n_ws) * 4);        // weight scales, f32
  act_quant_kernel<TX><<<grid_for(Mp * nbk * 32, 256), 256, 0, c.stream>>>(x, M, Mp, K, static_cast<uint8_t*>(q.data()),
                                                                           static_cast<float*>(xs.data()),
                                                                           c.lt_b_layout == 1);
  DIL_LAUNCH_CHECK("act_quant_kernel");
  weight_scale_kernel<<<grid_for(n_ws, 256), 256, 0, c.stream>>>(w.scale.ptr<uint8_t>(), nbo, nbk,
                                                                 c.lt_a_layout == 1, static_cast<float*>(ws.data()));
  DIL_LAUNCH_CHECK("weight_scale_kernel");
  auto gemm = [&](cudaDataType_t dt, void* D) {
    return lt_matmul(c, CUDA_R_8F_E4M3, dt, w.w.data, q.data(), D, N, Mp, K, static_cast<float*>(ws.data()),
                     static_cast<float*>(xs.data()));
  };
  // D in out's dtype, written by cuBLASLt: into out itself when there are no padding tokens,
  // else into scratch and the first M rows copied.
  if (Mp == M) {
    if (gemm(lt_type<TO>(), out)) return true;
  } else {
    Buffer d = c.scratch(size_t(Mp * N) * sizeof(TO));  // [Mp, N]
    if (gemm(lt_type<TO>(), d.data())) {
      DIL_CUDA(cudaMemcpyAsync(out, d.data(), size_t(M * N) * sizeof(TO), cudaMemcpyDeviceToDevice, c.stream));
      return true;
    }
  }
  // cuBLASLt declined out's dtype; Hopper's block-scaled FP8 kernels may write only one of
  // them: take the other and convert (bf16 widened exactly for an f32 out, f32 rounded once
  // for a bf16 out).
  using Other = std::conditional_t<is_bf16<TO>, float, bf16_t>;
  Buffer d = c.scratch(size_t(Mp * N) * sizeof(Other));  // [Mp, N]
  if (!gemm(lt_type<Other>(), d.data())) return false;
  convert(c, static_cast<const Other*>(d.data()), out, M * N);
  return true;
}

// cutlass_fp8. x [M, K] bf16 -> out [M, N] bf16, both packed. CUTLASS's TMA loads of the
// activation scales need their row stride (the token count) a multiple of 4: M is padded to
// Mp with zero rows (scale 1) and D goes through a scratch when Mp != M.
bool linear_fp8_cutlass(Ctx& c, const bf16_t* x, int64_t M, const Weight& w, bf16_t* out) {
  const int64_t N = w.out, K = w.in, nbk = K / 128, nbo = N / 128;
  const int64_t Mp = (M + 3) / 4 * 4;
  Buffer q = c.scratch(size_t(Mp * K));         // [Mp, K] e4m3
  Buffer xs = c.scratch(size_t(nbk * Mp) * 4);  // [K/128, Mp] f32 activation scales
  act_quant_kernel<bf16_t><<<grid_for(Mp * nbk * 32, 256), 256, 0, c.stream>>>(
      x, M, Mp, K, static_cast<uint8_t*>(q.data()), static_cast<float*>(xs.data()), false);
  DIL_LAUNCH_CHECK("act_quant_kernel");
  Buffer ws_once;  // a weight that did not come through adopt_weight: its scales converted now
  const float* sfb = nullptr;
  auto it = c.fp8_scales_f32.find(w.scale.data);
  if (it != c.fp8_scales_f32.end()) {
    sfb = static_cast<const float*>(it->second.data());
  } else {
    ws_once = c.scratch(size_t(nbo * nbk) * 4);  // [N/128, K/128] f32
    e8m0_f32_kernel<<<grid_for(nbo * nbk, 256), 256, 0, c.stream>>>(w.scale.ptr<uint8_t>(), nbo * nbk,
                                                                    static_cast<float*>(ws_once.data()));
    DIL_LAUNCH_CHECK("e8m0_f32_kernel");
    sfb = static_cast<const float*>(ws_once.data());
  }
  Buffer d;
  if (Mp != M) d = c.scratch(size_t(Mp * N) * 2);  // [Mp, N] bf16
  CutlassFp8Gemm g;
  g.a = q.data();
  g.sfa = static_cast<const float*>(xs.data());
  g.b = w.w.data;
  g.sfb = sfb;
  g.d = Mp == M ? static_cast<void*>(out) : d.data();
  g.m = int(Mp);
  g.n = int(N);
  g.k = int(K);
  const CutlassTile tile = cutlass_tile_for(M, N);
  const size_t wsb = std::max<size_t>(cutlass_fp8_workspace(tile, g), 16);
  Buffer ws = c.scratch(wsb);
  if (!cutlass_fp8_run(tile, g, ws.data(), wsb, c.stream)) return false;
  DIL_LAUNCH_CHECK("cutlass_fp8");
  if (Mp != M) DIL_CUDA(cudaMemcpyAsync(out, d.data(), size_t(M * N) * 2, cudaMemcpyDeviceToDevice, c.stream));
  return true;
}

// cublaslt_bf16: x [M, K] bf16, a BF16 weight; out [M, N] written by cuBLASLt in its dtype.
template <class TO>
bool linear_bf16_lt(Ctx& c, const bf16_t* x, int64_t M, const Weight& w, TO* out) {
  return lt_matmul(c, CUDA_R_16BF, lt_type<TO>(), w.w.data, x, out, w.out, M, w.in, nullptr, nullptr);
}

// cublaslt_bf16_split: x [M, K] f32 split into hi + lo BF16 rows, one GEMM over both.
template <class TO>
bool linear_bf16_split_lt(Ctx& c, const float* x, int64_t M, const Weight& w, TO* out) {
  const int64_t N = w.out, K = w.in;
  Buffer xs = c.scratch(size_t(2 * M * K) * 2);  // [2M, K] bf16: hi rows, then lo rows
  uint16_t* hi = static_cast<uint16_t*>(xs.data());
  split_bf16_kernel<<<stride_grid(M * K), 256, 0, c.stream>>>(x, M * K, hi, hi + M * K);
  DIL_LAUNCH_CHECK("split_bf16_kernel");
  Buffer d = c.scratch(size_t(2 * M * N) * 4);  // [2M, N] f32
  if (!lt_matmul(c, CUDA_R_16BF, CUDA_R_32F, w.w.data, hi, d.data(), N, 2 * M, K, nullptr, nullptr)) return false;
  sum_halves_kernel<TO><<<stride_grid(M * N), 256, 0, c.stream>>>(static_cast<float*>(d.data()), M, N, out, N);
  DIL_LAUNCH_CHECK("sum_halves_kernel");
  return true;
}

// How linear_dequant_lt feeds the activations to the BF16 GEMM.
enum class Feed {
  Quant,   // FP8-QDQ'd (per act_block) straight into BF16: exact, one GEMM
  Split,   // f32 split into hi + lo BF16 terms: two GEMMs accumulating (~2^-17 per activation)
  Direct,  // bf16 activations read in place: one GEMM
};

// FP8 weights cuBLASLt cannot scale (V4.1's 32x32 blocks; wo_a, whose activations are not
// quantized) at prefill sizes: the weight rows [w_row0, w_row0 + N) dequantized once per call
// into a BF16 scratch (exact), then cuBLASLt BF16 with f32 accumulation writing out's dtype.
// x [M, K] with row stride ldx; out [M, N] with row stride ldo.
template <class TX, class TO>
bool linear_dequant_lt(Ctx& c, const TX* x, int64_t ldx, int64_t M, const Weight& w, int64_t w_row0, int64_t N,
                       Feed feed, int act_block, TO* out, int64_t ldo) {
  const int64_t K = w.in;
  // The weight rows in BF16: the copy made at load where the plan asked for one, else
  // dequantized into scratch for this call.
  Buffer wb;
  const void* wbf = nullptr;  // [N, K] bf16
  if (auto it = c.bf16_copies.find(w.w.data); it != c.bf16_copies.end()) {
    wbf = static_cast<const uint16_t*>(it->second.data()) + w_row0 * K;
  } else {
    wb = c.scratch(size_t(N * K) * 2);
    dequant_fp8_bf16_kernel<<<stride_grid(N * K), 256, 0, c.stream>>>(make_wview(w), w_row0, N,
                                                                      static_cast<uint16_t*>(wb.data()));
    DIL_LAUNCH_CHECK("dequant_fp8_bf16_kernel");
    wbf = wb.data();
  }
  const cudaDataType_t dt = lt_type<TO>();
  if (feed == Feed::Quant) {
    Buffer xb = c.scratch(size_t(M * K) * 2);  // [M, K] bf16, QDQ'd (exact)
    bf16_t* xq = static_cast<bf16_t*>(xb.data());
    fp8_qdq(c, x, ldx, xq, K, M, int(K), act_block);
    return lt_matmul(c, CUDA_R_16BF, dt, wbf, xq, out, N, M, K, nullptr, nullptr, K, ldo, 0.f);
  }
  if (feed == Feed::Direct) {
    DIL_CHECK(is_bf16<TX>, "linear_dequant_lt: only bf16 activations are read in place");
    return lt_matmul(c, CUDA_R_16BF, dt, wbf, x, out, N, M, K, nullptr, nullptr, ldx, ldo, 0.f);
  }
  if constexpr (std::is_same_v<TX, float>) {
    // Split: hi rows then lo rows [2M, K] bf16; the second GEMM accumulates into the first's D.
    Buffer xp = c.scratch(size_t(M * K) * 4);  // [M, K] f32, packed
    DIL_CUDA(cudaMemcpy2DAsync(xp.data(), size_t(K) * 4, x, size_t(ldx) * 4, size_t(K) * 4, size_t(M),
                               cudaMemcpyDeviceToDevice, c.stream));
    Buffer xb = c.scratch(size_t(2 * M * K) * 2);
    uint16_t* xh = static_cast<uint16_t*>(xb.data());
    split_bf16_kernel<<<stride_grid(M * K), 256, 0, c.stream>>>(static_cast<float*>(xp.data()), M * K, xh, xh + M * K);
    DIL_LAUNCH_CHECK("split_bf16_kernel");
    float* d = reinterpret_cast<float*>(out);
    int64_t ldd = ldo;
    Buffer db;
    if (is_bf16<TO>) {  // the two halves meet in f32, rounded once
      db = c.scratch(size_t(M * N) * 4);
      d = static_cast<float*>(db.data());
      ldd = N;
    }
    if (!lt_matmul(c, CUDA_R_16BF, CUDA_R_32F, wbf, xh, d, N, M, K, nullptr, nullptr, K, ldd, 0.f)) return false;
    if (!lt_matmul(c, CUDA_R_16BF, CUDA_R_32F, wbf, xh + M * K, d, N, M, K, nullptr, nullptr, K, ldd, 1.f))
      return false;
    if (is_bf16<TO>) {
      convert_rows_kernel<TO><<<stride_grid(M * N), 256, 0, c.stream>>>(d, ldd, out, ldo, M, N);
      DIL_LAUNCH_CHECK("convert_rows_kernel");
    }
    return true;
  } else {
    DIL_FAIL("linear_dequant_lt: the hi + lo split takes f32 activations");
  }
}

template <class TX, class TO>
void linear_typed(Ctx& c, const TX* x, int64_t M, const Weight& w, int act_block, TO* out, const std::string& impl) {
  const bool quant = act_block > 0 && (w.kind == Weight::Kind::FP8 || w.kind == Weight::Kind::FP4);
  // The plan chose `impl` at load from the weight's format (registry.cpp). cuBLASLt's heuristic
  // may still decline a row count at run time: then the exact SIMT kernel runs and stderr says
  // so once per process (Ctx::lt_declined), so a benchmark cannot hide it.
  bool ran = false;
  if (impl == "cublaslt_fp8") {
    ran = linear_fp8_lt(c, x, M, w, out);
  } else if (impl == "cutlass_fp8") {
    DIL_CHECK(is_bf16<TX> && is_bf16<TO>, "linear cutlass_fp8: bf16 activations and output");
    if constexpr (is_bf16<TX> && is_bf16<TO>) {
      // CUTLASS declining a problem (alignment; the plan's requirements exclude it) leaves the
      // cuBLASLt FP8 GEMM of the same numerics.
      ran = linear_fp8_cutlass(c, x, M, w, out) || linear_fp8_lt(c, x, M, w, out);
    }
  } else if (impl == "cublaslt_bf16") {
    DIL_CHECK(is_bf16<TX> && w.kind == Weight::Kind::BF16, "linear cublaslt_bf16: a BF16 weight and bf16 activations");
    if constexpr (is_bf16<TX>) ran = linear_bf16_lt(c, x, M, w, out);
  } else if (impl == "cublaslt_bf16_split") {
    DIL_CHECK((std::is_same_v<TX, float>), "linear cublaslt_bf16_split: f32 activations");
    if constexpr (std::is_same_v<TX, float>) ran = linear_bf16_split_lt(c, x, M, w, out);
  } else if (impl == "gemv" || impl == "gemv_stream") {
    DIL_CHECK(is_bf16<TX>, "linear ", impl, ": bf16 activations");
    if constexpr (is_bf16<TX>) {
      // The act_quant QDQ is applied by the GEMV as it stages x (no separate pass) where it can
      // (gv_stages_qdq); else here first (QDQ'd values are exact in bf16).
      const bf16_t* xg = x;
      Buffer xq;
      const bool fused = quant && gv_stages_qdq(int(w.kind), w.in, act_block);
      if (quant && !fused) {
        xq = c.scratch(size_t(M * w.in) * 2);  // [M, K] bf16
        fp8_qdq(c, x, w.in, static_cast<bf16_t*>(xq.data()), w.in, M, int(w.in), act_block);
        xg = static_cast<const bf16_t*>(xq.data());
      }
      auto* gemv = impl == "gemv" ? &gemv_fast<TO> : &gemv_stream<TO>;
      gemv(c, xg, w.in, M, make_wview(w), out, w.out, GvGroups{}, fused ? act_block : 0);
      return;
    }
  } else if (impl == "dequant_bf16_lt") {
    const Feed feed = quant ? Feed::Quant : is_bf16<TX> ? Feed::Direct : Feed::Split;
    ran = linear_dequant_lt(c, x, w.in, M, w, 0, w.out, feed, act_block, out, w.out);
  } else {
    DIL_CHECK(impl == "simt", "linear: implementation '", impl, "' has no launcher");
  }
  if (ran) return;
  if (impl != "simt") lt_declined(c, impl, M, w);
  if (quant) {  // activation QDQ into f32 (same numerics as the FP8 GEMM's on-the-fly quantization)
    Buffer xq = c.scratch(size_t(M * w.in) * 4);  // [M, K] f32
    float* xf = static_cast<float*>(xq.data());
    fp8_qdq(c, x, w.in, xf, w.in, M, int(w.in), act_block);
    gemm_simt(c, static_cast<const float*>(xf), w.in, M, make_wview(w), 0, out, w.out, 1, 0, 0, 0);
    return;
  }
  gemm_simt(c, x, w.in, M, make_wview(w), 0, out, w.out, 1, 0, 0, 0);
}

}  // namespace

template <class TX, class TO>
void gemm_simt(Ctx& c, const TX* x, int64_t ldx, int64_t m, const WView& w, int64_t w_row0, TO* out, int64_t ldo,
               int groups, int64_t x_gstride, int64_t o_gstride, int64_t w_gstride) {
  int64_t N = w_gstride ? w_gstride : w.n;
  if (m == 0 || N == 0) return;
  if (m <= 4 * kGemvRows) {  // decode-sized: each weight read once per 4 rows
    dim3 g(unsigned(ceil_div(N, kGemvThreads)), unsigned(ceil_div(m, kGemvRows)), unsigned(groups));
    gemv_kernel<TX, TO><<<g, kGemvThreads, 0, c.stream>>>(x, ldx, m, w, w_row0, out, ldo, x_gstride, o_gstride,
                                                          w_gstride);
    DIL_LAUNCH_CHECK("gemv_kernel");
    return;
  }
  dim3 grid(unsigned(ceil_div(N, kBN)), unsigned(ceil_div(m, kBM)), unsigned(groups));
  gemm_simt_kernel<TX, TO><<<grid, kGemmThreads, 0, c.stream>>>(x, ldx, m, w, w_row0, out, ldo, x_gstride, o_gstride,
                                                                w_gstride);
  DIL_LAUNCH_CHECK("gemm_simt_kernel");
}
template void gemm_simt<float, float>(Ctx&, const float*, int64_t, int64_t, const WView&, int64_t, float*, int64_t,
                                      int, int64_t, int64_t, int64_t);
template void gemm_simt<bf16_t, float>(Ctx&, const bf16_t*, int64_t, int64_t, const WView&, int64_t, float*, int64_t,
                                       int, int64_t, int64_t, int64_t);
template void gemm_simt<float, bf16_t>(Ctx&, const float*, int64_t, int64_t, const WView&, int64_t, bf16_t*, int64_t,
                                       int, int64_t, int64_t, int64_t);
template void gemm_simt<bf16_t, bf16_t>(Ctx&, const bf16_t*, int64_t, int64_t, const WView&, int64_t, bf16_t*,
                                        int64_t, int, int64_t, int64_t, int64_t);

void prepare_weight(Ctx& c, const Weight& w) {
  // cutlass_fp8's weight scales: FP8 128x128 blocks, N and K multiples of 128 (registry.cpp).
  if (w.kind != Weight::Kind::FP8 || w.block_out != 128 || w.block_in != 128 || w.out % 128 || w.in % 128) return;
  if (c.fp8_scales_f32.count(w.scale.data)) return;
  const int64_t n = (w.out / 128) * (w.in / 128);
  Buffer b = c.arena->get(size_t(n) * 4);  // [N/128, K/128] f32
  e8m0_f32_kernel<<<grid_for(n, 256), 256, 0, c.stream>>>(w.scale.ptr<uint8_t>(), n, static_cast<float*>(b.data()));
  DIL_LAUNCH_CHECK("e8m0_f32_kernel");
  c.fp8_scales_f32.emplace(w.scale.data, std::move(b));
}

void prepare_bf16_copy(Ctx& c, const Weight& w) {
  DIL_CHECK(w.kind == Weight::Kind::FP8, "prepare_bf16_copy: an FP8 weight");
  if (c.bf16_copies.count(w.w.data)) return;
  const int64_t n = w.out * w.in;
  Buffer b = c.arena->get(size_t(n) * 2);  // [out, in] bf16
  dequant_fp8_bf16_kernel<<<stride_grid(n), 256, 0, c.stream>>>(make_wview(w), 0, w.out,
                                                                static_cast<uint16_t*>(b.data()));
  DIL_LAUNCH_CHECK("dequant_fp8_bf16_kernel");
  c.bf16_copies.emplace(w.w.data, std::move(b));
}

void linear(Ctx& c, const Tensor& x, const Weight& w, int act_block, Tensor out, const std::string& impl) {
  DIL_CHECK(x.size(-1) == w.in, "linear: x ", x.shape_str(), " vs weight in ", w.in);
  int64_t M = x.numel() / w.in;
  DIL_CHECK(out.numel() == M * w.out, "linear: out ", out.shape_str(), " vs ", M, "x", w.out);
  if (M == 0) return;
  static_assert(sizeof(WView) < 4096, "WView is passed by value");
  with_act(x, "linear x", [&](auto tx) {
    using TX = decltype(tx);
    with_act(out, "linear out", [&](auto to) {
      using TO = decltype(to);
      linear_typed(c, x.ptr<const TX>(), M, w, act_block, out.ptr<TO>(), impl);
    });
  });
}

void grouped_linear(Ctx& c, const Tensor& x, const Weight& w, int groups, Tensor out, const std::string& impl) {
  // x [T, G, K], W [G*N, K], out [T, G, N]
  int64_t K = w.in, N = w.out / groups;
  DIL_CHECK(w.out % groups == 0, "grouped_linear: ", w.out, " rows not divisible by ", groups);
  int64_t T = x.numel() / (int64_t(groups) * K);
  DIL_CHECK(x.numel() == T * groups * K && out.numel() == T * groups * N, "grouped_linear: shapes ",
            x.shape_str(), " ", out.shape_str());
  if (T == 0) return;
  with_act(x, "grouped_linear x", [&](auto tx) {
    using TX = decltype(tx);
    with_act(out, "grouped_linear out", [&](auto to) {
      using TO = decltype(to);
      const TX* xp = x.ptr<const TX>();
      TO* op = out.ptr<TO>();
      const int64_t ldx = int64_t(groups) * K, ldo = int64_t(groups) * N;
      bool lt = false;
      Feed feed = Feed::Split;
      if (impl == "dequant_bf16_lt_split") {  // official: f32 inputs, hi + lo
        DIL_CHECK((std::is_same_v<TX, float>), "grouped_linear dequant_bf16_lt_split: f32 activations");
        lt = true;
      } else if (impl == "dequant_bf16_lt") {  // fast: the bf16 inputs read in place, one GEMM per group
        DIL_CHECK(is_bf16<TX>, "grouped_linear dequant_bf16_lt: bf16 activations");
        lt = true;
        feed = Feed::Direct;
      } else if (impl == "gemv") {  // fast, few rows: every group's GEMV in one launch
        DIL_CHECK(is_bf16<TX>, "grouped_linear gemv: bf16 activations");
        if constexpr (is_bf16<TX>) {
          gemv_fast(c, xp, ldx, T, group_rows(w, 0, N), op, ldo, GvGroups{groups, K, N});
          return;
        }
      } else {
        DIL_CHECK(impl == "simt", "grouped_linear: implementation '", impl, "' has no launcher");
      }
      if (lt) {
        bool ok = true;
        for (int g = 0; g < groups && ok; ++g)
          ok = linear_dequant_lt(c, xp + g * K, ldx, T, w, g * N, N, feed, 0, op + g * N, ldo);
        if (ok) return;
        lt_declined(c, impl, T, w);
      }
      gemm_simt(c, xp, ldx, T, make_wview(w), 0, op, ldo, groups, K, N, N);
    });
  });
}

}  // namespace dil::cuda
