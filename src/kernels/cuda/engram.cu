// V4.1 Engram gate and residual update (model-spec §4.5; the formula is in backend.h).
// The gate of each (token, stream) is one thread's sequential double sums in the CPU
// reference's order (no FMA contraction: --fmad=false), so the sums equal the CPU's bit for
// bit; the gate's exp may differ from the host libm's by an ulp of double, which moves an
// f32 output by at most one ulp (the parity test's tolerance).
#include <algorithm>

#include "kernels/cuda/ops.cuh"

namespace dil::cuda {
namespace {

// One thread per (t, j): gate[t, j] in double. X [T, n, D], kv [T, (n+1)*D], qk [n, D],
// mask [T] i32 or null, gate [T, n] f64.
__global__ void engram_gate_kernel(const float* X, const float* kv, const float* qk, const int32_t* mask, int T,
                                   int n, int D, float eps, double* gate) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(T) * n) return;
  int t = int(i / n), j = int(i % n);
  const float* h = X + i * D;                               // [D]
  const float* key = kv + (int64_t(t) * (n + 1) + j) * D;  // [D]
  const float* w = qk + int64_t(j) * D;                     // [D]
  double hh = 0.0, kk = 0.0, dot = 0.0;
  for (int c = 0; c < D; ++c) {
    hh += double(h[c]) * double(h[c]);
    kk += double(key[c]) * double(key[c]);
    dot += double(h[c]) * double(w[c]) * double(key[c]);
  }
  const double inv_sqrt_d = 1.0 / sqrt(double(D));
  const double s = dot / sqrt(hh / double(D) + double(eps)) / sqrt(kk / double(D) + double(eps)) * inv_sqrt_d;
  const bool off = mask && mask[t] != 0;
  gate[i] = off ? 0.0 : 1.0 / (1.0 + exp(-copysign(sqrt(fmax(fabs(s), 1e-6)), s)));
}

// out[t, j, c] = h + gate[t, j] * value[t, c], evaluated in double and rounded once.
__global__ void engram_update_kernel(const float* X, const float* kv, const double* gate, int64_t total, int n,
                                     int D, float* out) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t tj = i / D, c = i % D, t = tj / n;
    const float value = kv[(t * (n + 1) + n) * D + c];
    out[i] = float(double(X[i]) + gate[tj] * double(value));
  }
}

}  // namespace

void engram_mix(Ctx& c, const Tensor& X, const Tensor& kv, const Tensor& qk, const Tensor& mask, float eps,
                Tensor out) {
  DIL_CHECK(X.dtype == DType::F32 && kv.dtype == DType::F32 && qk.dtype == DType::F32 && out.dtype == DType::F32,
            "engram_mix: f32 only");
  DIL_CHECK(qk.ndim == 2, "engram_mix: qk ", qk.shape_str());
  const int64_t D = qk.size(1), n = qk.size(0);
  DIL_CHECK(X.size(-1) == D && X.numel() % (n * D) == 0, "engram_mix: X ", X.shape_str(), " qk ", qk.shape_str());
  const int64_t T = X.numel() / (n * D);
  DIL_CHECK(out.numel() == X.numel() && kv.numel() == T * (n + 1) * D, "engram_mix: X ", X.shape_str(), " kv ",
            kv.shape_str(), " out ", out.shape_str());
  if (!mask.empty())
    DIL_CHECK(mask.dtype == DType::I32 && mask.numel() == T, "engram_mix: mask ", mask.shape_str());
  if (T == 0) return;
  Buffer gb = c.scratch(size_t(T * n) * sizeof(double));
  double* gate = static_cast<double*>(gb.data());  // [T, n]
  engram_gate_kernel<<<grid_for(T * n, 128), 128, 0, c.stream>>>(
      X.ptr<float>(), kv.ptr<float>(), qk.ptr<float>(), mask.empty() ? nullptr : mask.ptr<int32_t>(), int(T),
      int(n), int(D), eps, gate);
  DIL_LAUNCH_CHECK("engram_gate_kernel");
  const int64_t total = T * n * D;
  engram_update_kernel<<<unsigned(std::min<int64_t>(ceil_div(total, int64_t(256)), 4096)), 256, 0, c.stream>>>(
      X.ptr<float>(), kv.ptr<float>(), gate, total, int(n), int(D), out.ptr<float>());
  DIL_LAUNCH_CHECK("engram_update_kernel");
}

}  // namespace dil::cuda
