// V4.1 Engram gate and residual update (model-spec §4.5; the formula is in backend.h).
// The gate of each (token, stream) is one thread's sequential double sums in the CPU
// reference's order (no FMA contraction: --fmad=false), so the sums equal the CPU's bit for
// bit; the gate's exp may differ from the host libm's by an ulp of double, which moves an
// f32 output by at most one ulp (the parity test's tolerance). X, kv and out are f32 or bf16
// activations (templates over their storage types), qk f32.
#include <algorithm>

#include "kernels/cuda/ops.cuh"

namespace dil::cuda {
namespace {

// One thread per (t, j): gate[t, j] in double. X [T, n, D], kv [T, (n+1)*D], qk [n, D],
// mask [T] i32 or null, gate [T, n] f64.
template <class TX, class TK>
__global__ void engram_gate_kernel(const TX* X, const TK* kv, const float* qk, const int32_t* mask, int T, int n,
                                   int D, float eps, double* gate) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(T) * n) return;
  int t = int(i / n), j = int(i % n);
  const TX* h = X + i * D;                               // [D]
  const TK* key = kv + (int64_t(t) * (n + 1) + j) * D;  // [D]
  const float* w = qk + int64_t(j) * D;                     // [D]
  double hh = 0.0, kk = 0.0, dot = 0.0;
  for (int c = 0; c < D; ++c) {
    const double hc = ld_act(h[c]), kc = ld_act(key[c]);
    hh += hc * hc;
    kk += kc * kc;
    dot += hc * double(w[c]) * kc;
  }
  const double inv_sqrt_d = 1.0 / sqrt(double(D));
  const double s = dot / sqrt(hh / double(D) + double(eps)) / sqrt(kk / double(D) + double(eps)) * inv_sqrt_d;
  const bool off = mask && mask[t] != 0;
  gate[i] = off ? 0.0 : 1.0 / (1.0 + exp(-copysign(sqrt(fmax(fabs(s), 1e-6)), s)));
}

// out[t, j, c] = h + gate[t, j] * value[t, c], evaluated in double and rounded once.
// out may alias X (same dtype): each element is read before it is written, by its own thread.
template <class TX, class TK, class TO>
__global__ void engram_update_kernel(const TX* X, const TK* kv, const double* gate, int64_t total, int n, int D,
                                     TO* out) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t tj = i / D, c = i % D, t = tj / n;
    const float value = ld_act(kv[(t * (n + 1) + n) * D + c]);
    st_act(out + i, float(double(ld_act(X[i])) + gate[tj] * double(value)));
  }
}

}  // namespace

void engram_mix(Ctx& c, const Tensor& X, const Tensor& kv, const Tensor& qk, const Tensor& mask, float eps,
                Tensor out) {
  check_f32(qk, "engram_mix qk");
  DIL_CHECK(out.data != X.data || out.dtype == X.dtype, "engram_mix: in place needs one dtype");
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
  const int64_t total = T * n * D;
  with_act(X, "engram_mix X", [&](auto tx) {
    using TX = decltype(tx);
    with_act(kv, "engram_mix kv", [&](auto tk) {
      using TK = decltype(tk);
      engram_gate_kernel<TX, TK><<<grid_for(T * n, 128), 128, 0, c.stream>>>(
          X.ptr<const TX>(), kv.ptr<const TK>(), qk.ptr<float>(), mask.empty() ? nullptr : mask.ptr<int32_t>(), int(T),
          int(n), int(D), eps, gate);
      DIL_LAUNCH_CHECK("engram_gate_kernel");
      with_act(out, "engram_mix out", [&](auto to) {
        using TO = decltype(to);
        engram_update_kernel<TX, TK, TO>
            <<<unsigned(std::min<int64_t>(ceil_div(total, int64_t(256)), 4096)), 256, 0, c.stream>>>(
                X.ptr<const TX>(), kv.ptr<const TK>(), gate, total, int(n), int(D), out.ptr<TO>());
      });
      DIL_LAUNCH_CHECK("engram_update_kernel");
    });
  });
}

}  // namespace dil::cuda
