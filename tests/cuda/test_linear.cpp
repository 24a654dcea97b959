// Parity of the dense projections at V4-Flash / V4.1-Flash shapes: FP8 128x128 with FP8
// activations (cuBLASLt block-scaled path), FP8 32x32 (V4.1, own kernel), FP8 dequantized
// (wo_a, grouped), FP4 experts with FP8 activations, BF16 and F32 (compressor, router, head).
// Tolerances: the SIMT kernel accumulates in double like the reference (bit-identical); the
// cuBLASLt paths are bounded as docs/kernels.md states.
#include <cstdlib>
#include <cstring>

#include "gemv_bound.h"

namespace dil::test {
namespace {

bool simt_only() { return forced("linear"); }

struct LinCase {
  Weight::Kind kind;
  int64_t out, in;
  int block;  // FP8 weight block
  int act;    // activation block (0: none)
  int64_t T;
  const char* what;
};

class CudaLinear : public CudaParity {
 protected:
  void run(const LinCase& c, uint32_t seed) {
    HostWeight hw = make_weight(c.kind, c.out, c.in, c.block, seed);
    Weight gw = dev_weight(hw);
    auto x = random_vec(size_t(c.T * c.in), seed + 7, 3.0f);
    std::vector<float> ref(size_t(c.T * c.out));
    cpu->linear(view(x, {c.T, c.in}), hw.wt, c.act, view(ref, {c.T, c.out}));
    Tensor go = poisoned(DType::F32, {c.T, c.out});
    gpu->linear(devf(x, {c.T, c.in}), gw, c.act, go);
    // Paths through cuBLASLt (unless DIL_CUDA_GEMM=simt): FP8 128x128 with act 128, BF16.
    const bool lt_fp8 = !simt_only() && c.kind == Weight::Kind::FP8 && c.block == 128 && c.act == 128;
    const bool lt_bf16 = !simt_only() && c.kind == Weight::Kind::BF16;
    // Other FP8 weights at >= 64 rows: dequantized to BF16, cuBLASLt BF16 (gemm.cu).
    const bool lt_deq = !simt_only() && c.kind == Weight::Kind::FP8 && !lt_fp8 && c.T >= 64 && c.act > 0;
    double rel = 0, abs = 0;
    std::string path = "simt";
    if (lt_fp8) {
      rel = 2e-3;  // FP8 tensor-core products, fp32 promotion per 128-block; bf16 output if Lt needs it
      abs = 2e-2;
      path = "cublasLt fp8";
    } else if (lt_deq) {
      // Exact BF16 weights and activations (QDQ'd); f32 accumulation over K: the BF16 path's
      // bound. Without activation quantization (reference numerics) the exact SIMT path runs.
      rel = 2e-5;
      abs = 1e-4;
      path = "cublasLt bf16 (fp8 dequant)";
    } else if (lt_bf16) {
      rel = 2e-5;  // x split into two bf16 terms: ~2^-17 per activation
      abs = 1e-4;
      path = "cublasLt bf16x2";
    }
    compare(std::string("linear ") + path, c.what, down<float>(go), ref, rel, abs);
  }
};

TEST_F(CudaLinear, V4Fp8BlockScaled) {
  using K = Weight::Kind;
  run({K::FP8, 1024, 4096, 128, 128, 17, "wq_a [1024,4096] T=17"}, 101);
  run({K::FP8, 1024, 4096, 128, 128, 1, "wq_a [1024,4096] T=1"}, 102);
  run({K::FP8, 4096, 8192, 128, 128, 17, "wo_b [4096,8192] T=17"}, 103);
  run({K::FP8, 512, 4096, 128, 128, 3, "wkv [512,4096] T=3"}, 104);
  run({K::FP8, 8192, 1024, 128, 128, 17, "idx wq_b [8192,1024] T=17"}, 105);
}

TEST_F(CudaLinear, V41Fp8Blocks32) {
  using K = Weight::Kind;
  run({K::FP8, 1280, 5120, 32, 32, 17, "v41 wq_a [1280,5120] T=17"}, 111);
  run({K::FP8, 512, 5120, 32, 32, 1, "v41 wkv [512,5120] T=1"}, 112);
  run({K::FP8, 5120, 2304, 32, 32, 5, "v41 shared w2 [5120,2304] T=5"}, 113);
  run({K::FP8, 1280, 5120, 32, 32, 100, "v41 wq_a [1280,5120] T=100"}, 114);
  run({K::FP8, 5120, 2304, 32, 32, 64, "v41 shared w2 [5120,2304] T=64"}, 115);
  run({K::FP8, 1024, 4096, 128, 0, 77, "fp8 dequantized, no act quant T=77"}, 116);
}

TEST_F(CudaLinear, Fp4ExpertsAndDequantizedFp8) {
  using K = Weight::Kind;
  run({K::FP4, 2048, 4096, 32, 128, 17, "v4 expert w1 [2048,4096] act128"}, 121);
  run({K::FP4, 4096, 2048, 32, 128, 1, "v4 expert w2 [4096,2048] T=1"}, 122);
  run({K::FP4, 2304, 5120, 32, 32, 7, "v41 expert w1 [2304,5120] act32"}, 123);
  run({K::FP8, 1024, 4096, 128, 0, 17, "fp8 dequantized, no act quant"}, 124);
}

TEST_F(CudaLinear, Bf16AndF32) {
  using K = Weight::Kind;
  run({K::BF16, 1024, 4096, 0, 0, 17, "compressor wkv [1024,4096] T=17"}, 131);
  run({K::BF16, 256, 4096, 0, 128, 1, "router [256,4096] T=1 (act ignored)"}, 132);
  run({K::BF16, 64, 4096, 0, 0, 17, "idx weights_proj [64,4096]"}, 133);
  run({K::BF16, 129280 / 8, 4096, 0, 0, 2, "head slice [16160,4096] T=2"}, 134);
  run({K::F32, 384, 5120, 0, 0, 17, "f32 [384,5120]"}, 135);
  run({K::BF16, 100, 72, 0, 0, 17, "odd [100,72]"}, 136);
}

// ---- Fast numerics: bf16 activations in, bf16 (or f32: compressor, router, head) out, the
// fast plan's paths. Each path's bound is the f32 path's (above) plus one bf16 ulp for a bf16
// output (parity.h compare_bf16), derived as follows:
// - simt: double accumulation of exact products, like the reference: bit-identical f32, hence
//   the same bf16 rounding (exact).
// - cublaslt_fp8: x QDQ'd to e4m3 per 128 (from bf16 now: the same values), the FP8 GEMM's
//   bound (rel 2e-3 / abs 2e-2); cuBLASLt rounds its f32 result to a bf16 D once.
// - cutlass_fp8 (bf16 in and out, >= 16 rows): the same quantization points as cublaslt_fp8
//   (x QDQ'd to e4m3 per 128 by the same kernel, the weight's e4m3 codes and power-of-two block
//   scales), the same 128-K promotion interval into an f32 accumulator and the same FP8 wgmma
//   inside each block; scaling by sa * sb is exact (powers of two). Only the order of the f32
//   block sums and the tensor core's in-block accumulation differ, both covered by the FP8
//   bound: rel 2e-3 / abs 2e-2 (test_cutlass.cpp derives it and checks the row edges).
// - cublaslt_bf16: bf16 x and a BF16 weight give exact products; the only error is cuBLASLt's
//   f32 accumulation, the same GEMM (shapes, K, algorithm family) as the split path above,
//   which meets rel 2e-5 / abs 1e-4 with its split error (2^-17 per activation) on top; so
//   2e-5 / 1e-4 bounds the pure BF16 GEMM a fortiori.
// - dequant_bf16_lt (V4.1 32x32 FP8, >= 64 rows): exact BF16 weight and QDQ'd activations, the
//   same accumulation: rel 2e-5 / abs 1e-4.
// - gemv (at most 8 rows): the per-element bound of gemv_bound.h (f32 accumulation depth).
struct FastCase {
  Weight::Kind kind;
  int64_t out, in;
  int block, act;
  int64_t T;
  DType odt;  // output dtype
  std::string what;
};

class CudaLinearFast : public GemvParity {
 protected:
  void run(const FastCase& c, uint32_t seed) {
    cpu->set_numerics(Numerics::Fast);
    gpu->set_numerics(Numerics::Fast);
    HostWeight hw = make_weight(c.kind, c.out, c.in, c.block, seed);
    Weight gw = dev_weight(hw);
    auto x = bf16_of(random_vec(size_t(c.T * c.in), seed + 7, 3.0f));
    const bool bf = c.odt == DType::BF16;
    std::vector<uint16_t> ref_b(size_t(c.T * c.out));
    std::vector<float> ref_f(size_t(c.T * c.out));
    cpu->linear(bview(x, {c.T, c.in}), hw.wt, c.act,
                bf ? bview(ref_b, {c.T, c.out}) : view(ref_f, {c.T, c.out}));
    Tensor go = poisoned(c.odt, {c.T, c.out});
    gpu->linear(devb(x, {c.T, c.in}), gw, c.act, go);
    const std::string impl =
        gpu->impl_for(linear_site(gw, c.act, DType::BF16, c.odt, Numerics::Fast), c.T).name;
    if (impl == "gemv") {
      compare_gemv(c.what, hw, c.act, x, c.T, c.odt, bf ? downb(go) : down<float>(go));
      return;
    }
    double rel = 0, abs = 0;
    if (impl == "cublaslt_fp8" || impl == "cutlass_fp8") {
      rel = 2e-3;
      abs = 2e-2;
    } else if (impl != "simt") {  // cublaslt_bf16, dequant_bf16_lt
      rel = 2e-5;
      abs = 1e-4;
    }
    const std::string op = "linear fast " + impl;
    if (bf) compare_bf16(op, c.what, downb(go), widen(ref_b), rel, abs);
    else compare(op, c.what, down<float>(go), ref_f, rel, abs);
  }
};

TEST_F(CudaLinearFast, V4Fp8BlockScaled) {
  using K = Weight::Kind;
  const DType B = DType::BF16, F = DType::F32;
  for (int64_t T : {1, 17, 127, 128, 129})
    run({K::FP8, 1024, 4096, 128, 128, T, B, "bf16 wq_a [1024,4096] T=" + std::to_string(T)}, 701 + uint32_t(T));
  run({K::FP8, 4096, 8192, 128, 128, 17, B, "bf16 wo_b [4096,8192] T=17"}, 711);
  run({K::FP8, 8192, 1024, 128, 128, 3, B, "bf16 idx wq_b [8192,1024] T=3"}, 712);
  run({K::FP8, 512, 4096, 128, 128, 17, F, "bf16->f32 wkv [512,4096] T=17"}, 713);
}

TEST_F(CudaLinearFast, V41Fp8Blocks32) {
  using K = Weight::Kind;
  const DType B = DType::BF16;
  run({K::FP8, 1280, 5120, 32, 32, 17, B, "bf16 v41 wq_a [1280,5120] T=17 (simt)"}, 721);
  run({K::FP8, 512, 5120, 32, 32, 1, B, "bf16 v41 wkv [512,5120] T=1 (simt)"}, 722);
  for (int64_t T : {64, 127, 128, 129})
    run({K::FP8, 1280, 5120, 32, 32, T, B, "bf16 v41 wq_a [1280,5120] T=" + std::to_string(T)}, 723 + uint32_t(T));
  run({K::FP8, 5120, 2304, 32, 32, 100, B, "bf16 v41 shared w2 [5120,2304] T=100"}, 724);
}

TEST_F(CudaLinearFast, Bf16WeightsFp4AndF32) {
  using K = Weight::Kind;
  const DType B = DType::BF16, F = DType::F32;
  run({K::BF16, 1024, 4096, 0, 0, 17, F, "bf16->f32 compressor wkv [1024,4096] T=17"}, 731);
  run({K::BF16, 256, 4096, 0, 128, 1, F, "bf16->f32 router [256,4096] T=1"}, 732);
  run({K::BF16, 64, 4096, 0, 0, 129, B, "bf16 idx weights_proj [64,4096] T=129"}, 733);
  run({K::BF16, 129280 / 8, 4096, 0, 0, 2, F, "bf16->f32 head slice [16160,4096] T=2"}, 734);
  run({K::BF16, 100, 72, 0, 0, 17, B, "bf16 odd [100,72] T=17"}, 735);
  run({K::BF16, 128, 512, 0, 0, 1, B, "bf16 v41 indexer.wk [128,512] T=1"}, 736);
  run({K::F32, 384, 5120, 0, 0, 17, F, "bf16->f32 f32 weight [384,5120] (simt)"}, 737);
  run({K::FP4, 2048, 4096, 32, 128, 7, B, "bf16 fp4 [2048,4096] act128 T=7 (simt)"}, 738);
}

// wo_a in fast numerics: bf16 inputs [T, 8, 4096] -> bf16 [T, 8, 1024]. Up to 8 rows the GEMV
// (test_gemv.cpp checks it); below 64 rows the exact SIMT kernel (bit-identical); from 64 rows one BF16 GEMM per group reading the strided bf16
// inputs in place (exact operands, f32 accumulation: the BF16 GEMM bound 2e-5 / 1e-4, + 1 ulp).
TEST_F(CudaParity, GroupedLinearWoAFast) {
  cpu->set_numerics(Numerics::Fast);
  gpu->set_numerics(Numerics::Fast);
  for (int blk : {128, 32}) {
    HostWeight hw = make_weight(Weight::Kind::FP8, 8192, 4096, blk, 750 + blk);
    Weight gw = dev_weight(hw);
    for (int64_t T : {1, 17, 64, 127, 128, 129}) {
      auto x = bf16_of(random_vec(size_t(T * 8 * 4096), 751 + uint32_t(T)));
      std::vector<uint16_t> ref(size_t(T * 8 * 1024));
      cpu->grouped_linear(bview(x, {T, 8, 4096}), hw.wt, 8, bview(ref, {T, 8, 1024}));
      Tensor go = poisoned(DType::BF16, {T, 8, 1024});
      gpu->grouped_linear(devb(x, {T, 8, 4096}), gw, 8, go);
      const std::string impl =
          gpu->impl_for(grouped_linear_site(gw, 8, DType::BF16, DType::BF16, Numerics::Fast), T).name;
      if (impl == "gemv") continue;  // at most 8 rows: bounded per group in test_gemv.cpp (GroupedWoA)
      const bool exact = impl == "simt";
      compare_bf16("grouped_linear fast " + impl, "wo_a blk " + std::to_string(blk) + " G=8 T=" + std::to_string(T),
                   downb(go), widen(ref), exact ? 0 : 2e-5, exact ? 0 : 1e-4);
      if (impl != "dequant_bf16_lt" || forced("grouped_linear")) continue;
      // With the plan installed before the weight is adopted (as the loader does), the backend
      // keeps a BF16 copy of wo_a made at load, which dequant_bf16_lt reads instead of
      // dequantizing per call: the same BF16 values and the same GEMM, so the same output bit for
      // bit; and the copy is resident (its out x in x 2 bytes in use after the adopt).
      auto planned = make_backend(BackendKind::CUDA, 0, test_options());
      planned->install_plan(planned->make_plan(
          {grouped_linear_site(hw.wt, 8, DType::BF16, DType::BF16, Numerics::Fast)}, Numerics::Fast));
      const size_t before = planned->memory_info().in_use;
      const Weight pw = planned->adopt_weight(hw.wt);
      const size_t grew = planned->memory_info().in_use - before;
      EXPECT_GE(grew, size_t(8192) * 4096 * 3) << "wo_a blk " << blk << ": no BF16 copy next to the FP8 weight";
      const Tensor px = devb(x, {T, 8, 4096});
      gpu->synchronize();  // px was uploaded on the fixture backend's stream
      Buffer pob = planned->alloc(size_t(T * 8 * 1024) * 2);
      Tensor po(pob.data(), DType::BF16, {T, 8, 1024}, Device::CUDA);
      planned->grouped_linear(px, pw, 8, po);
      std::vector<uint16_t> got(size_t(T * 8 * 1024));
      planned->download(got.data(), po);
      EXPECT_EQ(got, down<uint16_t>(go)) << "wo_a blk " << blk << " T=" << T
                                         << ": the BF16 copy's GEMM differs from the per-call dequantization";
      std::printf("PARITY | grouped_linear fast dequant_bf16_lt | wo_a blk %d T=%lld from the load-time BF16 copy "
                  "(%zu bytes): %s\n", blk, static_cast<long long>(T), grew,
                  got == down<uint16_t>(go) ? "bit-identical" : "DIFFERS");
    }
  }
}

TEST_F(CudaParity, GroupedLinearWoA) {
  // wo_a: x [T, 8, 4096] -> [T, 8, 1024], FP8 weight dequantized, no activation quant.
  for (int64_t T : {1, 17}) {
    HostWeight hw = make_weight(Weight::Kind::FP8, 8192, 4096, 128, 141);
    Weight gw = dev_weight(hw);
    auto x = random_vec(size_t(T * 8 * 4096), 142);
    std::vector<float> ref(size_t(T * 8 * 1024));
    cpu->grouped_linear(view(x, {T, 8, 4096}), hw.wt, 8, view(ref, {T, 8, 1024}));
    Tensor go = poisoned(DType::F32, {T, 8, 1024});
    gpu->grouped_linear(devf(x, {T, 8, 4096}), gw, 8, go);
    compare("grouped_linear simt", "wo_a [8192,4096] G=8 T=" + std::to_string(T), down<float>(go), ref, 0, 0);
  }
  // V4.1 wo_a carries 32x32 blocks.
  HostWeight hw = make_weight(Weight::Kind::FP8, 8192, 4096, 32, 143);
  Weight gw = dev_weight(hw);
  auto x = random_vec(size_t(3 * 8 * 4096), 144);
  std::vector<float> ref(size_t(3 * 8 * 1024));
  cpu->grouped_linear(view(x, {3, 8, 4096}), hw.wt, 8, view(ref, {3, 8, 1024}));
  Tensor go = poisoned(DType::F32, {3, 8, 1024});
  gpu->grouped_linear(devf(x, {3, 8, 4096}), gw, 8, go);
  compare("grouped_linear simt", "v41 wo_a 32x32 G=8 T=3", down<float>(go), ref, 0, 0);
  // Prefill sizes: dequantized to BF16, x split in two BF16 terms (the BF16 path's bound).
  for (int blk : {128, 32}) {
    const int64_t T = 100;
    HostWeight hp = make_weight(Weight::Kind::FP8, 8192, 4096, blk, 145 + blk);
    Weight gp = dev_weight(hp);
    auto xp = random_vec(size_t(T * 8 * 4096), 146);
    std::vector<float> rp(size_t(T * 8 * 1024));
    cpu->grouped_linear(view(xp, {T, 8, 4096}), hp.wt, 8, view(rp, {T, 8, 1024}));
    Tensor gop = poisoned(DType::F32, {T, 8, 1024});
    gpu->set_numerics(Numerics::Official);  // the plan's split path is official numerics' own
    gpu->grouped_linear(devf(xp, {T, 8, 4096}), gp, 8, gop);
    gpu->set_numerics(Numerics::Reference);
    const bool lt = !forced("grouped_linear");
    compare(lt ? "grouped_linear bf16x2 (fp8 dequant)" : "grouped_linear simt",
            "wo_a [8192,4096] blk " + std::to_string(blk) + " G=8 T=100", down<float>(gop), rp, lt ? 2e-5 : 0,
            lt ? 1e-4 : 0);
    // Reference numerics: the exact SIMT path at every size.
    Tensor gex = poisoned(DType::F32, {T, 8, 1024});
    gpu->grouped_linear(devf(xp, {T, 8, 4096}), gp, 8, gex);
    compare("grouped_linear simt", "wo_a [8192,4096] blk " + std::to_string(blk) + " G=8 T=100 exact", down<float>(gex),
            rp, 0, 0);
  }
}

}  // namespace
}  // namespace dil::test
