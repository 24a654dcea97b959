// Block-level pieces of the device sampler shared by its two kernels (sample.cu: a CTA per
// row; sample_cluster.cu: a cluster of CTAs per row): fixed-order reductions over a CTA of
// kThreads (so results never depend on scheduling), the cumulative predicate of the radix
// searches, and log_softmax of a row (backend/sampling.h). Semantics: backend/sampling.h.
#pragma once
#include <cfloat>
#include <climits>

#include "backend/sampling.h"
#include "backend/sampling_math.h"

namespace dil::cuda {
namespace {

namespace sm = dil::sampling;
using u64 = unsigned long long;

constexpr int kThreads = 1024, kWarps = kThreads / 32;

struct Smem {
  u64 hist[256];
  u64 u_red[kWarps];
  double d_red[kWarps];
  float f_red[kWarps];
  int i_red[kWarps];
  u64 scan[kWarps];
  u64 b_u[2];
  double b_d;
  float b_f;
  int b_i[2];
  u64 top_key[kMaxSampleTop];
  int top_id[kMaxSampleTop];
  int n_top;
};

__device__ __forceinline__ float neg_inf() { return -sm::f_inf(); }
__device__ __forceinline__ float sanitize(float v) { return isnan(v) ? neg_inf() : v; }

__device__ float block_max(float v, Smem& s) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(~0u, v, o));
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  __syncthreads();
  if (l == 0) s.f_red[w] = v;
  __syncthreads();
  if (w == 0) {
    v = s.f_red[l];  // kWarps == 32
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(~0u, v, o));
    if (l == 0) s.b_f = v;
  }
  __syncthreads();
  return s.b_f;
}

// Sum in a fixed tree: lanes by xor-shuffle, then warps by lane.
__device__ double block_sum_d(double v, Smem& s) {
  for (int o = 16; o > 0; o >>= 1) v = __dadd_rn(v, __shfl_xor_sync(~0u, v, o));
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  __syncthreads();
  if (l == 0) s.d_red[w] = v;
  __syncthreads();
  if (w == 0) {
    v = s.d_red[l];
    for (int o = 16; o > 0; o >>= 1) v = __dadd_rn(v, __shfl_xor_sync(~0u, v, o));
    if (l == 0) s.b_d = v;
  }
  __syncthreads();
  return s.b_d;
}

__device__ u64 block_sum_u(u64 v, Smem& s) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(~0u, v, o);
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  __syncthreads();
  if (l == 0) s.u_red[w] = v;
  __syncthreads();
  if (w == 0) {
    v = s.u_red[l];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(~0u, v, o);
    if (l == 0) s.b_u[0] = v;
  }
  __syncthreads();
  return s.b_u[0];
}

// Inclusive scan of one value per thread, in thread order.
__device__ u64 block_scan_u(u64 v, Smem& s) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  for (int o = 1; o < 32; o <<= 1) {
    const u64 n = __shfl_up_sync(~0u, v, o);
    if (l >= o) v += n;
  }
  __syncthreads();
  if (l == 31) s.scan[w] = v;
  __syncthreads();
  if (w == 0) {
    u64 t = s.scan[l];
    for (int o = 1; o < 32; o <<= 1) {
      const u64 n = __shfl_up_sync(~0u, t, o);
      if (l >= o) t += n;
    }
    s.scan[l] = t;
  }
  __syncthreads();
  return v + (w > 0 ? s.scan[w - 1] : 0);
}

// Predicate on a cumulative quantity: count >= target (kCount) or double(mass) >= thr (kMass).
struct Pred {
  bool mass;
  u64 target;
  double thr;
  __device__ bool operator()(u64 c) const { return mass ? __ull2double_rn(c) >= thr : c >= target; }
};

// log_softmax pieces of a row y (sampling.h): lp(t) = f(y_t).
struct Lse {
  float my;
  double lse;       // my finite
  float inf_lp;     // my == +inf: logprob of each +inf entry
  __device__ float operator()(float y) const {
    if (y == neg_inf() || my == neg_inf()) return neg_inf();
    if (my == sm::f_inf()) return y == sm::f_inf() ? inf_lp : neg_inf();
    return __double2float_rn(__dadd_rn(double(y), -lse));
  }
};

}  // namespace
}  // namespace dil::cuda
