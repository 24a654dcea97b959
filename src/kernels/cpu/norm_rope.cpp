// RMSNorm and rotary embedding of the CPU reference (model-spec §3.1).
#include <cmath>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"

namespace dil {

// x [R, d] f32|bf16 (rows = numel / last dim), w [d] f32 or bf16 (empty: unweighted), out
// [R, d] f32|bf16 (may alias x): r = f32(1 / sqrt(sum(x^2)/d + eps)) computed in double and
// rounded once; y = w * (x * r) with both products in f32 (the official order: weight
// multiplied last), rounded to out's dtype.
void CpuBackend::rms_norm(const Tensor& x0, const Tensor& w, float eps, Tensor out0) {
  cpu::Staged sx(x0, "rms_norm x"), so(out0, "rms_norm out", true);
  const Tensor &x = sx.t, &out = so.t;
  const int64_t d = cpu::last_dim(x), R = cpu::n_rows(x);
  DIL_CHECK(out.numel() == x.numel(), "rms_norm: out ", out.shape_str(), " x ", x.shape_str());
  DIL_CHECK(w.empty() || (w.numel() == d && (w.dtype == DType::F32 || w.dtype == DType::BF16)),
            "rms_norm: weight ", w.shape_str(), " for width ", d);
  const float* px = x.ptr<float>();
  float* po = out.ptr<float>();
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = px + r * d;
    double ss = 0.0;
    for (int64_t c = 0; c < d; ++c) ss += double(xr[c]) * xr[c];
    const float rs = float(1.0 / std::sqrt(ss / double(d) + double(eps)));
    for (int64_t c = 0; c < d; ++c) {
      const float y = xr[c] * rs;
      float wc = 1.0f;
      if (!w.empty()) wc = w.dtype == DType::F32 ? w.ptr<float>()[c] : bf16_to_f32(w.ptr<uint16_t>()[c]);
      po[r * d + c] = w.empty() ? y : wc * y;
    }
  }
}

// x [R, H, d] f32|bf16 (or [R, d]: one head), pos [R] i32. Only the last rope_dims of each
// head rotate, as interleaved pairs (2i, 2i+1) of that part, i < rope_dims/2:
//   phi = float(pos) * inv_freq[i] (fp32 product); c, s = cos/sin(phi) in double rounded to f32
//   (s negated when inverse); y0 = x0*c - x1*s, y1 = x0*s + x1*c, each evaluated in double
//   (the products are exact there) and rounded to f32 (then to x's dtype).
void CpuBackend::rope(Tensor x0, const Tensor& pos, const RopeTable& table, bool inverse) {
  cpu::Staged sx(x0, "rope x", true);
  Tensor& x = sx.t;
  cpu::check_i32(pos, "rope pos");
  cpu::check_f32(table.inv_freq, "rope inv_freq");
  const int64_t R = x.size(0), d = cpu::last_dim(x), heads = x.numel() / (R * d);
  const int rd = table.rope_dims;
  DIL_CHECK(pos.numel() == R, "rope: pos ", pos.shape_str(), " for x ", x.shape_str());
  DIL_CHECK(rd > 0 && rd % 2 == 0 && rd <= d && table.inv_freq.numel() >= rd / 2, "rope: rope_dims ", rd,
            " for head width ", d);
  const float* f = table.inv_freq.ptr<float>();
  const int32_t* pp = pos.ptr<int32_t>();
  float* px = x.ptr<float>();
  for (int64_t r = 0; r < R; ++r) {
    const float p = float(pp[r]);
    for (int i = 0; i < rd / 2; ++i) {
      const float phi = p * f[i];
      const double c = float(std::cos(double(phi)));
      double s = float(std::sin(double(phi)));
      if (inverse) s = -s;
      for (int64_t h = 0; h < heads; ++h) {
        float* v = px + (r * heads + h) * d + (d - rd) + 2 * i;
        const double x0 = v[0], x1 = v[1];
        v[0] = float(x0 * c - x1 * s);
        v[1] = float(x0 * s + x1 * c);
      }
    }
  }
}

}  // namespace dil
