// The scalar tail of hc_mix for one token (model-spec §3.3), shared by the exact kernel
// (mhc.cu) and the fast fused pre (mhc_fast.cu): sigmoids and Sinkhorn in exactly the CPU
// reference's f32 order (src/kernels/cpu/hc.cpp; the library is built without FMA
// contraction), so that given the same mixes both write bit-identical pre / post / comb.
#pragma once
#include "kernels/cuda/common.cuh"

namespace dil::cuda {

// mix [m] (already times rho), base [m], scale [3] (head: [1]); n <= 8, m == n (head: pre
// only) or n*(2+n). pre [n], post [n], comb [n, n] are this token's rows.
__device__ inline void hc_token_scalars(const float* mix, const float* base, const float* scale, int n, int m,
                                        int iters, float eps, float* pre, float* post, float* comb) {
  for (int j = 0; j < n; ++j) pre[j] = d_sigmoid(mix[j] * scale[0] + base[j]) + eps;
  if (m == n) return;  // head: pre only
  for (int j = 0; j < n; ++j) post[j] = 2.0f * d_sigmoid(mix[n + j] * scale[1] + base[n + j]);
  float C[8][8];
  for (int j = 0; j < n; ++j)
    for (int k = 0; k < n; ++k) C[j][k] = mix[2 * n + j * n + k] * scale[2] + base[2 * n + j * n + k];
  // Row softmax + eps, then the first column normalisation; then iters-1 rounds of row and
  // column normalisation. Sums sequential in f32, exp in double rounded once.
  for (int j = 0; j < n; ++j) {
    float mx = C[j][0];
    for (int k = 1; k < n; ++k) mx = C[j][k] > mx ? C[j][k] : mx;
    float s = 0.f;
    for (int k = 0; k < n; ++k) {
      C[j][k] = float(exp(double(C[j][k] - mx)));
      s += C[j][k];
    }
    for (int k = 0; k < n; ++k) C[j][k] = C[j][k] / s + eps;
  }
  float colsum[8];
  for (int it = 0; it < iters; ++it) {
    if (it > 0) {
      for (int j = 0; j < n; ++j) {
        float s = 0.f;
        for (int k = 0; k < n; ++k) s += C[j][k];
        for (int k = 0; k < n; ++k) C[j][k] = C[j][k] / (s + eps);
      }
    }
    for (int k = 0; k < n; ++k) {
      float s = 0.f;
      for (int j = 0; j < n; ++j) s += C[j][k];
      colsum[k] = s;
    }
    for (int j = 0; j < n; ++j)
      for (int k = 0; k < n; ++k) C[j][k] = C[j][k] / (colsum[k] + eps);
  }
  for (int j = 0; j < n; ++j)
    for (int k = 0; k < n; ++k) comb[j * n + k] = C[j][k];
}

// hc_token_scalars for n = 4 on the lanes of a warp (the fast pre's hc_scalars_kernel): every
// lane holds the same mix [m] (m = 4: the head, pre only; m = 24); lanes 0..3 write pre, 4..7
// post, lanes (j, k) = (e / 4, e % 4), e = lane % 16, run the Sinkhorn entry C[j][k]. Row and
// column sums gather the four values by shuffles and add them in hc_token_scalars' order, so
// every value is the sequential function's bit for bit; the serial chain is one entry's instead
// of sixteen (one lane's Sinkhorn was 70 us of a 64-token hc_pre). All 32 lanes must call it.
template <int M>
__device__ inline void hc_token_scalars_warp4(const float (&mix)[M], const float* base, const float* scale,
                                              int iters, float eps, float* pre, float* post, float* comb) {
  constexpr int n = 4;
  static_assert(M == n || M == n * (2 + n), "hc_token_scalars_warp4: head or sublayer mixes");
  const int lane = threadIdx.x & 31;
  auto pick = [&](int idx) {  // mix[idx] without a local-memory array
    float r = 0.f;
#pragma unroll
    for (int i = 0; i < M; ++i) r = i == idx ? mix[i] : r;
    return r;
  };
  if (lane < n) pre[lane] = d_sigmoid(pick(lane) * scale[0] + base[lane]) + eps;
  if (M == n) return;
  if (lane >= n && lane < 2 * n) post[lane - n] = 2.0f * d_sigmoid(pick(lane) * scale[1] + base[lane]);
  const int e = lane & 15, j = e >> 2;
  const unsigned full = 0xffffffffu;
  auto row_sum = [&](float v) {  // sum over k of C[j][k], k ascending from 0
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < n; ++k) s += __shfl_sync(full, v, (lane & 16) | (j * n + k));
    return s;
  };
  auto col_sum = [&](float v) {  // sum over j of C[j][k], j ascending from 0
    float s = 0.f;
#pragma unroll
    for (int jj = 0; jj < n; ++jj) s += __shfl_sync(full, v, (lane & 16) | (jj * n + (e & 3)));
    return s;
  };
  float c = pick(2 * n + e) * scale[2] + base[2 * n + e];
  float mx = __shfl_sync(full, c, (lane & 16) | (j * n));
#pragma unroll
  for (int k = 1; k < n; ++k) {
    const float o = __shfl_sync(full, c, (lane & 16) | (j * n + k));
    mx = o > mx ? o : mx;
  }
  c = float(exp(double(c - mx)));
  c = c / row_sum(c) + eps;
  for (int it = 0; it < iters; ++it) {
    if (it > 0) c = c / (row_sum(c) + eps);
    c = c / (col_sum(c) + eps);
  }
  if (lane < n * n) comb[e] = c;
}

}  // namespace dil::cuda
