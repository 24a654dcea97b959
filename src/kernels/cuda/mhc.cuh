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

}  // namespace dil::cuda
