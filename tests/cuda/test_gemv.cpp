// Parity of linear's fast-numerics GEMVs (`gemv`, the plan's choice below 256 MB weights, and
// `gemv_stream`, forced on a second backend: gemv_fast.cuh, T <= 8 rows, bf16 activations, BF16 /
// FP8 128x128 / FP8 32x32 / FP4 weights) with the CPU's fast linear (double sums rounded once),
// element by element under the bound derived in gemv_bound.h, at the models' shapes and awkward
// ones (K not a multiple of the 2 x 32-chunk step, N not a multiple of the 32-row CTA nor of a
// stream stage's rows, chunk counts below one per lane, T = 1, 3, 8, and T = 16 where the plan
// switches to another kernel).
#include "gemv_bound.h"

namespace dil::test {
namespace {

struct GvCase {
  Weight::Kind kind;
  int64_t out, in;
  int block, act;
  int64_t T;
  DType odt;
  std::string what;
};

class CudaGemv : public GemvParity {
 protected:
  void SetUp() override {
    GemvParity::SetUp();
    if (IsSkipped()) return;
    BackendOptions o = test_options();
    o.force["linear"] = "gemv_stream";
    stream = make_backend(BackendKind::CUDA, 0, o);
    stream->set_numerics(Numerics::Fast);
  }
  std::unique_ptr<Backend> stream;  // gemv_stream forced (the plan takes it for >= 256 MB weights)

  void run(const GvCase& c, uint32_t seed) {
    gpu->set_numerics(Numerics::Fast);
    HostWeight hw = make_weight(c.kind, c.out, c.in, c.block, seed);
    Weight gw = dev_weight(hw);
    auto x = bf16_of(random_vec(size_t(c.T * c.in), seed + 7, 3.0f));
    Tensor go = poisoned(c.odt, {c.T, c.out});
    gpu->linear(devb(x, {c.T, c.in}), gw, c.act, go);
    const std::string impl = gpu->impl_for(linear_site(gw, c.act, DType::BF16, c.odt, Numerics::Fast), c.T).name;
    const std::vector<float> got = c.odt == DType::BF16 ? downb(go) : down<float>(go);
    // The plan's GEMV regime: 1 row where cuBLASLt takes the weight (FP8 128x128 with act 128,
    // BF16; registry.cpp lt_takes), else up to 8.
    using WK = Weight::Kind;
    const bool lt = (c.kind == WK::FP8 && c.block == 128 && c.act == 128 && c.out % 128 == 0 && c.in % 128 == 0) ||
                    (c.kind == WK::BF16 && c.out % 8 == 0 && c.in % 8 == 0);
    if (c.T <= (lt ? 1 : 8)) {
      EXPECT_EQ(impl, "gemv") << c.what;
      compare_gemv(c.what, hw, c.act, x, c.T, c.odt, got);
      // The streaming GEMV on the same inputs, under the same bound.
      Tensor bo = poisoned(c.odt, {c.T, c.out});
      const Tensor xb = devb(x, {c.T, c.in});
      gpu->synchronize();  // stream runs on its own CUDA stream
      stream->linear(xb, gw, c.act, bo);
      stream->synchronize();
      EXPECT_EQ(stream->impl_for(linear_site(gw, c.act, DType::BF16, c.odt, Numerics::Fast), c.T).name, "gemv_stream");
      compare_gemv(c.what + " (gemv_stream)", hw, c.act, x, c.T, c.odt,
                   c.odt == DType::BF16 ? downb(bo) : down<float>(bo));
      return;
    }
    // Above the GEMV's rows the plan's next regime runs (its bound: test_linear.cpp); here only that.
    EXPECT_NE(impl, "gemv") << c.what;
    size_t nonfinite = 0;
    for (float v : got) nonfinite += !std::isfinite(v);
    EXPECT_EQ(nonfinite, 0u) << c.what;
    std::printf("PARITY | %-22s | %-34s | ran (the plan's regime above the GEMV's rows) | %s\n",
                ("linear fast " + impl).c_str(),
                c.what.c_str(), nonfinite == 0 ? "ok" : "FAIL");
  }
};

using K = Weight::Kind;
const DType B = DType::BF16, F = DType::F32;

TEST_F(CudaGemv, V4Fp8Blocks128) {
  for (int64_t T : {1, 3, 8})
    run({K::FP8, 1024, 4096, 128, 128, T, B, "v4 wq_a [1024,4096] T=" + std::to_string(T)}, 1101 + uint32_t(T));
  run({K::FP8, 4096, 8192, 128, 128, 1, B, "v4 wo_b [4096,8192] T=1"}, 1111);
  run({K::FP8, 4096, 8192, 128, 128, 8, B, "v4 wo_b [4096,8192] T=8 (128 KB smem)"}, 1112);
  run({K::FP8, 32768, 1024, 128, 128, 2, B, "v4 wq_b [32768,1024] T=2"}, 1113);
  run({K::FP8, 512, 4096, 128, 128, 3, B, "v4 wkv [512,4096] T=3 (K slices)"}, 1114);
  run({K::FP8, 1024, 4096, 128, 128, 16, B, "v4 wq_a [1024,4096] T=16 (not gemv)"}, 1115);
}

TEST_F(CudaGemv, V41Fp8Blocks32) {
  for (int64_t T : {1, 3, 8})
    run({K::FP8, 1280, 5120, 32, 32, T, B, "v41 wq_a [1280,5120] T=" + std::to_string(T)}, 1121 + uint32_t(T));
  run({K::FP8, 512, 5120, 32, 32, 1, B, "v41 wkv [512,5120] T=1"}, 1131);
  run({K::FP8, 5120, 2304, 32, 32, 5, B, "v41 shared w2 [5120,2304] T=5"}, 1132);
  run({K::FP8, 1280, 5120, 32, 32, 16, B, "v41 wq_a [1280,5120] T=16 (not gemv)"}, 1133);
}

TEST_F(CudaGemv, Fp4AndBf16) {
  run({K::FP4, 2048, 4096, 32, 128, 1, B, "fp4 expert w1 [2048,4096] T=1"}, 1141);
  run({K::FP4, 2048, 4096, 32, 128, 7, B, "fp4 expert w1 [2048,4096] T=7"}, 1142);
  run({K::FP4, 4096, 2048, 32, 128, 2, B, "fp4 expert w2 [4096,2048] T=2"}, 1143);
  run({K::FP4, 2304, 5120, 32, 32, 1, B, "fp4 v41 expert w1 [2304,5120] T=1"}, 1144);
  run({K::BF16, 129280 / 8, 4096, 0, 0, 1, F, "bf16->f32 head slice [16160,4096] T=1"}, 1151);
  run({K::BF16, 129280 / 8, 4096, 0, 0, 5, F, "bf16->f32 head slice [16160,4096] T=5"}, 1152);
  run({K::BF16, 1024, 4096, 0, 0, 8, F, "bf16->f32 compressor wkv [1024,4096] T=8"}, 1153);
  run({K::BF16, 64, 4096, 0, 0, 3, B, "bf16 idx weights_proj [64,4096] T=3"}, 1154);
  run({K::BF16, 128, 512, 0, 0, 1, B, "bf16 v41 indexer.wk [128,512] T=1"}, 1155);
}

// N not a multiple of the CTA's rows (32, or 4 per K slice) nor of the 128-row scale block; K not
// a multiple of the 64-chunk lane step; fewer chunks than lanes.
TEST_F(CudaGemv, AwkwardShapes) {
  run({K::BF16, 100, 96, 0, 0, 3, B, "bf16 [100,96] T=3 (12 chunks)"}, 1161);
  run({K::BF16, 1003, 4128, 0, 0, 1, F, "bf16 [1003,4128] T=1 (516 chunks)"}, 1162);
  run({K::FP8, 1031, 4256, 32, 32, 3, B, "fp8-32 [1031,4256] T=3"}, 1163);
  run({K::FP8, 1031, 4256, 128, 128, 8, B, "fp8-128 [1031,4256] T=8 (ragged blocks)"}, 1164);
  run({K::FP4, 37, 2080, 32, 128, 1, B, "fp4 [37,2080] T=1 (65 chunks)"}, 1165);
  run({K::FP4, 333, 288, 32, 32, 6, F, "fp4 [333,288] T=6 (9 chunks)"}, 1166);
}

// grouped_linear (wo_a: FP8 [8192 x 4096], 128x128 V4 and 32x32 V4.1 blocks, G = 8, no
// activation quantization) at decode sizes: one GEMV per group, each group's output checked as
// the linear of its weight rows under the same bound.
TEST_F(CudaGemv, GroupedWoA) {
  gpu->set_numerics(Numerics::Fast);
  const int64_t G = 8, N = 1024, Kd = 4096;
  for (int blk : {128, 32}) {
    HostWeight hw = make_weight(Weight::Kind::FP8, G * N, Kd, blk, 1170 + uint32_t(blk));
    Weight gw = dev_weight(hw);
    for (int64_t T : {1, 3, 8}) {
      auto x = bf16_of(random_vec(size_t(T * G * Kd), 1171 + uint32_t(T)));
      Tensor go = poisoned(DType::BF16, {T, G, N});
      gpu->grouped_linear(devb(x, {T, G, Kd}), gw, int(G), go);
      EXPECT_EQ(gpu->impl_for(grouped_linear_site(gw, int(G), DType::BF16, DType::BF16, Numerics::Fast), T).name, "gemv");
      const std::vector<float> got = downb(go);
      for (int64_t g = 0; g < G; ++g) {
        std::vector<uint16_t> xg(size_t(T * Kd));
        std::vector<float> og(size_t(T * N));
        for (int64_t t = 0; t < T; ++t) {
          std::copy_n(x.begin() + (t * G + g) * Kd, Kd, xg.begin() + t * Kd);
          std::copy_n(got.begin() + (t * G + g) * N, N, og.begin() + t * N);
        }
        if (g == 0 || g == G - 1)  // two groups per case: the first and the last rows of the weight
          compare_gemv("wo_a blk " + std::to_string(blk) + " T=" + std::to_string(T) + " group " + std::to_string(g),
                       row_slice(hw, g * N, N), 0, xg, T, DType::BF16, og);
      }
    }
  }
}

}  // namespace
}  // namespace dil::test
