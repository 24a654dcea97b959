// Parity of the lightning indexer (scores + exact top-k with lowest-index ties, 64K rows),
// MoE routing (bias top-k, hash, ties) and the routed experts (FP4 W4A8 grouped GEMM).
#include <algorithm>
#include <cstdlib>

#include "parity.h"

namespace dil::test {
namespace {

struct IdxCase {
  const char* what;
  std::vector<SeqSpec> seqs;
  int Hi, ratio;
  bool ascending;
  int dup;  // > 0: key rows repeat with this period (exact score ties)
};

class CudaIndexer : public CudaParity {
 protected:
  // fp4: official-numerics inputs (FP4-QDQ'd per 32, fp4_blocks set): the tensor-core path,
  // which must select exactly what the reference selects.
  // bf16: q, w and keys bf16 tensors on both sides (FP4-QDQ'd values are exact in bf16; w is
  // rounded to bf16 first), in official (fp4) or reference numerics: with fp4 the tensor-core
  // path reads the bf16 q in place and copies the bf16 keys; without, the FP64 scorer widens
  // them. Exact indices either way. (Fast numerics have their own specification and kernels:
  // test_indexer_fast.cpp.)
  void run(IdxCase c, uint32_t seed, bool fp4 = false, bool bf16 = false) {
    const int di = 128, topk = 512, rpb = 128 / c.ratio;
    int base = 0;
    for (auto& s : c.seqs) {
      int rows = (s.start_pos + s.len) / c.ratio;
      int nb = std::max(1, (rows + rpb - 1) / rpb);
      s.blocks = block_list(nb, base, seed + base);
      base += nb;
    }
    StepMeta m = make_meta(c.seqs);
    const int64_t T = m.n_tokens, NB = base;
    auto q = random_vec(size_t(T * c.Hi * di), seed + 1), w = random_vec(size_t(T * c.Hi), seed + 2);
    auto keys = random_vec(size_t(NB * rpb * di), seed + 3);
    if (fp4) {  // before the copies, so duplicated rows stay equal
      fp4_blocks_inplace(*cpu, q, seed + 4);
      fp4_blocks_inplace(*cpu, keys, seed + 5);
    }
    if (c.dup) {  // physical row (b, i) copies the key of logical row (b*rpb + i) % dup of block 0
      for (int64_t r = 0; r < NB * rpb; ++r)
        std::copy_n(keys.begin() + (r % c.dup) * di, di, keys.begin() + r * di);
    }
    std::vector<int32_t> ref(size_t(T * topk));
    std::vector<uint16_t> qb = bf16_of(q), wb = bf16_of(w), kb = bf16_of(keys);
    IndexerArgs ha;
    ha.q = bf16 ? bview(qb, {T, c.Hi, di}) : view(q, {T, c.Hi, di});
    ha.w = bf16 ? bview(wb, {T, c.Hi}) : view(w, {T, c.Hi});
    ha.keys = bf16 ? bview(kb, {NB, rpb, di}) : view(keys, {NB, rpb, di});
    ha.ratio = c.ratio;
    ha.rows_per_block = rpb;
    ha.topk = topk;
    ha.sort_ascending = c.ascending;
    // The plan picks the path.
    gpu->set_numerics(fp4 ? Numerics::Official : Numerics::Reference);
    cpu->set_numerics(Numerics::Reference);
    ha.out_idx = view(ref, {T, topk});
    cpu->indexer_topk(ha, m);
    StepMeta gm = m;
    upload_meta(gm);
    IndexerArgs ga = ha;
    ga.q = bf16 ? devb(qb, {T, c.Hi, di}) : devf(q, {T, c.Hi, di});
    ga.w = bf16 ? devb(wb, {T, c.Hi}) : devf(w, {T, c.Hi});
    ga.keys = bf16 ? devb(kb, {NB, rpb, di}) : devf(keys, {NB, rpb, di});
    ga.out_idx = poisoned(DType::I32, {T, topk});
    gpu->indexer_topk(ga, gm);
    const std::string impl =
        gpu->impl_for(indexer_site(c.Hi, di, topk, 0, 0, 0, bf16 ? DType::BF16 : DType::F32, gpu->numerics()), T).name;
    EXPECT_EQ(impl, fp4 ? "mma_exact" : "fp64") << c.what;
    compare_exact_i32(std::string(fp4 ? "indexer_topk fp4 (mma)" : "indexer_topk") + (bf16 ? " bf16" : ""), c.what,
                      down<int32_t>(ga.out_idx), ref);
  }
};

TEST_F(CudaIndexer, V4SixtyFourKRows) {
  run({"v4 Hi64 65535 rows + T=17@3000 + tiny", {{262140, 1, 0, {}}, {3000, 17, 1, {}}, {10, 1, 2, {}}, {0, 1, 3, {}}},
       64, 4, false, 0},
      301);
}

TEST_F(CudaIndexer, V41Ascending) {
  run({"v41 Hi32 m2 ascending T=17@5000", {{5000, 17, 0, {}}, {1, 1, 1, {}}}, 32, 2, true, 0}, 311);
}

TEST_F(CudaIndexer, ExactTiesGoToLowestRow) {
  run({"ties: 7 distinct keys, T=3@2000", {{2000, 3, 0, {}}}, 16, 4, false, 7}, 321);
  run({"ties ascending, T=2@999", {{999, 2, 0, {}}}, 16, 4, true, 5}, 322);
}

TEST_F(CudaIndexer, Fp4TensorCoresV4SixtyFourKRows) {
  run({"v4 Hi64 65535 rows + T=17@3000 + tiny", {{262140, 1, 0, {}}, {3000, 17, 1, {}}, {10, 1, 2, {}}, {0, 1, 3, {}}},
       64, 4, false, 0},
      305, true);
}

TEST_F(CudaIndexer, Fp4TensorCoresPrefillChunk) {
  // A prefill chunk: 300 tokens of one sequence after 20000 cached ones, and a second sequence.
  run({"v4 Hi64 T=300@20000 + T=40@100", {{20000, 300, 0, {}}, {100, 40, 1, {}}}, 64, 4, false, 0}, 306, true);
}

TEST_F(CudaIndexer, Fp4TensorCoresV41AndTies) {
  run({"v41 Hi32 m2 ascending T=17@5000", {{5000, 17, 0, {}}, {1, 1, 1, {}}}, 32, 2, true, 0}, 315, true);
  run({"ties Hi16: 7 distinct keys, T=3@2000", {{2000, 3, 0, {}}}, 16, 4, false, 7}, 325, true);
  run({"ties Hi16 ascending, T=2@999", {{999, 2, 0, {}}}, 16, 4, true, 5}, 326, true);
}

TEST_F(CudaIndexer, Bf16TensorCores) {
  run({"v4 Hi64 65535 rows + T=17@3000 + tiny", {{262140, 1, 0, {}}, {3000, 17, 1, {}}, {10, 1, 2, {}}, {0, 1, 3, {}}},
       64, 4, false, 0},
      307, true, true);
  run({"v4 Hi64 T=129@20000 + T=40@100", {{20000, 129, 0, {}}, {100, 40, 1, {}}}, 64, 4, false, 0}, 308, true, true);
  run({"v41 Hi32 m2 ascending T=17@5000", {{5000, 17, 0, {}}, {1, 1, 1, {}}}, 32, 2, true, 0}, 316, true, true);
  run({"ties Hi16: 7 distinct keys, T=3@2000", {{2000, 3, 0, {}}}, 16, 4, false, 7}, 327, true, true);
}

TEST_F(CudaIndexer, Bf16Fp64Scorer) {
  run({"v4 Hi64 T=17@3000 + tiny", {{3000, 17, 1, {}}, {10, 1, 2, {}}, {0, 1, 3, {}}}, 64, 4, false, 0}, 309, false,
      true);
  run({"ties ascending, T=2@999", {{999, 2, 0, {}}}, 16, 4, true, 5}, 328, false, true);
}

struct RouteCase {
  const char* what;
  int64_t T, E;
  int k;
  float eps;
  bool hash, ties;
};

TEST_F(CudaParity, MoeRoute) {
  for (RouteCase c : {RouteCase{"v4 E256 top6 bias T=17", 17, 256, 6, 0.0f, false, false},
                      RouteCase{"v41 E384 top6 eps1e-20 T=17", 17, 384, 6, 1e-20f, false, false},
                      RouteCase{"v4 hash E256 T=17", 17, 256, 6, 0.0f, true, false},
                      RouteCase{"ties E256 T=5", 5, 256, 6, 0.0f, false, true},
                      RouteCase{"dspark E128 top3 T=1", 1, 128, 3, 1e-20f, false, false}}) {
    auto logits = random_vec(size_t(c.T * c.E), 401, 3.0f), bias = random_vec(size_t(c.E), 402, 0.5f);
    if (c.ties) {
      for (size_t i = 0; i < logits.size(); ++i) logits[i] = float(int(i * 7 % 5) - 2) * 0.5f + 0.25f;
      std::fill(bias.begin(), bias.end(), 0.125f);
    }
    const int64_t V = 1000;
    auto tid2eid = rnd_int(size_t(V * c.k), 403, 0, int(c.E - 1));
    auto ids = rnd_int(size_t(c.T), 404, 0, int(V - 1));
    std::vector<float> w(size_t(c.T * c.k));
    std::vector<int32_t> idx(size_t(c.T * c.k));
    MoeRouteArgs ha;
    ha.logits = view(logits, {c.T, c.E});
    if (!c.hash) ha.bias = view(bias, {c.E});
    if (c.hash) {
      ha.tid2eid = view(tid2eid, {V, c.k});
      ha.ids = view(ids, {c.T});
    }
    ha.topk = c.k;
    ha.norm_eps = c.eps;
    ha.out_w = view(w, {c.T, c.k});
    ha.out_idx = view(idx, {c.T, c.k});
    cpu->moe_route(ha);
    MoeRouteArgs ga = ha;
    ga.logits = devf(logits, {c.T, c.E});
    if (!c.hash) ga.bias = devf(bias, {c.E});
    if (c.hash) {
      ga.tid2eid = devi(tid2eid, {V, c.k});
      ga.ids = devi(ids, {c.T});
    }
    ga.out_w = poisoned(DType::F32, {c.T, c.k});
    ga.out_idx = poisoned(DType::I32, {c.T, c.k});
    gpu->moe_route(ga);
    compare_exact_i32("moe_route idx", c.what, down<int32_t>(ga.out_idx), idx);
    compare("moe_route w", c.what, down<float>(ga.out_w), w, 1e-7, 3e-7);
  }
}

struct ExpertCase {
  const char* what;
  int64_t T, D, I, E;
  int k, act;
  int sets;  // distinct weight sets (expert e uses set e % sets), keeps host memory small
};

TEST_F(CudaParity, MoeExperts) {
  // The SIMT kernels (forced through BackendOptions): double accumulation, hence the bound
  // below; the default tensor-core path has its own derived bound (test_moe_mma.cpp).
  BackendOptions o = test_options();
  o.force["moe_experts"] = "simt";
  gpu = make_backend(BackendKind::CUDA, 0, o);
  for (ExpertCase c : {ExpertCase{"v4 D4096 I2048 E256 k6 act128 T=5", 5, 4096, 2048, 256, 6, 128, 3},
                       ExpertCase{"v41 D5120 I2304 E384 k6 act32 T=3", 3, 5120, 2304, 384, 6, 32, 2},
                       ExpertCase{"tiles: T=100 E8 k6 D256 I128", 100, 256, 128, 8, 6, 128, 8},
                       ExpertCase{"T=1 E16 k2 D512 I256 act0", 1, 512, 256, 16, 2, 0, 4}}) {
    std::vector<HostWeight> s1, s2, s3;
    for (int i = 0; i < c.sets; ++i) {
      s1.push_back(make_weight(Weight::Kind::FP4, c.I, c.D, 32, 500 + 3 * i));
      s2.push_back(make_weight(Weight::Kind::FP4, c.D, c.I, 32, 501 + 3 * i));
      s3.push_back(make_weight(Weight::Kind::FP4, c.I, c.D, 32, 502 + 3 * i));
    }
    std::vector<Weight> h1, h2, h3, g1, g2, g3;
    std::vector<Weight> d1, d2, d3;
    for (int i = 0; i < c.sets; ++i) {
      d1.push_back(dev_weight(s1[i]));
      d2.push_back(dev_weight(s2[i]));
      d3.push_back(dev_weight(s3[i]));
    }
    for (int64_t e = 0; e < c.E; ++e) {
      h1.push_back(s1[e % c.sets].wt);
      h2.push_back(s2[e % c.sets].wt);
      h3.push_back(s3[e % c.sets].wt);
      g1.push_back(d1[e % c.sets]);
      g2.push_back(d2[e % c.sets]);
      g3.push_back(d3[e % c.sets]);
    }
    auto x = random_vec(size_t(c.T * c.D), 511, 2.0f);
    // Distinct experts per token.
    std::vector<int32_t> ridx(size_t(c.T * c.k));
    std::mt19937 rng(512);
    for (int64_t t = 0; t < c.T; ++t) {
      std::vector<int32_t> all(static_cast<size_t>(c.E));
      for (int64_t e = 0; e < c.E; ++e) all[e] = int32_t(e);
      std::shuffle(all.begin(), all.end(), rng);
      std::copy_n(all.begin(), c.k, ridx.begin() + t * c.k);
    }
    auto rw = random_vec(size_t(c.T * c.k), 513, 1.0f);
    std::vector<float> ref(size_t(c.T * c.D));
    MoeExpertsArgs ha;
    ha.x = view(x, {c.T, c.D});
    ha.w1 = &h1;
    ha.w2 = &h2;
    ha.w3 = &h3;
    ha.route_w = view(rw, {c.T, c.k});
    ha.route_idx = view(ridx, {c.T, c.k});
    ha.act_block = c.act;
    ha.swiglu_limit = 10.0f;
    ha.out = view(ref, {c.T, c.D});
    cpu->moe_experts(ha);
    MoeExpertsArgs ga = ha;
    ga.x = devf(x, {c.T, c.D});
    ga.w1 = &g1;
    ga.w2 = &g2;
    ga.w3 = &g3;
    ga.route_w = devf(rw, {c.T, c.k});
    ga.route_idx = devi(ridx, {c.T, c.k});
    ga.out = poisoned(DType::F32, {c.T, c.D});
    gpu->moe_experts(ga);
    // Double accumulation like the reference: equal unless a last-bit difference of the
    // double-precision exp in SiLU flips one FP8 rounding of h (then one e4m3 step of h).
    compare("moe_experts fp4", c.what, down<float>(ga.out), ref, 1e-4, 5e-3);
  }
}

}  // namespace
}  // namespace dil::test

namespace dil::test {
namespace {

// Fast numerics on the SIMT experts (forced): bf16 tokens, round_bf16 (g, u, h and every expert
// output rounded to bf16 as the official GEMMs write them), f32 out (the model's routed sum) or
// bf16. The SIMT sums are the reference's bit for bit (double accumulation, products exact), so
// the roundings happen on identical f32 values; as in MoeExperts above, only a last-bit
// difference of the double exp in SiLU can move an h by one f32 ulp, which may flip h's bf16
// rounding (one bf16 ulp of h, smaller than the e4m3 step the bound already allows for the FP8
// QDQ that follows) and then y's (one bf16 ulp, 2^-7 |y| at most: within abs 5e-3 of max|ref|
// while |y| <= 0.64 max|ref|, which holds with a wide margin: max|ref| is ~10 standard deviations
// of one slot's y here). Same bound: rel 1e-4 / abs 5e-3 (+ one bf16 ulp of a bf16 output).
TEST_F(CudaParity, MoeExpertsFastSimt) {
  BackendOptions o = test_options();
  o.force["moe_experts"] = "simt";
  gpu = make_backend(BackendKind::CUDA, 0, o);
  cpu->set_numerics(Numerics::Fast);
  gpu->set_numerics(Numerics::Fast);
  for (ExpertCase c : {ExpertCase{"bf16 v4 D4096 I2048 E256 k6 act128 T=5", 5, 4096, 2048, 256, 6, 128, 3},
                       ExpertCase{"bf16 v41 D5120 I2304 E384 k6 act32 T=3", 3, 5120, 2304, 384, 6, 32, 2},
                       ExpertCase{"bf16 tiles: T=129 E8 k6 D256 I128", 129, 256, 128, 8, 6, 128, 8},
                       ExpertCase{"bf16 T=1 E16 k2 D512 I256 act0", 1, 512, 256, 16, 2, 0, 4}}) {
    for (DType odt : {DType::F32, DType::BF16}) {
      std::vector<HostWeight> s1, s2, s3;
      for (int i = 0; i < c.sets; ++i) {
        s1.push_back(make_weight(Weight::Kind::FP4, c.I, c.D, 32, 520 + 3 * i));
        s2.push_back(make_weight(Weight::Kind::FP4, c.D, c.I, 32, 521 + 3 * i));
        s3.push_back(make_weight(Weight::Kind::FP4, c.I, c.D, 32, 522 + 3 * i));
      }
      std::vector<Weight> h1, h2, h3, g1, g2, g3, d1, d2, d3;
      for (int i = 0; i < c.sets; ++i) {
        d1.push_back(dev_weight(s1[i]));
        d2.push_back(dev_weight(s2[i]));
        d3.push_back(dev_weight(s3[i]));
      }
      for (int64_t e = 0; e < c.E; ++e) {
        h1.push_back(s1[e % c.sets].wt);
        h2.push_back(s2[e % c.sets].wt);
        h3.push_back(s3[e % c.sets].wt);
        g1.push_back(d1[e % c.sets]);
        g2.push_back(d2[e % c.sets]);
        g3.push_back(d3[e % c.sets]);
      }
      auto x = bf16_of(random_vec(size_t(c.T * c.D), 531, 2.0f));
      std::vector<int32_t> ridx(size_t(c.T * c.k));
      std::mt19937 rng(532);
      for (int64_t t = 0; t < c.T; ++t) {
        std::vector<int32_t> all(static_cast<size_t>(c.E));
        for (int64_t e = 0; e < c.E; ++e) all[e] = int32_t(e);
        std::shuffle(all.begin(), all.end(), rng);
        std::copy_n(all.begin(), c.k, ridx.begin() + t * c.k);
      }
      auto rw = random_vec(size_t(c.T * c.k), 533, 1.0f);
      const bool bf = odt == DType::BF16;
      std::vector<float> ref_f(size_t(c.T * c.D));
      std::vector<uint16_t> ref_b(size_t(c.T * c.D));
      MoeExpertsArgs ha;
      ha.x = bview(x, {c.T, c.D});
      ha.w1 = &h1;
      ha.w2 = &h2;
      ha.w3 = &h3;
      ha.route_w = view(rw, {c.T, c.k});
      ha.route_idx = view(ridx, {c.T, c.k});
      ha.act_block = c.act;
      ha.swiglu_limit = 10.0f;
      ha.round_bf16 = true;
      ha.out = bf ? bview(ref_b, {c.T, c.D}) : view(ref_f, {c.T, c.D});
      cpu->moe_experts(ha);
      MoeExpertsArgs ga = ha;
      ga.x = devb(x, {c.T, c.D});
      ga.w1 = &g1;
      ga.w2 = &g2;
      ga.w3 = &g3;
      ga.route_w = devf(rw, {c.T, c.k});
      ga.route_idx = devi(ridx, {c.T, c.k});
      ga.out = poisoned(odt, {c.T, c.D});
      gpu->moe_experts(ga);
      if (bf) compare_bf16("moe_experts fp4 fast simt", c.what, downb(ga.out), widen(ref_b), 1e-4, 5e-3);
      else compare("moe_experts fp4 fast simt", c.what, down<float>(ga.out), ref_f, 1e-4, 5e-3);
    }
  }
}

}  // namespace
}  // namespace dil::test
