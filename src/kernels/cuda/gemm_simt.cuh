// The SIMT GEMM tile shared by linear (gemm.cu) and the MoE grouped GEMM (moe.cu):
// out[m, n] = sum_k X[m, k] * W[n, k], weights decoded from their checkpoint format while
// staged in shared memory (FP8 e4m3 x E8M0 blocks, FP4 e2m1 x E8M0 per 32, BF16, F32).
// Accumulation in double over k ascending, rounded once: every product of an f32 activation
// and a decoded weight is exact in double, so this is the CPU reference's sum term for term
// and the result is bit-identical to it. A correct first version (SIMT FP64, no tensor
// cores, no async copies); what a Hopper version needs is in docs/kernels.md.
#pragma once
#include "kernels/cuda/ops.cuh"

namespace dil::cuda {

constexpr int kBM = 64, kBN = 64, kBK = 16, kGemmThreads = 256;

__device__ __forceinline__ float wdecode(const WView& w, int64_t n, int64_t k) {
  switch (w.kind) {
    case 0: return static_cast<const float*>(w.w)[n * w.k + k];
    case 1: return d_bf16_to_f32(static_cast<const uint16_t*>(w.w)[n * w.k + k]);
    case 2:
      return d_e4m3_to_f32(static_cast<const uint8_t*>(w.w)[n * w.k + k]) *
             d_e8m0_to_f32(w.scale[(n / w.bn) * w.scale_cols + k / w.bk]);
    default: {
      uint8_t b = static_cast<const uint8_t*>(w.w)[n * (w.k >> 1) + (k >> 1)];
      return d_e2m1_to_f32((k & 1) ? (b >> 4) : (b & 15)) * d_e8m0_to_f32(w.scale[n * w.scale_cols + (k >> 5)]);
    }
  }
}

// One 64x64 output tile. Rows m0.. of X (row m at x + row_of(m) * ldx), weight rows
// w_row0 + n0.. ; writes out rows (out + m * ldo). `rows` (nullable) gathers X rows.
// TX, TO: float | bf16_t activations (widened when staged; the f32 result rounded once more).
template <class TX, class TO>
__device__ __forceinline__ void gemm_tile(const TX* __restrict__ x, int64_t ldx, const int32_t* rows,
                                          int64_t m0, int64_t m_end, const WView& w, int64_t w_row0,
                                          int64_t n0, int64_t n_end, int64_t K, TO* __restrict__ out,
                                          int64_t ldo) {
  __shared__ float As[kBK][kBM + 4];
  __shared__ float Ws[kBK][kBN + 4];
  const int tid = threadIdx.x;
  const int tx = tid % 16, ty = tid / 16;
  double acc[4][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kBK) {
    for (int i = tid; i < kBM * kBK; i += kGemmThreads) {
      int mm = i / kBK, kk = i % kBK;
      int64_t m = m0 + mm, k = k0 + kk;
      float v = 0.f;
      if (m < m_end && k < K) {
        int64_t r = rows ? rows[m] : m;
        v = ld_act(x[r * ldx + k]);
      }
      As[kk][mm] = v;
    }
    for (int i = tid; i < kBN * kBK; i += kGemmThreads) {
      int nn = i / kBK, kk = i % kBK;
      int64_t n = n0 + nn, k = k0 + kk;
      Ws[kk][nn] = (n < n_end && k < K) ? wdecode(w, w_row0 + n, k) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = As[kk][ty * 4 + i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = Ws[kk][tx * 4 + j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fma(double(a[i]), double(b[j]), acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    int64_t m = m0 + ty * 4 + i;
    if (m >= m_end) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int64_t n = n0 + tx * 4 + j;
      if (n < n_end) st_act(out + m * ldo + n, float(acc[i][j]));
    }
  }
}

}  // namespace dil::cuda
