// Timings of the first CUDA versions at real shapes (not tests: DISABLED_ unless asked for
// with --gtest_also_run_disabled_tests; scripts/gpu-check runs them). Host clock around
// synchronize(), median of repeated runs after a warm-up; inputs random, never zeros.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>

#include "parity.h"

namespace dil::test {
namespace {

class CudaBench : public CudaParity {
 protected:
  double time_ms(const std::function<void()>& fn, int reps = 10) { return median_wall_ms(*gpu, fn, reps); }
  void report(const std::string& op, const std::string& shape, double ms, double flops, double bytes) {
    std::printf("BENCH | %-26s | %-34s | %9.3f ms | %8.2f TFLOP/s | %8.1f GB/s\n", op.c_str(), shape.c_str(), ms,
                flops / ms * 1e-9, bytes / ms * 1e-6);
    std::fflush(stdout);
  }
};

TEST_F(CudaBench, DISABLED_Gemms) {
  struct C { Weight::Kind k; int64_t out, in; int block, act; int64_t T; const char* what; };
  for (C c : {C{Weight::Kind::FP8, 32768, 1024, 128, 128, 1, "wq_b fp8 T=1"},
              C{Weight::Kind::FP8, 32768, 1024, 128, 128, 512, "wq_b fp8 T=512"},
              C{Weight::Kind::FP8, 4096, 8192, 128, 128, 512, "wo_b fp8 T=512"},
              C{Weight::Kind::FP8, 1280, 5120, 32, 32, 1, "v41 wq_a fp8-32 T=1 (gemv)"},
              C{Weight::Kind::FP8, 1280, 5120, 32, 32, 64, "v41 wq_a fp8-32 T=64 (simt)"},
              C{Weight::Kind::FP4, 2048, 4096, 32, 128, 1, "expert w1 fp4 T=1 (gemv)"},
              C{Weight::Kind::BF16, 1024, 4096, 0, 0, 512, "compressor bf16 T=512"},
              C{Weight::Kind::BF16, 129280, 4096, 0, 0, 1, "head bf16 T=1"}}) {
    HostWeight hw = make_weight(c.k, c.out, c.in, c.block, 900);
    Weight gw = dev_weight(hw);
    Tensor x = devf(random_vec(size_t(c.T * c.in), 901), {c.T, c.in});
    Tensor o = poisoned(DType::F32, {c.T, c.out});
    double ms = time_ms([&] { gpu->linear(x, gw, c.act, o); });
    double wbytes = double(hw.w.size() + hw.scale.size());
    report("linear", c.what, ms, 2.0 * c.T * c.out * c.in, wbytes + 4.0 * c.T * (c.in + c.out));
  }
}

TEST_F(CudaBench, DISABLED_MoeAttentionIndexer) {
  // MoE: V4 shapes, 256 experts (8 distinct weight sets), top-6.
  const int64_t D = 4096, I = 2048, E = 256;
  std::vector<HostWeight> s1, s2, s3;
  std::vector<Weight> d1, d2, d3, g1, g2, g3;
  for (int i = 0; i < 8; ++i) {
    s1.push_back(make_weight(Weight::Kind::FP4, I, D, 32, 910 + i));
    s2.push_back(make_weight(Weight::Kind::FP4, D, I, 32, 920 + i));
    s3.push_back(make_weight(Weight::Kind::FP4, I, D, 32, 930 + i));
    d1.push_back(dev_weight(s1.back()));
    d2.push_back(dev_weight(s2.back()));
    d3.push_back(dev_weight(s3.back()));
  }
  for (int64_t e = 0; e < E; ++e) {
    g1.push_back(d1[e % 8]);
    g2.push_back(d2[e % 8]);
    g3.push_back(d3[e % 8]);
  }
  for (int64_t T : {1, 64, 512}) {
    auto idx = rnd_int(size_t(T * 6), 940, 0, int(E - 1));
    MoeExpertsArgs a;
    a.x = devf(random_vec(size_t(T * D), 941), {T, D});
    a.w1 = &g1;
    a.w2 = &g2;
    a.w3 = &g3;
    a.route_w = devf(random_vec(size_t(T * 6), 942), {T, 6});
    a.route_idx = devi(idx, {T, 6});
    a.act_block = 128;
    a.out = poisoned(DType::F32, {T, D});
    double ms = time_ms([&] { gpu->moe_experts(a); }, 5);
    report("moe_experts fp4", "v4 E256 k6 T=" + std::to_string(T), ms, 2.0 * T * 6 * 3 * D * I, 0);
  }
  // Attention: CSA decode/prefill tokens at position ~64K, 128 window + 512 picks, 64 heads.
  for (int64_t T : {1, 64}) {
    const int64_t H = 64, d = 512, rpb = 32, NB = 520;
    StepMeta m = make_meta({{65536, int(T), 0, block_list(int(NB), 0, 950)}});
    upload_meta(m);
    std::vector<int32_t> idx(size_t(T * 512));
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = int32_t((i * 37) % 16384);
    AttnArgs a;
    a.q = devf(random_vec(size_t(T * H * d), 951), {T, H, d});
    a.kv_new = devf(random_vec(size_t(T * d), 952), {T, d});
    a.ring = devf(random_vec(size_t(1 * 128 * d), 953), {1, 128, d});
    a.comp = devf(random_vec(size_t(NB * rpb * d), 954), {NB, rpb, d});
    a.comp_ratio = 4;
    a.rows_per_block = int(rpb);
    a.comp_idx = devi(idx, {T, 512});
    a.sink = devf(random_vec(size_t(H), 955), {H});
    a.scale = 0.044f;
    a.out = poisoned(DType::F32, {T, H, d});
    double ms = time_ms([&] { gpu->sparse_attention(a, m); });
    report("sparse_attention", "csa 640 rows 64x512 T=" + std::to_string(T), ms, 4.0 * T * H * 640 * d, 0);
  }
  // Indexer: 64K compressed rows, 64 heads x 128.
  for (int64_t T : {1, 16}) {
    const int64_t Hi = 64, di = 128, rpb = 32, NB = 2049;
    StepMeta m = make_meta({{262140 - int(T) + 1, int(T), 0, block_list(int(NB), 0, 960)}});
    upload_meta(m);
    IndexerArgs a;
    a.q = devf(random_vec(size_t(T * Hi * di), 961), {T, Hi, di});
    a.w = devf(random_vec(size_t(T * Hi), 962), {T, Hi});
    a.keys = devf(random_vec(size_t(NB * rpb * di), 963), {NB, rpb, di});
    a.ratio = 4;
    a.rows_per_block = int(rpb);
    a.topk = 512;
    a.out_idx = poisoned(DType::I32, {T, 512});
    double ms = time_ms([&] { gpu->indexer_topk(a, m); }, 5);
    report("indexer_topk", "65535 rows Hi64 T=" + std::to_string(T), ms, 2.0 * T * 65535 * Hi * di, 0);
  }
}

// Routed experts at the V4.1-Flash prefill shape (T=4096, E=384 top-6, D=5120, I=2304, FP4
// weights, act_block 32): the tensor-core path (default) and the SIMT kernels (forced).
// 16 distinct weight sets (expert e uses set e % 16); routing uniformly random.
TEST_F(CudaBench, DISABLED_MoeExpertsPrefill) {
  const int64_t T = 4096, D = 5120, I = 2304, E = 384;
  const int k = 6, sets = 16;
  std::vector<HostWeight> s1, s2, s3;
  for (int i = 0; i < sets; ++i) {
    s1.push_back(make_weight(Weight::Kind::FP4, I, D, 32, 970 + 3 * i));
    s2.push_back(make_weight(Weight::Kind::FP4, D, I, 32, 971 + 3 * i));
    s3.push_back(make_weight(Weight::Kind::FP4, I, D, 32, 972 + 3 * i));
  }
  const auto x = random_vec(size_t(T * D), 1020), rw = random_vec(size_t(T * k), 1021);
  const auto idx = rnd_int(size_t(T * k), 1022, 0, int(E - 1));
  for (bool simt : {false, true}) {
    if (simt) {  // a fresh backend with the SIMT kernels forced; the previous one's buffers go first
      bufs.clear();
      BackendOptions o = test_options();
      o.force["moe_experts"] = "simt";
      gpu = make_backend(BackendKind::CUDA, 0, o);
    }
    std::vector<Weight> d1, d2, d3, g1, g2, g3;
    for (int i = 0; i < sets; ++i) {
      d1.push_back(dev_weight(s1[i]));
      d2.push_back(dev_weight(s2[i]));
      d3.push_back(dev_weight(s3[i]));
    }
    for (int64_t e = 0; e < E; ++e) {
      g1.push_back(d1[e % sets]);
      g2.push_back(d2[e % sets]);
      g3.push_back(d3[e % sets]);
    }
    MoeExpertsArgs a;
    a.x = devf(x, {T, D});
    a.w1 = &g1;
    a.w2 = &g2;
    a.w3 = &g3;
    a.route_w = devf(rw, {T, k});
    a.route_idx = devi(idx, {T, k});
    a.act_block = 32;
    a.swiglu_limit = 10.0f;
    a.out = poisoned(DType::F32, {T, D});
    double ms = time_ms([&] { gpu->moe_experts(a); }, simt ? 3 : 10);
    double wbytes = double(E) * 3 * (D * I / 2 + D * I / 32);
    report(simt ? "moe_experts fp4 simt" : "moe_experts fp4 mma", "v41 E384 k6 T=4096 act32", ms,
           2.0 * T * k * 3 * D * I, wbytes);
  }
}

}  // namespace
}  // namespace dil::test
