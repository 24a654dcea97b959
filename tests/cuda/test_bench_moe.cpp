// Routed-expert benchmarks at the real shapes (issue 17; not tests: DISABLED_ unless asked for
// with --gtest_also_run_disabled_tests): every expert its own device copy of FP4 weights (so the
// weights stream from HBM as in the model), routing that gives each expert exactly `per` rows,
// bf16 tokens, fast numerics. The plan's implementation (wgmma at prefill sizes, gemv at decode
// sizes) and the BF16 mma.sync kernel (`mma_bf16`, forced) in the same run, CUDA events around
// back-to-back calls. Peers (torch._scaled_grouped_mm FP8 rowwise, cuBLASLt FP8 through
// torch._scaled_mm) on the same shapes: bench/moe_peer.py, same job in scripts/gpu-check.
// FLOPs: 2 x rows x 3 x D x I (useful rows only); bytes: the active experts' FP4 weights and
// scales, the tokens read once and the output written once.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "parity.h"

namespace dil::test {
namespace {

struct MoeShape {
  const char* what;
  int64_t D, I, E, T;  // model dims, experts held, tokens (k = 6 slots each)
  int act;
};

class CudaBenchMoe : public CudaParity {
 protected:
  void bench(const MoeShape& s, const std::vector<std::string>& impls) {
    // DIL_BENCH_MOE=substring: only the shapes whose label holds it.
    if (const char* only = std::getenv("DIL_BENCH_MOE"); only && !std::strstr(s.what, only)) return;
    const int k = 6;
    const int64_t T = s.T, pairs = T * k, active = std::min(s.E, pairs);
    // Token t's slots: experts (t*k + i) mod E, distinct for E >= k, rows spread evenly.
    std::vector<int32_t> idx(size_t(T * k));
    for (int64_t p = 0; p < T * k; ++p) idx[size_t(p)] = int32_t(p % s.E);
    const int sets = 4;
    std::vector<HostWeight> h1, h2, h3;
    for (int i = 0; i < sets; ++i) {
      h1.push_back(make_weight(Weight::Kind::FP4, s.I, s.D, 32, 1100 + 3 * i));
      h2.push_back(make_weight(Weight::Kind::FP4, s.D, s.I, 32, 1101 + 3 * i));
      h3.push_back(make_weight(Weight::Kind::FP4, s.I, s.D, 32, 1102 + 3 * i));
    }
    const auto x = bf16_of(random_vec(size_t(T * s.D), 1120, 2.0f));
    const auto rw = random_vec(size_t(T * k), 1121, 1.0f);
    for (const std::string& impl : impls) {
      bufs.clear();
      BackendOptions o = test_options();
      if (!impl.empty()) o.force["moe_experts"] = impl;
      gpu = make_backend(BackendKind::CUDA, 0, o);
      gpu->set_numerics(Numerics::Fast);
      std::vector<Weight> g1, g2, g3;  // one device copy per expert
      for (int64_t e = 0; e < s.E; ++e) {
        g1.push_back(dev_weight(h1[size_t(e % sets)]));
        g2.push_back(dev_weight(h2[size_t(e % sets)]));
        g3.push_back(dev_weight(h3[size_t(e % sets)]));
      }
      MoeExpertsArgs a;
      a.x = devb(x, {T, s.D});
      a.w1 = &g1;
      a.w2 = &g2;
      a.w3 = &g3;
      a.route_w = devf(rw, {T, k});
      a.route_idx = devi(idx, {T, int64_t(k)});
      a.act_block = s.act;
      a.swiglu_limit = 10.0f;
      a.round_bf16 = true;
      a.out = poisoned(DType::BF16, {T, s.D});
      const std::string ran =
          gpu->impl_for(moe_experts_site(g1[0], s.act, DType::BF16, DType::BF16, Numerics::Fast), T).name;
      const double ms = event_ms_per_call(*gpu, [&](int) { gpu->moe_experts(a); }, 10);
      const double flops = 2.0 * double(pairs) * 3 * s.D * s.I;
      const double bytes = double(active) * 3 * (s.D * s.I / 2 + s.D * s.I / 32) + 4.0 * T * s.D;
      std::printf("BENCH | moe_experts %-14s | %-34s | %9.3f ms | %8.1f TFLOP/s | %8.1f GB/s\n", ran.c_str(), s.what,
                  ms, flops / ms * 1e-9, bytes / ms * 1e-6);
      std::fflush(stdout);
    }
  }
};

TEST_F(CudaBenchMoe, DISABLED_Prefill) {
  const std::vector<std::string> impls = {"", "mma_bf16"};
  // Rows per expert = 6 T / E: 256, 64, 256, 192, 96, 32.
  for (const MoeShape& s : {MoeShape{"v41 E96 x 256 (EP4) act32", 5120, 2304, 96, 4096, 32},
                            MoeShape{"v41 E384 x 64 (EP1) act32", 5120, 2304, 384, 4096, 32},
                            MoeShape{"v4 E96 x 256 act128", 4096, 2048, 96, 4096, 128},
                            MoeShape{"v4 E128 x 192 (EP2) act128", 4096, 2048, 128, 4096, 128},
                            MoeShape{"v4 E256 x 96 (EP1) act128", 4096, 2048, 256, 4096, 128},
                            MoeShape{"v4 E256 x 32 act128", 4096, 2048, 256, 4096 / 3, 128}})
    bench(s, impls);
}

// Decode: 64 tokens x 6 slots over all experts (the gemv regime), weight streaming rate.
TEST_F(CudaBenchMoe, DISABLED_Decode) {
  bench(MoeShape{"v4 decode T=64 E256 act128", 4096, 2048, 256, 64, 128}, {"gemv_fp8", "gemv"});
  bench(MoeShape{"v41 decode T=64 E384 act32", 5120, 2304, 384, 64, 32}, {"gemv_fp8", "gemv"});
}

}  // namespace
}  // namespace dil::test
