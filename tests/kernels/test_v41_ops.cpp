// CPU reference ops added for V4.1 (model-spec §4.3-§4.5): candidate blocks and the Reindex
// restriction in indexer_topk, the Engram gate (engram_mix), the image-span routing bias.
// Expected values are derived by hand or from the spec's formulas, independently of the code.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/cpu/cpu_backend.h"
#include "test_util.h"

namespace dil {
namespace {

using test::view;

// One head, weight 1, q = e0, ratio 1: score(r) = ReLU(k_r[0]). 21 visible rows (position 20)
// in blocks of 4: block maxima {4, 9, 2, 9, 1, 0(partial: row 20)}.
struct CandCase {
  static constexpr int di = 4, rpb = 32;
  std::vector<float> keys = std::vector<float>(size_t(rpb * di), 0.0f);  // [1 block, 32, 4]
  std::vector<float> q = {1, 0, 0, 0}, w = {1};
  StepMeta m = test::make_meta({{20, 1, 0, {0}}});
  CandCase() {
    const float s[21] = {1, 4, 0, 3, 9, 2, 9, 5, 2, 1, 0, 0, 8, 9, 7, 6, 1, 1, 0, 1, 0};
    for (int r = 0; r < 21; ++r) keys[size_t(r * di)] = s[r];
  }
  IndexerArgs args(int topk, std::vector<int32_t>& out) {
    IndexerArgs a;
    a.q = view(q, {1, 1, di});
    a.w = view(w, {1, 1});
    a.keys = view(keys, {1, rpb, di});
    a.ratio = 1;
    a.rows_per_block = rpb;
    a.topk = topk;
    a.out_idx = view(out, {1, topk});
    a.sort_ascending = true;
    a.cand_block = 4;
    a.cand_topk = 3;
    return a;
  }
};

TEST(IndexerV41, CandidateBlocksPinNewestAndBreakTiesLow) {
  CpuBackend be;
  CandCase c;
  std::vector<int32_t> out(4), cand(3, 77);
  IndexerArgs a = c.args(4, out);
  a.cand_out = view(cand, {1, 3});
  be.indexer_topk(a, c.m);
  // Block maxima 4, 9, 2, 9, 1, 0: the newest block 5 is pinned; then blocks 1 and 3 tie at 9
  // and both fit (3 blocks). Written ascending.
  EXPECT_EQ(cand, (std::vector<int32_t>{1, 3, 5}));
  // The source's own top-4 is unrestricted: scores 9 (rows 4, 6, 13), then 8 (row 12).
  EXPECT_EQ(out, (std::vector<int32_t>{4, 6, 12, 13}));
}

TEST(IndexerV41, CandidateTieGoesToLowerBlock) {
  CpuBackend be;
  CandCase c;
  c.keys[size_t(13 * c.di)] = 8;  // block 3 max becomes 8 (row 12 and 13); block 1 keeps 9
  c.keys[size_t(4 * c.di)] = 8;   // block 1: rows 4 (8), 6 (9) -> max 9 still
  c.keys[size_t(6 * c.di)] = 8;   // block 1 max 8 too: blocks 1 and 3 tie at 8
  std::vector<int32_t> out(2), cand(2);
  IndexerArgs a = c.args(2, out);
  a.cand_topk = 2;
  a.cand_out = view(cand, {1, 2});
  be.indexer_topk(a, c.m);
  EXPECT_EQ(cand, (std::vector<int32_t>{1, 5}));  // pinned block 5, then the lower of the tie
}

TEST(IndexerV41, ReindexSelectsOnlyInsideCandidates) {
  CpuBackend be;
  CandCase c;
  std::vector<int32_t> out(6), cand = {0, 2, 5};  // rows 0-3, 8-11, 20
  IndexerArgs a = c.args(6, out);
  a.cand_in = view(cand, {1, 3});
  be.indexer_topk(a, c.m);
  // Allowed rows and scores: 0:1 1:4 2:0 3:3 8:2 9:1 10:0 11:0 20:0. Top 6 by score (ties to
  // the lower row): 1, 3, 8, 0, 9, then 2 (zero; lowest of the zero ties), sorted ascending.
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 2, 3, 8, 9}));
  // Fewer allowed rows than topk: the rest is -1.
  std::vector<int32_t> out12(12);
  IndexerArgs b = c.args(12, out12);
  b.cand_in = view(cand, {1, 3});
  be.indexer_topk(b, c.m);
  EXPECT_EQ(out12, (std::vector<int32_t>{0, 1, 2, 3, 8, 9, 10, 11, 20, -1, -1, -1}));
}

// engram_mix against the formula of model-spec §4.5 evaluated here in double.
TEST(EngramMix, MatchesFormulaAndMask) {
  CpuBackend be;
  const int T = 3, n = 4, D = 16;
  std::vector<float> X = test::random_vec(size_t(T * n * D), 91, 2.0f), kv = test::random_vec(size_t(T * (n + 1) * D), 92),
                     qk = test::random_vec(size_t(n * D), 93), out(X.size());
  std::vector<int32_t> mask = {0, 1, 0};
  const float eps = 1e-20f;
  be.engram_mix(view(X, {T, n, D}), view(kv, {T, (n + 1) * D}), view(qk, {n, D}), view(mask, {T}), eps,
                view(out, {T, n, D}));
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < n; ++j) {
      const float* h = &X[size_t((t * n + j) * D)];
      const float* key = &kv[size_t((t * (n + 1) + j) * D)];
      const float* val = &kv[size_t((t * (n + 1) + n) * D)];
      double hh = 0, kk = 0, dot = 0;
      for (int c = 0; c < D; ++c) {
        hh += double(h[c]) * h[c];
        kk += double(key[c]) * key[c];
        dot += double(h[c]) * qk[size_t(j * D + c)] * key[c];
      }
      const double s = dot / std::sqrt(hh / D + eps) / std::sqrt(kk / D + eps) / std::sqrt(double(D));
      const double signed_root = (s < 0 ? -1.0 : 1.0) * std::sqrt(std::max(std::fabs(s), 1e-6));
      const double gate = mask[size_t(t)] ? 0.0 : 1.0 / (1.0 + std::exp(-signed_root));
      for (int c = 0; c < D; ++c) {
        const double want = double(h[c]) + gate * val[c];
        EXPECT_NEAR(out[size_t((t * n + j) * D + c)], want, 1e-6 * (1 + std::fabs(want))) << t << " " << j << " " << c;
      }
      if (mask[size_t(t)])
        for (int c = 0; c < D; ++c) EXPECT_EQ(out[size_t((t * n + j) * D + c)], h[c]);  // gate shut: untouched
    }
}

// Image-span tokens select experts with bias_vl; weights still come from the unbiased scores
// with V4.1's +1e-20 on the sum.
TEST(MoeRouteV41, ImageSpanTokensUseBiasVl) {
  CpuBackend be;
  const int T = 2, E = 4, k = 2;
  std::vector<float> logits = {0.5f, 0.4f, 0.3f, 0.2f, 0.5f, 0.4f, 0.3f, 0.2f};
  std::vector<float> bias = {0, 0, 0, 0}, bias_vl = {0, 0, 5, 5};
  std::vector<int32_t> mask = {0, 1}, idx(T * k);
  std::vector<float> w(T * k);
  MoeRouteArgs a;
  a.logits = view(logits, {T, E});
  a.bias = view(bias, {E});
  a.bias_vl = view(bias_vl, {E});
  a.image_mask = view(mask, {T});
  a.topk = k;
  a.route_scale = 1.5f;
  a.norm_eps = 1e-20f;
  a.out_w = view(w, {T, k});
  a.out_idx = view(idx, {T, k});
  be.moe_route(a);
  EXPECT_EQ(idx, (std::vector<int32_t>{0, 1, 2, 3}));
  auto sps = [](double l) { return std::sqrt(std::log1p(std::exp(l))); };
  const double s2 = sps(0.3), s3 = sps(0.2);
  EXPECT_NEAR(w[2], 1.5 * s2 / (s2 + s3), 1e-6);
  EXPECT_NEAR(w[3], 1.5 * s3 / (s2 + s3), 1e-6);
}

}  // namespace
}  // namespace dil
