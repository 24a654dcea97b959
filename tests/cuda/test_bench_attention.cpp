// Timings of the fast-numerics sparse attention at the V4-Flash / V4.1-Flash shapes (64 heads x
// 512, window 128), wgmma_bf16 (attention_wgmma.cu) and flash_bf16 (attention_flash.cu) against mma_bf16
// (attention_mma.cu) in the same run. Not tests: DISABLED_ unless asked for with
// --gtest_also_run_disabled_tests (scripts/gpu-check runs every DISABLED_ test):
//   build/tests/cuda/test_cuda --gtest_also_run_disabled_tests --gtest_filter='CudaAttnBench.*'
// Host clock around synchronize(), median of repeated runs after two warm-ups; inputs random
// bf16, every pick visible. FLOPs = 4 H d x (valid rows summed over the tokens): q.k^T and P.V.
#include <algorithm>
#include <chrono>
#include <functional>

#include "parity.h"

namespace dil::test {
namespace {

class CudaAttnBench : public CudaParity {
 protected:
  struct Shape {
    const char* what;
    std::vector<SeqSpec> seqs;  // blocks filled in
    int ratio;                  // 0: SWA only
    bool with_idx;              // 512 picks per token
  };

  void bench(Shape sh, uint32_t seed) {
    const int64_t H = 64, D = 512, W = 128, K = 512;
    const int rpb = sh.ratio ? 128 / sh.ratio : 0;
    int base = 0;
    for (auto& s : sh.seqs) {
      if (!sh.ratio) continue;
      const int nb = std::max(1, ((s.start_pos + s.len) / sh.ratio + rpb - 1) / rpb);
      s.blocks = block_list(nb, base, seed + uint32_t(base));
      base += nb;
    }
    StepMeta m = make_meta(sh.seqs);
    const int64_t T = m.n_tokens, S = m.n_seqs, NB = std::max(base, 1);
    std::vector<int32_t> idx;
    double rows = 0;  // valid rows summed over the tokens
    if (sh.with_idx) idx.resize(size_t(T * K));
    for (int64_t t = 0; t < T; ++t) {
      const int p = m.h_tok_pos[size_t(t)], vis = sh.ratio ? (p + 1) / sh.ratio : 0;
      rows += std::min<int>(p + 1, int(W));
      if (!sh.ratio) continue;
      if (!sh.with_idx) {
        rows += vis;
        continue;
      }
      for (int64_t k = 0; k < K; ++k) idx[size_t(t * K + k)] = int32_t((k * 7919 + t * 31) % vis);  // spread, may repeat
      rows += K;
    }
    upload_meta(m);
    AttnArgs a;
    a.q = devb(rnd_bf16(size_t(T * H * D), seed + 1), {T, H, D});
    a.kv_new = devb(rnd_bf16(size_t(T * D), seed + 2), {T, D});
    a.ring = devb(rnd_bf16(size_t(S * W * D), seed + 3), {S, W, D});
    if (sh.ratio) a.comp = devb(rnd_bf16(size_t(NB * rpb * D), seed + 4), {NB, int64_t(rpb), D});
    a.comp_ratio = sh.ratio;
    a.rows_per_block = rpb;
    if (sh.with_idx) a.comp_idx = devi(idx, {T, K});
    a.sink = devf(random_vec(size_t(H), seed + 5), {H});
    a.scale = 1.0f / std::sqrt(float(D));
    a.window = int(W);
    a.out = poisoned(DType::BF16, {T, H, D});
    const double flops = 4.0 * double(H * D) * rows;
    double base_ms = 0;
    for (const char* impl : {"mma_bf16", "flash_bf16", "wgmma_bf16"}) {
      BackendOptions o = test_options();
      o.force["sparse_attention"] = impl;
      auto be = make_backend(BackendKind::CUDA, 0, o);
      be->set_numerics(Numerics::Fast);
      gpu->synchronize();  // the inputs, uploaded on the fixture's stream
      // Timed on be's own stream: waiting for the fixture's backend instead timed the launches only.
      const double ms = median_wall_ms(*be, [&] { be->sparse_attention(a, m); }, T >= 1024 ? 10 : 50);
      if (!base_ms) base_ms = ms;
      std::printf("BENCH | sparse_attention %-10s | %-40s | %9.3f ms | %8.2f TFLOP/s | %.2fx mma_bf16\n", impl,
                  sh.what, ms, flops / ms * 1e-9, base_ms / ms);
      std::fflush(stdout);
    }
  }
};

std::vector<SeqSpec> decode_batch(int n, int pos) {
  std::vector<SeqSpec> s;
  for (int i = 0; i < n; ++i) s.push_back({pos + 17 * i, 1, i, {}});
  return s;
}

TEST_F(CudaAttnBench, DISABLED_Prefill4096) {
  bench({"v4 csa T=4096@65536 128+512 rows", {{65536, 4096, 0, {}}}, 4, true}, 1001);
  bench({"v4 hca T=4096@131072 128+~1040 rows", {{131072, 4096, 0, {}}}, 128, false}, 1002);
  bench({"v4 swa T=4096@65536 128 rows", {{65536, 4096, 0, {}}}, 0, false}, 1003);
  bench({"v41 m2 T=4096@65536 128+512 rows", {{65536, 4096, 0, {}}}, 2, true}, 1004);
}

TEST_F(CudaAttnBench, DISABLED_Decode) {
  bench({"v4 csa decode b64 x 640 rows", decode_batch(64, 16384), 4, true}, 1011);
  bench({"v4 csa decode b1 x 640 rows", decode_batch(1, 16384), 4, true}, 1012);
  bench({"v4 hca decode b64 x 128+1024 rows", decode_batch(64, 131072), 128, false}, 1013);
}

}  // namespace
}  // namespace dil::test
