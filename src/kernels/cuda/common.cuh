// Shared device helpers of the CUDA backend: error checks that name the failing call, the
// checkpoint codecs (e4m3, e2m1, e8m0, bf16) written to give bit-identical results to the
// host codecs in core/dtype.cpp, and small launch helpers.
#pragma once
#include <cublasLt.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/check.h"
#include "core/tensor.h"

namespace dil::cuda {

[[noreturn]] void cuda_fail(const char* call, const char* what, const char* file, int line);

}  // namespace dil::cuda

// Every CUDA runtime call goes through DIL_CUDA(call): a failure aborts naming the call.
#define DIL_CUDA(call)                                                                   \
  do {                                                                                   \
    cudaError_t dil_err_ = (call);                                                       \
    if (dil_err_ != cudaSuccess)                                                         \
      ::dil::cuda::cuda_fail(#call, cudaGetErrorString(dil_err_), __FILE__, __LINE__);   \
  } while (0)
#define DIL_CUBLAS(call)                                                                 \
  do {                                                                                   \
    cublasStatus_t dil_st_ = (call);                                                     \
    if (dil_st_ != CUBLAS_STATUS_SUCCESS)                                                \
      ::dil::cuda::cuda_fail(#call, cublasLtGetStatusString(dil_st_), __FILE__, __LINE__); \
  } while (0)
// After every kernel launch: launch-configuration errors surface here, naming the kernel.
#define DIL_LAUNCH_CHECK(name) DIL_CUDA(cudaGetLastError())

namespace dil::cuda {

// ---- programmatic dependent launch (launch_pdl in ops.cuh) ----
// A kernel launched with launch_pdl may start while the stream's previous kernel still runs:
// before it reads anything an earlier kernel of the stream wrote (or writes anything one may
// still read), every thread calls pdl_wait(), which returns once the previous kernel has
// completed and its writes are visible (at once when there is none in flight). What comes
// before the wait may only touch data no kernel of the stream writes (weights: an L2 prefetch).
// pdl_trigger() lets the stream's next kernel launch once every CTA of this one has called it
// (or exited): its CTAs then take free SM slots and wait in their own pdl_wait().
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// Both, for a kernel with nothing to do before its inputs are ready.
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  pdl_trigger();
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline unsigned grid_for(int64_t n, int threads) { return unsigned(ceil_div(n, threads)); }
// CTAs of 256 threads for a grid-stride loop over n elements: at most 16 per SM of an H200's
// 132, where more CTAs would only add scheduling.
inline unsigned stride_grid(int64_t n) { return unsigned(ceil_div(n, 256) < 132 * 16 ? ceil_div(n, 256) : 132 * 16); }

// ---- device codecs (mirror core/dtype.cpp) ----
__device__ __forceinline__ float d_bf16_to_f32(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }
__device__ __forceinline__ float d_round_bf16(float f) {
  uint32_t b = __float_as_uint(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return __uint_as_float(((b >> 16) | 0x40) << 16);
  b += 0x7fffu + ((b >> 16) & 1u);
  return __uint_as_float(b & 0xffff0000u);
}
__device__ __forceinline__ float d_e8m0_to_f32(uint8_t b) { return ldexpf(1.0f, int(b) - 127); }
// The same value by bit placement, for hot loops: 2^(b - 127) is the bit pattern b << 23; b = 0
// gives the subnormal 2^-127 (0x00400000), the larger of the two patterns.
__device__ __forceinline__ float d_e8m0_fast(uint32_t b) { return __uint_as_float(max(b << 23, 0x00400000u)); }
__device__ __forceinline__ float d_e4m3_to_f32(uint8_t v) {
  int sign = v >> 7, exp = (v >> 3) & 0xf, man = v & 7;
  if (exp == 0xf && man == 7) return __int_as_float(0x7fc00000);
  float mag = exp == 0 ? ldexpf(float(man), -9) : ldexpf(1.0f + man / 8.0f, exp - 7);
  return sign ? -mag : mag;
}
// Round to nearest even with saturation to +-448 (the value f32_to_e4m3 rounds to), by the
// hardware conversion: cvt.rn.satfinite.e4m3x2.f32 rounds to nearest even on e4m3's grid
// (subnormals at 2^-9), saturates overflow and infinities to +-448 and keeps the sign of a zero
// result, which are f32_to_e4m3's steps; e4m3 -> f16 is exact. (The frexpf / ldexpf / division
// steps written out cost ~100 instructions a value: the decode GEMVs spent several us per call
// quantizing their input row that way in every CTA.) NaN stays the input NaN.
__device__ __forceinline__ uint8_t d_e4m3_code(float f) {
  uint16_t q;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(q) : "f"(0.0f), "f"(f));  // f into the low byte
  return uint8_t(q & 0xffu);
}
__device__ __forceinline__ float d_e4m3_value(uint8_t code) {
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(uint16_t(code)));
  return __half2float(__ushort_as_half(uint16_t(h & 0xffffu)));
}
__device__ __forceinline__ float d_round_e4m3(float f) {
  if (isnan(f)) return f;
  return d_e4m3_value(d_e4m3_code(f));
}
// The code of a representable f (an output of d_round_e4m3).
__device__ __forceinline__ uint8_t d_f32_to_e4m3(float f) { return d_e4m3_code(f); }
__device__ __forceinline__ float d_e2m1_to_f32(uint8_t nib) {
  const float m = (nib & 7) < 4 ? 0.5f * float(nib & 7)
                                : ((nib & 7) == 4 ? 2.f : (nib & 7) == 5 ? 3.f : (nib & 7) == 6 ? 4.f : 6.f);
  return (nib & 8) ? -m : m;
}
// Eight e2m1 nibbles (value i in nibble i, low first) as e4m3 bytes of the values x 2^-6 (exact
// for every code): lo holds values 0, 2, 4, 6 (byte order), hi values 1, 3, 5, 7. Nibble s|e1 e0 m
// becomes the byte s|0 0 e1 e0 m 0 0: exponent field e, mantissa m/2, for the normal and the
// subnormal (e = 0: 0 or 0.5) codes alike.
__device__ __forceinline__ void d_e2m1x8_e4m3(uint32_t w, uint32_t& lo, uint32_t& hi) {
  lo = ((w & 0x08080808u) << 4) | ((w & 0x07070707u) << 2);
  hi = (w & 0x80808080u) | ((w >> 2) & 0x1c1c1c1cu);
}
// Nearest e2m1 value, ties to the even code (same steps as f32_to_e2m1).
__device__ __forceinline__ float d_round_e2m1(float v) {
  float a = fabsf(v);
  float r;
  if (a < 2.0f) r = rintf(a * 2.0f) / 2.0f;
  else if (a < 4.0f) r = rintf(a);
  else r = rintf(a / 2.0f) * 2.0f;
  if (r > 6.0f) r = 6.0f;
  return signbit(v) ? -r : r;
}
// 2^exp with exp = v's unbiased exponent field, + 1 when the significand bits are not zero, as
// ldexpf(1, exp) gives it (exp in [-127, 129]: 2^-127 is the subnormal 0x00400000, exp >= 128
// overflows to inf), built from the bits (ldexpf is a library routine: every GEMV CTA takes this
// per activation block).
__device__ __forceinline__ float d_pow2_ceil(float v) {
  const uint32_t b = __float_as_uint(v);
  const int exp = int((b >> 23) & 0xffu) - 127 + ((b & 0x7fffffu) != 0u);
  if (exp >= 128) return __uint_as_float(0x7f800000u);
  if (exp == -127) return __uint_as_float(0x00400000u);
  return __uint_as_float(uint32_t(exp + 127) << 23);
}
// The official ue8m0 FP8 activation quantization (act_quant) of one block: its scale from the
// block's amax, s = pow2_ceil(max(amax, 1e-4) / 448), and a value's e4m3 rounding under it
// (the QDQ'd value is that times s, exact in bf16).
__device__ __forceinline__ float d_act_scale(float amax) { return d_pow2_ceil(fmaxf(amax, 1e-4f) * (1.0f / 448.0f)); }
__device__ __forceinline__ float d_act_round(float v, float s) { return d_round_e4m3(fminf(fmaxf(v / s, -448.f), 448.f)); }

// ---- activation storage types (backend.h: activations are f32 or bf16) ----
// A bf16 activation is stored as its bits. Kernels are templates on the storage type of each
// activation tensor (float | bf16_t): ld_act widens exactly, st_act rounds once (RNE, NaN
// kept, as core/dtype.h f32_to_bf16), so an op computes on the widened f32 values exactly as
// its f32 instantiation does and rounds each output once to its tensor's dtype.
struct bf16_t {
  uint16_t bits;
};
static_assert(sizeof(bf16_t) == 2, "bf16_t is the 16-bit storage of a bf16 value");
__device__ __forceinline__ float ld_act(float v) { return v; }
__device__ __forceinline__ float ld_act(bf16_t v) { return d_bf16_to_f32(v.bits); }
__device__ __forceinline__ void st_act(float* p, float v) { *p = v; }
__device__ __forceinline__ void st_act(bf16_t* p, float v) {
  p->bits = uint16_t(__float_as_uint(d_round_bf16(v)) >> 16);
}

// Host side: calls f(T{}) with T the storage type of an activation tensor (float for F32,
// bf16_t for BF16); any other dtype fails naming `what`. Nest calls for several tensors:
//   with_act(x, "op x", [&](auto tx) { using TX = decltype(tx); kernel<TX><<<...>>>(x.ptr<TX>()); });
template <class F>
void with_act(const Tensor& t, const char* what, F&& f) {
  if (t.dtype == DType::F32) f(float{});
  else if (t.dtype == DType::BF16) f(bf16_t{});
  else DIL_FAIL(what, ": expected an f32 or bf16 tensor, got ", dtype_name(t.dtype), " ", t.shape_str());
}
// The same for a tensor that must be f32 (parameters, states, f32-only activations).
inline void check_f32(const Tensor& t, const char* what) {
  DIL_CHECK(t.dtype == DType::F32, what, ": expected an f32 tensor, got ", dtype_name(t.dtype), " ", t.shape_str());
}

// Block-wide reductions (blockDim.x a multiple of 32, <= 1024). `red` holds 32 floats.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float block_sum(float v, float* red) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  float r = lane < nw ? red[lane] : 0.f;
  return warp_sum(r);
}
__device__ __forceinline__ double warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double block_sum_d(double v, double* red) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum_d(v);
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  double r = lane < nw ? red[lane] : 0.0;
  return warp_sum_d(r);
}
// The reference's activations: evaluated in double, rounded once to f32 (cpu_common.h).
__device__ __forceinline__ float d_sigmoid(float x) { return float(1.0 / (1.0 + exp(-double(x)))); }
__device__ __forceinline__ float d_silu(float x) { return float(double(x) / (1.0 + exp(-double(x)))); }
__device__ __forceinline__ float block_max(float v, float* red) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  float r = lane < nw ? red[lane] : -INFINITY;
  return warp_max(r);
}

}  // namespace dil::cuda
