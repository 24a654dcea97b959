// V4.1 Engram gate and residual update (model-spec §4.5; the formula is in backend.h).
#include <cmath>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"

namespace dil {

// The two mean squares and the weighted dot product accumulate in double; s, the gate and
// the update are evaluated in double and rounded once to f32.
// X, kv, out f32|bf16 (out rounded to its dtype), qk f32.
void CpuBackend::engram_mix(const Tensor& X0, const Tensor& kv0, const Tensor& qk, const Tensor& mask, float eps,
                            Tensor out0) {
  cpu::Staged sx(X0, "engram_mix X"), sk(kv0, "engram_mix kv"), so(out0, "engram_mix out", true);
  const Tensor &X = sx.t, &kv = sk.t, &out = so.t;
  cpu::check_f32(qk, "engram_mix qk");
  const int64_t D = cpu::last_dim(X), n = cpu::n_rows(qk), T = X.numel() / (n * D);
  DIL_CHECK(cpu::last_dim(qk) == D && X.numel() == T * n * D && out.numel() == X.numel() &&
                kv.numel() == T * (n + 1) * D,
            "engram_mix: X ", X.shape_str(), " kv ", kv.shape_str(), " qk ", qk.shape_str());
  if (!mask.empty()) {
    cpu::check_i32(mask, "engram_mix mask");
    DIL_CHECK(mask.numel() == T, "engram_mix: mask ", mask.shape_str());
  }
  const float *px = X.ptr<float>(), *pk = kv.ptr<float>(), *pw = qk.ptr<float>();
  float* po = out.ptr<float>();
  const double inv_sqrt_d = 1.0 / std::sqrt(double(D));
  for (int64_t t = 0; t < T; ++t) {
    const float* value = pk + (t * (n + 1) + n) * D;  // [D]
    const bool off = !mask.empty() && mask.ptr<int32_t>()[t] != 0;
    for (int64_t j = 0; j < n; ++j) {
      const float* h = px + (t * n + j) * D;        // [D]
      const float* key = pk + (t * (n + 1) + j) * D;  // [D]
      const float* w = pw + j * D;                  // [D]
      double hh = 0.0, kk = 0.0, dot = 0.0;
      for (int64_t c = 0; c < D; ++c) {
        hh += double(h[c]) * h[c];
        kk += double(key[c]) * key[c];
        dot += double(h[c]) * w[c] * key[c];
      }
      const double s = dot / std::sqrt(hh / double(D) + eps) / std::sqrt(kk / double(D) + eps) * inv_sqrt_d;
      const double g = off ? 0.0 : 1.0 / (1.0 + std::exp(-std::copysign(std::sqrt(std::max(std::fabs(s), 1e-6)), s)));
      float* o = po + (t * n + j) * D;
      for (int64_t c = 0; c < D; ++c) o[c] = float(double(h[c]) + g * double(value[c]));
    }
  }
}

}  // namespace dil
