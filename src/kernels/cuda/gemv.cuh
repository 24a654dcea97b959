// The few-rows GEMM ("GEMV") shared by linear (gemm.cu) and the MoE (moe.cu) for decode-sized
// inputs: one thread per output column n over up to kGemvRows activation rows staged in
// shared memory; each thread walks its weight row once, decoding FP4 from 16-byte loads
// (32 values per load, one E8M0 scale), and accumulates in double over k ascending: the same
// sum, term for term, as the reference and as gemm_tile, so results are bit-identical to both.
// The 64x64 tile kernel decodes each weight once per 64 rows and wastes 63/64 of its work on
// a single token; this one reads each weight once per 4 rows.
#pragma once
#include "kernels/cuda/gemm_simt.cuh"

namespace dil::cuda {

constexpr int kGemvRows = 4, kGemvThreads = 128, kGemvKC = 512;

// TX, TO: float | bf16_t activations (widened when staged; the f32 result rounded once more).
template <class TX, class TO>
__device__ __forceinline__ void gemv_tile(const TX* __restrict__ x, int64_t ldx, const int32_t* rows, int64_t m0,
                                          int64_t m_end, const WView& w, int64_t w_row0, int64_t n0, int64_t n_end,
                                          int64_t K, TO* __restrict__ out, int64_t ldo) {
  __shared__ float xs[kGemvRows][kGemvKC];
  const int R = int(min(int64_t(kGemvRows), m_end - m0));
  const int64_t n = n0 + threadIdx.x;
  const bool active = n < n_end;
  const bool fp4_fast = w.kind == int(Weight::Kind::FP4) && K % 32 == 0 && (reinterpret_cast<uintptr_t>(w.w) & 15) == 0;
  double acc[kGemvRows] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kGemvKC) {
    const int kc = int(min(int64_t(kGemvKC), K - k0));
    __syncthreads();
    for (int i = threadIdx.x; i < kGemvRows * kGemvKC; i += blockDim.x) {
      int r = i / kGemvKC, kk = i % kGemvKC;
      float v = 0.f;
      if (r < R && kk < kc) {
        int64_t row = rows ? rows[m0 + r] : m0 + r;
        v = ld_act(x[row * ldx + k0 + kk]);
      }
      xs[r][kk] = v;
    }
    __syncthreads();
    if (!active) continue;
    if (fp4_fast) {
      const uint8_t* wr = static_cast<const uint8_t*>(w.w) + (w_row0 + n) * (w.k >> 1) + (k0 >> 1);
      const uint8_t* sr = w.scale + (w_row0 + n) * w.scale_cols + (k0 >> 5);
      uint4 next = *reinterpret_cast<const uint4*>(wr);
      for (int c = 0; c < kc; c += 32) {
        const uint4 v = next;
        if (c + 32 < kc) next = *reinterpret_cast<const uint4*>(wr + ((c + 32) >> 1));  // prefetch
        const float sc = d_e8m0_to_f32(sr[c >> 5]);
        const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          const float wv = d_e2m1_to_f32(uint8_t((words[j >> 3] >> ((j & 7) * 4)) & 15u)) * sc;
#pragma unroll
          for (int r = 0; r < kGemvRows; ++r)
            if (r < R) acc[r] = fma(double(xs[r][c + j]), double(wv), acc[r]);
        }
      }
    } else {
      for (int kk = 0; kk < kc; ++kk) {
        const float wv = wdecode(w, w_row0 + n, k0 + kk);
#pragma unroll
        for (int r = 0; r < kGemvRows; ++r)
          if (r < R) acc[r] = fma(double(xs[r][kk]), double(wv), acc[r]);
      }
    }
  }
  if (!active) return;
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r)
    if (r < R) st_act(out + (m0 + r) * ldo + n, float(acc[r]));
}

}  // namespace dil::cuda
