// Indexer top-k (tie-breaking, paging, ordering) and MoE routing / experts of the CPU
// reference (model-spec §3.7, §3.8, design.md "Numerics": ties go to the lowest index).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/cpu/cpu_backend.h"
#include "test_util.h"

namespace dil {
namespace {

using test::view;

TEST(Indexer, TiesToLowestIndexPagingAndOrder) {
  CpuBackend be;
  const int di = 4, rpb = 4, ratio = 4;
  // One head, weight 1, q = e0: score(r) = ReLU(k_r[0]) = {1, 3, 3, 2, 3, 0, 0} for rows 0..6.
  const float k0[7] = {1, 3, 3, 2, 3, -1, -0.5f};
  std::vector<float> keys = test::random_vec(2 * rpb * di, 80);  // [2 blocks, 4, 4]
  const int bt[2] = {1, 0};  // logical block 0 -> physical 1
  for (int r = 0; r < 7; ++r) keys[(bt[r / rpb] * rpb + r % rpb) * di] = k0[r];
  std::vector<float> q = {1, 0, 0, 0}, w = {1};
  // Position 27 -> 7 visible rows; position 9 -> 2 visible rows (second token of the step).
  std::vector<float> q2 = {1, 0, 0, 0, 1, 0, 0, 0}, w2 = {1, 1};
  StepMeta m = test::make_meta({{27, 1, 0, {1, 0}}});
  auto run = [&](int topk, bool asc) {
    std::vector<int32_t> out(topk, 77);
    IndexerArgs a;
    a.q = view(q, {1, 1, di});
    a.w = view(w, {1, 1});
    a.keys = view(keys, {2, rpb, di});
    a.ratio = ratio;
    a.rows_per_block = rpb;
    a.topk = topk;
    a.out_idx = view(out, {1, topk});
    a.sort_ascending = asc;
    be.indexer_topk(a, m);
    return out;
  };
  EXPECT_EQ(run(4, false), (std::vector<int32_t>{1, 2, 4, 3}));
  EXPECT_EQ(run(4, true), (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(run(6, false), (std::vector<int32_t>{1, 2, 4, 3, 0, 5}));  // the zero scores tie: 5 before 6
  EXPECT_EQ(run(10, false), (std::vector<int32_t>{1, 2, 4, 3, 0, 5, 6, -1, -1, -1}));
  EXPECT_EQ(run(10, true), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, -1, -1, -1}));
}

TEST(Indexer, WeightedReluScoreAgainstFormula) {
  CpuBackend be;
  const int Hi = 3, di = 8, rpb = 4, ratio = 4, topk = 5;
  std::vector<float> keys = test::random_vec(3 * rpb * di, 81), q = test::random_vec(2 * Hi * di, 82),
                     w = test::random_vec(2 * Hi, 83);
  StepMeta m = test::make_meta({{40, 2, 0, {2, 0, 1}}});  // positions 40, 41 -> 10 visible rows
  std::vector<int32_t> out(2 * topk);
  IndexerArgs a;
  a.q = view(q, {2, Hi, di});
  a.w = view(w, {2, Hi});
  a.keys = view(keys, {3, rpb, di});
  a.ratio = ratio;
  a.rows_per_block = rpb;
  a.topk = topk;
  a.out_idx = view(out, {2, topk});
  be.indexer_topk(a, m);
  const int bt[3] = {2, 0, 1};
  for (int t = 0; t < 2; ++t) {
    std::vector<double> sc(10);
    for (int r = 0; r < 10; ++r) {
      const float* k = &keys[(bt[r / rpb] * rpb + r % rpb) * di];
      for (int h = 0; h < Hi; ++h) {
        double dot = 0;
        for (int c = 0; c < di; ++c) dot += double(q[(t * Hi + h) * di + c]) * k[c];
        sc[r] += w[t * Hi + h] * std::max(dot, 0.0);
      }
    }
    std::vector<int> order(10);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return sc[x] > sc[y]; });
    for (int i = 0; i < topk; ++i) EXPECT_EQ(out[t * topk + i], order[i]) << t << " " << i;
  }
}

// Fast numerics: the f32 specification (fast_score, mirrored bit for bit by the CUDA FP8 kernel)
// against the double sum S = sum_h w_h max(dot_h, 0). Error bound, u = 2^-24, first order plus a
// 1% margin: each block sum B_b = dot_b (1 + e), |e| <= u, and the three f32 adds give
// |d_h - dot_h| <= 4u sum_b |dot_b,h|; ReLU is 1-Lipschitz; the product w_h relu(d_h) rounds once
// (u |term_h|); a term passes through at most MT + 3 f32 adds of the head sum (its pair, MT - 1
// tile accumulations, 3 butterfly levels: MT = ceil(Hi / 16)). So
//   |fast - S| <= 4u sum_h |w_h| sum_b |dot_b,h| + (MT + 4) u sum_h |w_h| relu(dot_h).
// The selection must be the exact top-k of the fast scores, and the scores must differ from
// the double sum's rounding somewhere (the fast arithmetic is in use).
TEST(Indexer, FastSpecificationWithinItsBoundOfTheDoubleSum) {
  CpuBackend be;
  be.set_numerics(Numerics::Fast);
  const int Hi = 40, di = 128, rpb = 4, ratio = 4, topk = 9, T = 2, NB = 20, MT = (Hi + 15) / 16;
  std::vector<float> keys = test::random_vec(NB * rpb * di, 91), q = test::random_vec(T * Hi * di, 92),
                     w = test::random_vec(T * Hi, 93);
  std::vector<int32_t> bt(NB);
  for (int b = 0; b < NB; ++b) bt[size_t(b)] = (b * 7) % NB;
  StepMeta m = test::make_meta({{318, T, 0, bt}});  // positions 318, 319 -> 79, 80 visible rows
  const int n_max = 80;
  std::vector<int32_t> out(T * topk);
  std::vector<float> sc(T * n_max, NAN);
  IndexerArgs a;
  a.q = view(q, {T, Hi, di});
  a.w = view(w, {T, Hi});
  a.keys = view(keys, {NB, rpb, di});
  a.ratio = ratio;
  a.rows_per_block = rpb;
  a.topk = topk;
  a.out_idx = view(out, {T, topk});
  a.scores_out = view(sc, {T, n_max});
  be.indexer_topk(a, m);
  const double u = std::ldexp(1.0, -24);
  int differ = 0;
  for (int t = 0; t < T; ++t) {
    const int n_vis = (318 + t + 1) / ratio;
    for (int r = 0; r < n_vis; ++r) {
      const float* k = &keys[size_t((bt[size_t(r / rpb)] * rpb + r % rpb) * di)];
      double S = 0, blocks = 0, terms = 0;
      for (int h = 0; h < Hi; ++h) {
        double dot = 0, absb = 0;
        for (int b = 0; b < di / 32; ++b) {
          double db = 0;
          for (int c = b * 32; c < (b + 1) * 32; ++c) db += double(q[size_t((t * Hi + h) * di + c)]) * k[c];
          dot += db;
          absb += std::fabs(db);
        }
        const double wh = w[size_t(t * Hi + h)];
        S += wh * std::max(dot, 0.0);
        blocks += std::fabs(wh) * absb;
        terms += std::fabs(wh) * std::max(dot, 0.0);
      }
      const double bound = 1.01 * (4 * u * blocks + (MT + 4) * u * terms);
      const float f = sc[size_t(t * n_max + r)];
      EXPECT_LE(std::fabs(double(f) - S), bound) << t << " " << r;
      differ += f != float(S);
    }
    std::vector<int> order(static_cast<size_t>(n_vis));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int x, int y) { return sc[size_t(t * n_max + x)] > sc[size_t(t * n_max + y)]; });
    for (int i = 0; i < topk; ++i) EXPECT_EQ(out[size_t(t * topk + i)], order[size_t(i)]) << t << " " << i;
  }
  EXPECT_GT(differ, 0) << "the fast scores equal the double sum's rounding everywhere";
}

double sqrt_softplus(double l) { return std::sqrt(l > 20 ? l : std::log1p(std::exp(l))); }

TEST(MoeRoute, HashAndBiasedPaths) {
  CpuBackend be;
  const int T = 3, E = 8, k = 3;
  std::vector<float> logits = test::random_vec(T * E, 90, 4.0f);
  logits[5] = 25.0f;  // above softplus's threshold: s = sqrt(25) = 5
  std::vector<float> bias = test::random_vec(E, 91, 0.5f), w(T * k);
  std::vector<int32_t> idx(T * k);
  // Biased: top-k of s + bias; token 2 has all logits equal and zero bias -> ties -> 0, 1, 2.
  for (int e = 0; e < E; ++e) logits[2 * E + e] = 0.3f;
  MoeRouteArgs a;
  a.logits = view(logits, {T, E});
  a.bias = view(bias, {E});
  a.topk = k;
  a.route_scale = 1.5f;
  a.norm_eps = 1e-20f;
  a.out_w = view(w, {T, k});
  a.out_idx = view(idx, {T, k});
  be.moe_route(a);
  for (int t = 0; t < 2; ++t) {
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
      return float(sqrt_softplus(logits[t * E + x])) + bias[x] > float(sqrt_softplus(logits[t * E + y])) + bias[y];
    });
    double sum = 0;
    for (int i = 0; i < k; ++i) sum += sqrt_softplus(logits[t * E + order[i]]);
    for (int i = 0; i < k; ++i) {
      EXPECT_EQ(idx[t * k + i], order[i]);
      EXPECT_NEAR(w[t * k + i], sqrt_softplus(logits[t * E + order[i]]) / sum * 1.5, 1e-6);
    }
  }
  EXPECT_EQ(idx[0], 5);  // the large logit wins
  EXPECT_NEAR(w[0], 5.0 / (5.0 + sqrt_softplus(logits[idx[1]]) + sqrt_softplus(logits[idx[2]])) * 1.5, 1e-6);
  // Token 2 with equal scores and a flat bias: lowest indices, equal weights 1.5/3.
  for (float& b : bias) b = 0.25f;
  be.moe_route(a);
  EXPECT_EQ(std::vector<int32_t>(idx.begin() + 2 * k, idx.end()), (std::vector<int32_t>{0, 1, 2}));
  for (int i = 0; i < k; ++i) EXPECT_NEAR(w[2 * k + i], 0.5f, 1e-7);
  // Hash routing: idx = tid2eid[ids[t]] in table order, weights normalised over those.
  std::vector<int32_t> tid2eid = {7, 1, 4, /**/ 0, 6, 2, /**/ 3, 3, 5};  // [V = 3, k]
  std::vector<int32_t> ids = {2, 0, 1};
  a.tid2eid = view(tid2eid, {3, k});
  a.ids = view(ids, {T});
  a.bias = Tensor();
  a.norm_eps = 0.0f;
  be.moe_route(a);
  for (int t = 0; t < T; ++t) {
    double sum = 0;
    for (int i = 0; i < k; ++i) sum += sqrt_softplus(logits[t * E + tid2eid[ids[t] * k + i]]);
    for (int i = 0; i < k; ++i) {
      const int e = tid2eid[ids[t] * k + i];
      EXPECT_EQ(idx[t * k + i], e);
      EXPECT_NEAR(w[t * k + i], sqrt_softplus(logits[t * E + e]) / sum * 1.5, 1e-6);
    }
  }
}

TEST(MoeExperts, MatchesLinearSwigluComposition) {
  CpuBackend be;
  const int T = 4, D = 40, I = 24, E = 3, k = 2, blk = 16;
  // BF16 experts keep the test small; FP8 act quant applies only in front of FP8/FP4 weights,
  // so use FP8 for w2 of expert 1 to exercise it (block 8x8, scales 127).
  std::vector<std::vector<uint16_t>> store;
  std::vector<Weight> w1(E), w2(E), w3(E);
  auto bf16_weight = [&](int out, int in, uint32_t seed) {
    auto f = test::random_vec(size_t(out) * in, seed, 0.3f);
    store.emplace_back(f.size());
    for (size_t i = 0; i < f.size(); ++i) store.back()[i] = f32_to_bf16(f[i]);
    Weight w;
    w.kind = Weight::Kind::BF16;
    w.w = Tensor(store.back().data(), DType::BF16, {out, in});
    return w;
  };
  store.reserve(16);
  for (int e = 0; e < E; ++e) {
    w1[e] = bf16_weight(I, D, 100 + e);
    w3[e] = bf16_weight(I, D, 110 + e);
    w2[e] = bf16_weight(D, I, 120 + e);
  }
  std::vector<uint8_t> q8(D * I), s8(5 * 3, 124);
  for (size_t i = 0; i < q8.size(); ++i) q8[i] = uint8_t((i * 37 + 5) % 0x7e) | (i % 3 ? 0 : 0x80);
  w2[1] = Weight{Weight::Kind::FP8, Tensor(q8.data(), DType::F8E4M3, {D, I}), Tensor(s8.data(), DType::E8M0, {5, 3}),
                 8, 8, D, I};
  std::vector<float> x = test::random_vec(T * D, 130, 3.0f), rw = test::random_vec(T * k, 131), out(T * D);
  std::vector<int32_t> ri = {2, 0, /**/ 1, 2, /**/ 0, 1, /**/ 1, 0};
  MoeExpertsArgs a;
  a.x = view(x, {T, D});
  a.w1 = &w1;
  a.w2 = &w2;
  a.w3 = &w3;
  a.route_w = view(rw, {T, k});
  a.route_idx = view(ri, {T, k});
  a.act_block = blk;
  a.swiglu_limit = 1.0f;  // small, so the clamps bite
  a.out = view(out, {T, D});
  be.moe_experts(a);
  for (int t = 0; t < T; ++t) {
    std::vector<double> acc(D, 0.0);
    for (int i = 0; i < k; ++i) {
      const int e = ri[t * k + i];
      std::vector<float> xt(x.begin() + t * D, x.begin() + (t + 1) * D), g(I), u(I), h(I), y(D), wt = {rw[t * k + i]};
      be.linear(view(xt, {1, D}), w1[e], blk, view(g, {1, I}));
      be.linear(view(xt, {1, D}), w3[e], blk, view(u, {1, I}));
      be.swiglu(view(g, {1, I}), view(u, {1, I}), view(wt, {1}), 1.0f, view(h, {1, I}));
      for (int c = 0; c < I; ++c) {  // the swiglu formula itself
        const double gc = std::min(g[c], 1.0f), uc = std::clamp(u[c], -1.0f, 1.0f);
        EXPECT_NEAR(h[c], gc / (1 + std::exp(-gc)) * uc * wt[0], 1e-6);
      }
      be.linear(view(h, {1, I}), w2[e], blk, view(y, {1, D}));
      for (int c = 0; c < D; ++c) acc[c] += y[c];
    }
    for (int c = 0; c < D; ++c) EXPECT_EQ(out[t * D + c], float(acc[c])) << t << " " << c;
  }
}

}  // namespace
}  // namespace dil
