// Parity of linear's cutlass_fp8 (CUTLASS Hopper blockwise FP8 GEMM, gemm_cutlass.h) against
// the CPU fast specification at V4-Flash projection shapes and at the row edges of its tiles
// (15 / 16 / 17: the plan's switch from cuBLASLt at 16 rows; 63 / 64 / 65: the 64-row tile
// configuration and the 128-row one; 127 / 128 / 129 and 512: M tiles of 128; rows not a
// multiple of 4: the padded activation-scale path), plus a weight that did not come through
// adopt_weight (its block scales converted per call).
//
// Tolerance (rel_l2 2e-3, per element 2e-2 of max|ref| + one bf16 ulp), derived:
// both sides quantize x to the same e4m3 codes with the same power-of-two scales (the same
// act-quant rounding) and read the same weight codes and power-of-two block scales, so
//   ref[m, n] = bf16( sum_b s_b p_b ),  p_b = sum_{k in block b} qx_k qw_k  (exact products:
//   4 significant bits each), s_b = sx_b sw_b a power of two; the CPU sums exactly (double).
// The GPU differs only in how the sum is formed. CUTLASS computes each p_b with 4 k32 FP8
// wgmma steps in the tensor core's accumulator, which aligns the 32 products and the running
// sum to the largest exponent among them and keeps 13 fraction bits below it (the ~14-bit
// accumulation of the DeepSeek-V3 report, 3.3.2): each of the 33 terms of a step loses less
// than u_j = 2^-13 M_j (M_j: the step's largest magnitude, at most |p_b| + the largest
// product). Worst case (every loss one way): 4 * 33 * 2^-13 = 1.6e-2 of max_j M_j per block,
// which with the f32 adds of the scaled partials (2^-24 each) and the bf16 output rounding
// (checked separately, one ulp) is the per-element bound 2e-2 of max|ref| where one block
// dominates the sum. In L2 the losses have random sign (the products' signs are random):
// sqrt(33 / 12) u_j per step, sqrt(4) steps per block, 2^-13 * 1.66 * 2 = 4e-4 of a block's
// M_j; the partials' M_j are at most ~|y| for the dominant blocks, so rel_l2 <= ~4e-4, and
// the bound 2e-3 leaves 5x. A model of that accumulator (each k32 step's terms truncated to 13
// fraction bits below its largest exponent, the sum rounded to f32, promoted per 128 K) on this
// test's data (M 16, N 512, K 4096) gives rel_l2 2.4e-4 and a largest error of 3.4e-4 max|ref|. The same bound checks cuBLASLt's block-scaled FP8 GEMM (the same
// quantization, promotion interval and wgmma; test_linear.cpp), so both are held to one number.
#include <cuda_runtime_api.h>

#include "kernels/cuda/gemm_cutlass.h"
#include "parity.h"

namespace dil::test {
namespace {

class CudaCutlass : public CudaParity {
 protected:
  void SetUp() override {
    CudaParity::SetUp();
    if (IsSkipped()) return;
    cpu->set_numerics(Numerics::Fast);
    gpu->set_numerics(Numerics::Fast);
  }
  // x [T, in] bf16 through an FP8 128x128 weight [out, in] -> bf16 [T, out], against the CPU.
  // adopted: the weight through adopt_weight (scales prepared at load) or not (per call).
  void run(int64_t out, int64_t in, int64_t T, uint32_t seed, const std::string& what, bool adopted = true) {
    HostWeight hw = make_weight(Weight::Kind::FP8, out, in, 128, seed);
    Weight gw = dev_weight(hw);
    if (!adopted) gw.scale = gpu->adopt_tensor(hw.wt.scale);  // a second device copy, unknown to prepare_weight
    const std::string impl = gpu->impl_for(linear_site(gw, 128, DType::BF16, DType::BF16, Numerics::Fast), T).name;
    if (T >= 16 && !forced("linear")) {  // the plan's regime (registry.cpp kCutlassMinRows)
      EXPECT_EQ(impl, "cutlass_fp8") << what;
    }
    auto x = bf16_of(random_vec(size_t(T * in), seed + 7, 3.0f));
    std::vector<uint16_t> ref(size_t(T * out));
    cpu->linear(bview(x, {T, in}), hw.wt, 128, bview(ref, {T, out}));
    Tensor go = poisoned(DType::BF16, {T, out});
    gpu->linear(devb(x, {T, in}), gw, 128, go);
    compare_bf16("linear fast " + impl, what + " T=" + std::to_string(T), downb(go), widen(ref), 2e-3, 2e-2);
  }
};

TEST_F(CudaCutlass, RowEdges) {
  for (int64_t T : {15, 16, 17, 63, 64, 65, 127, 128, 129})
    run(1024, 4096, T, 1600 + uint32_t(T), "wq_a [1024,4096]");
}

TEST_F(CudaCutlass, V4ProjectionShapes) {
  run(1024, 4096, 512, 1610, "wq_a [1024,4096]");
  run(512, 4096, 130, 1611, "wkv [512,4096]");
  run(4096, 8192, 100, 1612, "wo_b [4096,8192]");
  run(32768, 1024, 33, 1613, "wq_b [32768,1024]");
  run(2048, 4096, 257, 1614, "shared w1 [2048,4096]");
  run(4096, 2048, 66, 1615, "shared w2 [4096,2048]");
  run(8192, 1024, 200, 1616, "idx wq_b [8192,1024]");
}

TEST_F(CudaCutlass, WeightNotAdopted) {
  run(1024, 4096, 64, 1620, "wq_a [1024,4096] scales per call", false);
  run(1024, 4096, 130, 1621, "wq_a [1024,4096] scales per call", false);
}

// Every configuration of gemm_cutlass.h on the same e4m3 operands (whatever the plan picks at a
// row count), against the exact sum in double: the bound above without the act-quant step
// (operands given as codes and power-of-two scales). Rows 4..260 (multiples of 4, CUTLASS's
// minimum step), weight [512, 2048].
TEST_F(CudaCutlass, EveryConfigurationExact) {
  const int64_t N = 512, K = 2048, nb = K / 128;
  const auto wq = rnd_fp8(size_t(N * K), 1630);
  const auto ws = rnd_e8m0(size_t(N / 128 * nb), 1631);
  std::vector<float> wsf(ws.size());
  for (size_t i = 0; i < ws.size(); ++i) wsf[i] = e8m0_to_f32(ws[i]);
  std::vector<double> wd(wq.size());
  for (size_t i = 0; i < wq.size(); ++i) wd[i] = e4m3_to_f32(wq[i]);
  Tensor wq_d = dev(wq, DType::U8, {N, K}), ws_d = dev(wsf, DType::F32, {N / 128, nb});
  for (int64_t M : {4, 16, 60, 64, 68, 128, 132, 260}) {
    const auto xq = rnd_fp8(size_t(M * K), 1640 + uint32_t(M));
    std::vector<float> xs(size_t(nb * M));  // [K/128, M], tokens fastest
    for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::ldexp(1.0f, -int((i * 7) % 11));
    std::vector<double> xd(xq.size());
    for (size_t i = 0; i < xq.size(); ++i) xd[i] = e4m3_to_f32(xq[i]);
    std::vector<float> ref(size_t(M * N));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double y = 0;
        for (int64_t b = 0; b < nb; ++b) {
          double p = 0;
          for (int64_t k = b * 128; k < (b + 1) * 128; ++k) p += xd[size_t(m * K + k)] * wd[size_t(n * K + k)];
          y += p * double(xs[size_t(b * M + m)]) * double(wsf[size_t((n / 128) * nb + b)]);
        }
        ref[size_t(m * N + n)] = bf16_to_f32(f32_to_bf16(float(y)));
      }
    Tensor xq_d = dev(xq, DType::U8, {M, K}), xs_d = dev(xs, DType::F32, {nb, M});
    for (cuda::CutlassTile t : {cuda::CutlassTile::M64, cuda::CutlassTile::M128, cuda::CutlassTile::Swap}) {
      Tensor d = poisoned(DType::BF16, {M, N});
      cuda::CutlassFp8Gemm g;
      g.a = xq_d.data;
      g.sfa = xs_d.ptr<const float>();
      g.b = wq_d.data;
      g.sfb = ws_d.ptr<const float>();
      g.d = d.data;
      g.m = int(M);
      g.n = int(N);
      g.k = int(K);
      const size_t wsb = std::max<size_t>(cuda::cutlass_fp8_workspace(t, g), 16);
      Buffer w = gpu->alloc(wsb);
      gpu->synchronize();  // the uploads ran on the backend's stream; the GEMM runs on the legacy stream
      ASSERT_TRUE(cuda::cutlass_fp8_run(t, g, w.data(), wsb, nullptr)) << cuda::cutlass_tile_name(t) << " M=" << M;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      compare_bf16(std::string("cutlass ") + cuda::cutlass_tile_name(t), "e4m3 [512,2048] M=" + std::to_string(M),
                   downb(d), ref, 2e-3, 2e-2);
    }
  }
}

}  // namespace
}  // namespace dil::test
