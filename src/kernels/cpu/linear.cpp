// Weight dequantization and the GEMMs (linear, grouped_linear) of the CPU reference.
// out = xq . W^T with W dequantized by model-spec §2.1 and xq the FP8-act-quantized input
// (official fp8_gemm / fp4_gemm), accumulated in double and rounded once to f32.
#include <array>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"

namespace dil {
namespace cpu {

namespace {
// All 256 e4m3 codes decoded once (immutable after construction).
const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = e4m3_to_f32(uint8_t(i));
    return t;
  }();
  return table;
}
double e8m0_d(uint8_t b) { return std::ldexp(1.0, int(b) - 127); }
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
      const auto& tab = e4m3_table();
      const uint8_t* r = static_cast<const uint8_t*>(w.w.data) + i * in;
      const uint8_t* s = static_cast<const uint8_t*>(w.scale.data) + (i / bo) * w.scale.size(1);
      for (int64_t j = 0; j < in; ++j) out[j] = double(tab[r[j]]) * e8m0_d(s[j / bi]);
      break;
    }
    case Weight::Kind::FP4: {
      // [out, in/2] bytes (low nibble = even column) with E8M0 scales [out, in/32]
      DIL_CHECK(w.scale.ndim == 2 && w.scale.size(0) == w.w.size(0) && w.scale.size(1) == (in + 31) / 32,
                "FP4 scale ", w.scale.shape_str(), " does not match weight ", w.w.shape_str());
      const uint8_t* r = static_cast<const uint8_t*>(w.w.data) + i * (in / 2);
      const uint8_t* s = static_cast<const uint8_t*>(w.scale.data) + i * w.scale.size(1);
      for (int64_t k = 0; k < in / 2; ++k) {
        out[2 * k] = double(e2m1_to_f32(r[k] & 0xf)) * e8m0_d(s[(2 * k) / 32]);
        out[2 * k + 1] = double(e2m1_to_f32(r[k] >> 4)) * e8m0_d(s[(2 * k + 1) / 32]);
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
    for (int64_t t = 0; t < T; ++t) {
      const float* xr = x + t * ld_x;
      double acc = 0.0;
      for (int64_t k = 0; k < in; ++k) acc += double(xr[k]) * wrow[k];
      out[t * ld_out + o] = float(acc);
    }
  }
}

}  // namespace cpu

// x [T, in] f32 -> out [T, out] f32. act_block > 0: FP8 act quant of x per act_block columns
// (only for FP8/FP4 weights, as the official linear() does; ignored for F32/BF16 weights).
void CpuBackend::linear(const Tensor& x, const Weight& w, int act_block, Tensor out) {
  cpu::check_f32(x, "linear x");
  cpu::check_f32(out, "linear out");
  const int64_t in = cpu::weight_cols(w), n_out = cpu::weight_rows(w);
  DIL_CHECK(cpu::last_dim(x) == in, "linear: x ", x.shape_str(), " vs weight in ", in);
  DIL_CHECK(cpu::last_dim(out) == n_out && cpu::n_rows(out) == cpu::n_rows(x), "linear: out ",
            out.shape_str(), " for x ", x.shape_str(), " and weight out ", n_out);
  cpu::linear_rows(x.ptr<float>(), cpu::n_rows(x), in, w, act_block, out.ptr<float>(), n_out);
}

// x [T, G, K], W [G*N, K] (any kind, no act quant) -> out [T, G, N]:
// out[t, g, n] = sum_k x[t, g, k] * W[g*N + n, k], double accumulation rounded once.
void CpuBackend::grouped_linear(const Tensor& x, const Weight& w, int groups, Tensor out) {
  cpu::check_f32(x, "grouped_linear x");
  cpu::check_f32(out, "grouped_linear out");
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
