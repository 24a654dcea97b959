// Weight dequantization and the GEMMs (linear, grouped_linear) of the CPU reference.
// out = xq . W^T with W dequantized by model-spec §2.1 and xq the FP8-act-quantized input
// (official fp8_gemm / fp4_gemm), accumulated in double and rounded once to f32.
#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"

namespace dil {
namespace cpu {

namespace {
// Code tables decoded once (immutable after construction): every e4m3 value, every E8M0
// scale 2^(b-127) as double (exact; b = 255 is NaN in the format and never used), every
// e2m1 nibble. Dequantization is then two lookups and one exact product per element.
struct CodeTables {
  std::array<double, 256> e4m3{}, e8m0{};
  std::array<double, 16> e2m1{};
  CodeTables() {
    for (int i = 0; i < 256; ++i) {
      e4m3[i] = e4m3_to_f32(uint8_t(i));
      e8m0[i] = std::ldexp(1.0, i - 127);
    }
    for (int i = 0; i < 16; ++i) e2m1[i] = e2m1_to_f32(uint8_t(i));
  }
};
const CodeTables& tables() {
  static const CodeTables t;
  return t;
}
}  // namespace

int64_t weight_rows(const Weight& w) { return w.w.size(0); }
int64_t weight_cols(const Weight& w) { return w.kind == Weight::Kind::FP4 ? 2 * w.w.size(1) : w.w.size(1); }

void dequant_row(const Weight& w, int64_t i, double* out) {
  const int64_t in = weight_cols(w);
  switch (w.kind) {
    case Weight::Kind::F32: {
      DIL_CHECK(w.w.dtype == DType::F32, "F32 weight with dtype ", dtype_name(w.w.dtype));
      const float* r = w.w.ptr<float>() + i * in;
      for (int64_t j = 0; j < in; ++j) out[j] = r[j];
      break;
    }
    case Weight::Kind::BF16: {
      DIL_CHECK(w.w.dtype == DType::BF16, "BF16 weight with dtype ", dtype_name(w.w.dtype));
      const uint16_t* r = w.w.ptr<uint16_t>() + i * in;
      for (int64_t j = 0; j < in; ++j) out[j] = bf16_to_f32(r[j]);
      break;
    }
    case Weight::Kind::FP8: {
      // [out, in] e4m3 with E8M0 scales [ceil(out/bo), ceil(in/bi)]
      const int bo = w.block_out, bi = w.block_in;
      DIL_CHECK(bo > 0 && bi > 0, "FP8 weight without block shape");
      DIL_CHECK(w.scale.ndim == 2 && w.scale.size(0) == (w.w.size(0) + bo - 1) / bo &&
                    w.scale.size(1) == (in + bi - 1) / bi,
                "FP8 scale ", w.scale.shape_str(), " does not match weight ", w.w.shape_str());
      const CodeTables& tab = tables();
      const uint8_t* r = static_cast<const uint8_t*>(w.w.data) + i * in;
      const uint8_t* s = static_cast<const uint8_t*>(w.scale.data) + (i / bo) * w.scale.size(1);
      for (int64_t j0 = 0; j0 < in; j0 += bi) {
        const double sc = tab.e8m0[s[j0 / bi]];
        for (int64_t j = j0, j1 = std::min<int64_t>(in, j0 + bi); j < j1; ++j) out[j] = tab.e4m3[r[j]] * sc;
      }
      break;
    }
    case Weight::Kind::FP4: {
      // [out, in/2] bytes (low nibble = even column) with E8M0 scales [out, in/32]
      DIL_CHECK(w.scale.ndim == 2 && w.scale.size(0) == w.w.size(0) && w.scale.size(1) == (in + 31) / 32,
                "FP4 scale ", w.scale.shape_str(), " does not match weight ", w.w.shape_str());
      const CodeTables& tab = tables();
      const uint8_t* r = static_cast<const uint8_t*>(w.w.data) + i * (in / 2);
      const uint8_t* s = static_cast<const uint8_t*>(w.scale.data) + i * w.scale.size(1);
      for (int64_t k = 0; k < in / 2; ++k) {
        const double sc = tab.e8m0[s[k / 16]];  // columns 2k, 2k+1 share the block (2k)/32
        out[2 * k] = tab.e2m1[r[k] & 0xf] * sc;
        out[2 * k + 1] = tab.e2m1[r[k] >> 4] * sc;
      }
      break;
    }
  }
}

void linear_rows(const float* x, int64_t T, int64_t ld_x, const Weight& w, int act_block,
                 float* out, int64_t ld_out) {
  const int64_t in = weight_cols(w), n_out = weight_rows(w);
  // Official linear(): activations are FP8-quantized only in front of FP8/FP4 GEMMs.
  const bool quant = act_block > 0 && (w.kind == Weight::Kind::FP8 || w.kind == Weight::Kind::FP4);
  std::vector<float> xq;  // [T, in] f32 act-quantized copy of x
  if (quant) {
    xq.resize(size_t(T * in));
    for (int64_t t = 0; t < T; ++t) {
      std::copy(x + t * ld_x, x + t * ld_x + in, xq.begin() + t * in);
      act_quant_qdq(xq.data() + t * in, in, act_block);
    }
    x = xq.data();
    ld_x = in;
  }
  std::vector<double> wrow(static_cast<size_t>(in));  // [in] one dequantized weight row
  for (int64_t o = 0; o < n_out; ++o) {
    dequant_row(w, o, wrow.data());
    const double* wr = wrow.data();
    int64_t t = 0;
    // Four tokens at a time only for instruction-level parallelism: each token keeps its own
    // accumulator and the same ascending-k order, so the bits do not depend on the grouping.
    for (; t + 4 <= T; t += 4) {
      const float *x0 = x + t * ld_x, *x1 = x0 + ld_x, *x2 = x1 + ld_x, *x3 = x2 + ld_x;
      double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
      for (int64_t k = 0; k < in; ++k) {
        a0 += double(x0[k]) * wr[k];
        a1 += double(x1[k]) * wr[k];
        a2 += double(x2[k]) * wr[k];
        a3 += double(x3[k]) * wr[k];
      }
      out[t * ld_out + o] = float(a0);
      out[(t + 1) * ld_out + o] = float(a1);
      out[(t + 2) * ld_out + o] = float(a2);
      out[(t + 3) * ld_out + o] = float(a3);
    }
    for (; t < T; ++t) {
      const float* xr = x + t * ld_x;
      double acc = 0.0;
      for (int64_t k = 0; k < in; ++k) acc += double(xr[k]) * wr[k];
      out[t * ld_out + o] = float(acc);
    }
  }
}

}  // namespace cpu

// x [T, in] f32|bf16 -> out [T, out] f32|bf16. act_block > 0: FP8 act quant of x per
// act_block columns (only for FP8/FP4 weights, as the official linear() does; ignored for
// F32/BF16 weights). The f32 result is rounded to out's dtype.
void CpuBackend::linear(const Tensor& x0, const Weight& w, int act_block, Tensor out0) {
  impl_for(linear_site(w, act_block, x0.dtype, out0.dtype, numerics()), cpu::n_rows(x0));  // the site is planned
  cpu::Staged sx(x0, "linear x"), so(out0, "linear out", true);
  const Tensor &x = sx.t, &out = so.t;
  const int64_t in = cpu::weight_cols(w), n_out = cpu::weight_rows(w);
  DIL_CHECK(cpu::last_dim(x) == in, "linear: x ", x.shape_str(), " vs weight in ", in);
  DIL_CHECK(cpu::last_dim(out) == n_out && cpu::n_rows(out) == cpu::n_rows(x), "linear: out ",
            out.shape_str(), " for x ", x.shape_str(), " and weight out ", n_out);
  cpu::linear_rows(x.ptr<float>(), cpu::n_rows(x), in, w, act_block, out.ptr<float>(), n_out);
}

// x [T, G, K] f32|bf16, W [G*N, K] (any kind, no act quant) -> out [T, G, N] f32|bf16:
// out[t, g, n] = sum_k x[t, g, k] * W[g*N + n, k], double accumulation rounded once to f32,
// then to out's dtype.
void CpuBackend::grouped_linear(const Tensor& x0, const Weight& w, int groups, Tensor out0) {
  impl_for(grouped_linear_site(w, groups, x0.dtype, out0.dtype, numerics()), x0.size(0));
  cpu::Staged sx(x0, "grouped_linear x"), so(out0, "grouped_linear out", true);
  const Tensor &x = sx.t, &out = so.t;
  const int64_t K = cpu::weight_cols(w), G = groups, N = cpu::weight_rows(w) / G;
  DIL_CHECK(G > 0 && N * G == cpu::weight_rows(w), "grouped_linear: ", cpu::weight_rows(w),
            " rows not divisible into ", G, " groups");
  const int64_t T = x.numel() / (G * K);
  DIL_CHECK(T * G * K == x.numel() && out.numel() == T * G * N, "grouped_linear: x ", x.shape_str(),
            " out ", out.shape_str());
  const float* px = x.ptr<float>();
  float* po = out.ptr<float>();
  std::vector<double> wrow(static_cast<size_t>(K));  // [K]
  for (int64_t g = 0; g < G; ++g)
    for (int64_t n = 0; n < N; ++n) {
      cpu::dequant_row(w, g * N + n, wrow.data());
      for (int64_t t = 0; t < T; ++t) {
        const float* xr = px + (t * G + g) * K;
        double acc = 0.0;
        for (int64_t k = 0; k < K; ++k) acc += double(xr[k]) * wrow[k];
        po[(t * G + g) * N + n] = float(acc);
      }
    }
}

}  // namespace dil
