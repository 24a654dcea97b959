// V4.1's DSpark drafter (model/v41_dspark.cpp) on v41-tiny with random mtp.0..2 weights (the
// drafter fixture, tests/data/make_drafter_fixtures.sh), CPU, reference numerics: a row's
// numbers do not depend on what else its step holds or how its sequence was chunked (double
// sums rounded once per output), so every comparison but the numpy one is exact (bit for bit).
// - Against an independent float64 numpy computation written from model-spec §4.2-§4.4, §4.7
//   (tests/data/dspark_reference.py, on v41-tiny-ezero: Engram's wkv zeroed, so the numpy
//   backbone needs no hashing): the backbone's logits at position 0 (which checks the script's
//   block code), the 5 draft logits after the Markov bias, the greedy drafts and the confidence
//   logits of the draft after position 0.
// - The draft of a sequence is the same whether its positions came in one prefill chunk or in
//   chunks and decode steps batched with another sequence (the context rows of every position
//   the ring keeps are written, under decoder replay too).
// - Drafting leaves the slot as it was (the same draft twice; the next forward's logits equal a
//   model's without the drafter); a slot copy drafts like its source (the rings are slot state).
#include <gtest/gtest.h>

#include "core/safetensors.h"
#include "drafter_util.h"
#include "fixture_util.h"
#include "model/v41_model.h"

using namespace dil;
using namespace dil::test;

namespace {

const std::string kDir = drafter_data() + "/v41-tiny";
constexpr int64_t kV = 1024;
constexpr int kB = 5;      // dspark_block_size
constexpr int kIds = 1000;  // token ids below this

struct Loaded : DrafterModel {
  explicit Loaded(bool dspark, const std::string& dir = kDir, Numerics n = Numerics::Reference)
      : DrafterModel(dspark, dir, n) {}
  V41Model& v41() { return dynamic_cast<V41Model&>(*model); }
};

struct Draft {
  std::vector<int32_t> tokens;
  std::vector<float> logits, conf;  // [5, V], [5]
};
Draft draft(Loaded& l, const DraftRequest& r) {
  Draft d;
  std::vector<std::vector<int32_t>> out;
  l.v41().draft_dspark({r}, &out, &d.logits, &d.conf);
  d.tokens = out[0];
  return d;
}

}  // namespace

TEST(V41Dspark, MatchesTheNumpyReferenceAfterPositionZero) {
  const std::string dir = drafter_data() + "/v41-tiny-ezero";
  SafeTensors ref = SafeTensors::open(dir + "/dspark-reference.safetensors");
  const std::vector<int32_t> ids = ids_of(ref, "ids"), want_drafts = ids_of(ref, "drafts");
  Loaded a(true, dir);
  const std::vector<float> backbone = step(*a.model, {{0, 0, {ids[0]}, 0}});
  const Draft d = draft(a, {0, 0, ids[1], kB});
  const std::vector<float> wb = f32_of(ref, "backbone_logits"), wd = f32_of(ref, "draft_logits"),
                           wc = f32_of(ref, "conf");
  ASSERT_EQ(backbone.size(), wb.size());
  ASSERT_EQ(d.logits.size(), wd.size());
  ASSERT_EQ(d.conf.size(), wc.size());
  // Reference numerics (f32 activations, double sums rounded once per op) against float64: the
  // bound of the backbone's own check against HF float64 (V41Fixture: relative L2 1e-4 per
  // position), the drafter being three more blocks of the same ops and a head (the MTP's
  // check, test_v4_mtp.cpp, measured 1.9e-7 under the same bound).
  const double eb = rel_l2(backbone.data(), wb.data(), wb.size());
  EXPECT_LT(eb, 1e-4);
  for (int i = 0; i < kB; ++i) {
    const double e = rel_l2(d.logits.data() + i * kV, wd.data() + i * kV, size_t(kV));
    std::printf("[dspark] after position 0 vs numpy float64: draft %d rel L2 %.2e (backbone %.2e), conf %.6g vs %.6g\n",
                i, e, eb, d.conf[size_t(i)], wc[size_t(i)]);
    EXPECT_LT(e, 1e-4);
    // conf: one f32 dot of D + R = 512 terms of O(1) values, in two parts (x, the Markov
    // embedding) added in f32: its error is that of x (relative 1e-4 at most, as the logits)
    // times |proj| |x|, well inside 1e-3 of the logit's scale here (|conf| ~ 1).
    EXPECT_NEAR(d.conf[size_t(i)], wc[size_t(i)], 1e-3 * std::max(1.0f, std::fabs(wc[size_t(i)])));
  }
  // The drafts are argmaxes: the script prints the top-2 gaps (>= 7e-3 here, against logit
  // errors of 1e-4 relative of logits of order 1), so they must agree exactly.
  EXPECT_EQ(d.tokens, want_drafts);
  // Not vacuous: the drafts' logits differ from one another (the Markov bias and the positions)
  // and from the backbone's.
  EXPECT_GT(rel_l2(wd.data(), wb.data(), wb.size()), 0.1);
  EXPECT_GT(rel_l2(wd.data() + kV, wd.data(), size_t(kV)), 0.01);
}

TEST(V41Dspark, DraftDoesNotDependOnChunkingOrBatching) {
  // 150 computed positions: the context ring (128 rows) has wrapped. Then one decode step.
  const int L = 150;
  const std::vector<int32_t> t = tokens(L + 2, 1, kIds), other = tokens(90, 2, kIds);
  Loaded a(true);
  ASSERT_TRUE(a.model->has_drafter());
  step(*a.model, {{0, 0, sub(t, 0, L), 0}});
  const Draft da = draft(a, {0, L - 1, t[size_t(L)], kB});
  ASSERT_EQ(da.tokens.size(), size_t(kB));
  // The same positions in chunks of 100 (alone), 30 (with another sequence's prefill), then 20
  // decode steps batched with the other sequence.
  Loaded b(true);
  step(*b.model, {{1, 0, sub(t, 0, 100), 0}});
  step(*b.model, {{1, 100, sub(t, 100, 130), 0}, {2, 0, sub(other, 0, 60), 4}});
  for (int p = 130; p < L; ++p) step(*b.model, {{2, 60 + p - 130, {other[size_t(60 + p - 130)]}, 4}, {1, p, {t[size_t(p)]}, 0}});
  const Draft db = draft(b, {1, L - 1, t[size_t(L)], kB});
  EXPECT_EQ(db.tokens, da.tokens);
  EXPECT_TRUE(same(db.logits, da.logits));
  EXPECT_TRUE(same(db.conf, da.conf));
  // Drafting several sequences at once gives each its own draft, and fewer tokens are a prefix.
  std::vector<std::vector<int32_t>> out;
  b.model->draft({{2, 79, 5, 2}, {1, L - 1, t[size_t(L)], 3}}, &out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1], sub(da.tokens, 0, 3));
  EXPECT_EQ(out[0].size(), 2u);
}

TEST(V41Dspark, DraftLeavesTheSlotAndSlotCopiesDraftAlike) {
  const int L = 140;
  const std::vector<int32_t> t = tokens(L + 2, 3, kIds);
  Loaded a(true), plain(false);
  step(*a.model, {{0, 0, sub(t, 0, L), 0}});
  step(*plain.model, {{0, 0, sub(t, 0, L), 0}});
  const Draft d1 = draft(a, {0, L - 1, t[size_t(L)], kB});
  const Draft d2 = draft(a, {0, L - 1, t[size_t(L)], kB});
  EXPECT_EQ(d1.tokens, d2.tokens);
  EXPECT_TRUE(same(d1.logits, d2.logits));
  // A copy of the slot drafts the same (its DSpark rings came with it).
  a.model->copy_cache({{CacheCopy::Kind::Slot, 0, 3}});
  const Draft d3 = draft(a, {3, L - 1, t[size_t(L)], kB});
  EXPECT_EQ(d3.tokens, d1.tokens);
  EXPECT_TRUE(same(d3.logits, d1.logits));
  // The backbone is untouched by the drafter: the next position's logits equal the plain model's.
  EXPECT_TRUE(same(step(*a.model, {{0, L, {t[size_t(L)]}, 0}}), step(*plain.model, {{0, L, {t[size_t(L)]}, 0}})));
  // ... and the context rows follow the sequence: a draft one position later differs from the
  // first (another anchor, another context row in the window).
  const Draft d4 = draft(a, {0, L, t[size_t(L + 1)], kB});
  EXPECT_FALSE(same(d4.logits, d1.logits));
}

TEST(V41Dspark, RollbackRestoresTheContextRings) {
  // The engine's verify step: snapshot the slot, run [a, d0, d1, d2] (rejected), restore the
  // snapshot, compute the accepted token alone. The verify wrote context rows of positions
  // L+1..L+3 into ring slots a later draft reads as positions L-126..L-124: the restore must
  // bring back the rings with the rest of the slot, so that the draft equals a clean run's.
  const int L = 140;
  const std::vector<int32_t> t = tokens(L + 2, 4, kIds);
  Loaded a(true), clean(true);
  step(*a.model, {{0, 0, sub(t, 0, L), 0}});
  step(*clean.model, {{0, 0, sub(t, 0, L + 1), 0}});
  a.model->copy_cache({{CacheCopy::Kind::Slot, 0, 1}});
  step(*a.model, {{0, L, {t[size_t(L)], 7, 8, 9}, 0}});
  a.model->copy_cache({{CacheCopy::Kind::Slot, 1, 0}});
  step(*a.model, {{0, L, {t[size_t(L)]}, 0}});
  const Draft d = draft(a, {0, L, t[size_t(L + 1)], kB}), want = draft(clean, {0, L, t[size_t(L + 1)], kB});
  EXPECT_EQ(d.tokens, want.tokens);
  EXPECT_TRUE(same(d.logits, want.logits));
  // Not vacuous: without the restore the rejected rows stay in the window and change the draft.
  Loaded b(true);
  step(*b.model, {{0, 0, sub(t, 0, L), 0}});
  step(*b.model, {{0, L, {t[size_t(L)], 7, 8, 9}, 0}});
  const Draft stale = draft(b, {0, L, t[size_t(L + 1)], kB});
  EXPECT_FALSE(same(stale.logits, want.logits));
}

TEST(V41Dspark, QuantizingNumerics) {
  // Official (f32 activations, FP8 QDQ of the context and draft rows) and fast (bf16, the rings
  // stored as packed FP8 rows on the CPU): the draft is a function of the slot (a copy drafts
  // the same, twice the same), its tokens are in the vocabulary, and the backbone is untouched.
  const int L = 140;
  const std::vector<int32_t> t = tokens(L + 1, 5, kIds);
  for (Numerics n : {Numerics::Official, Numerics::Fast}) {
    SCOPED_TRACE(numerics_name(n));
    Loaded a(true, kDir, n), plain(false, kDir, n);
    step(*a.model, {{0, 0, sub(t, 0, L), 0}});
    step(*plain.model, {{0, 0, sub(t, 0, L), 0}});
    const Draft d1 = draft(a, {0, L - 1, t[size_t(L)], kB});
    a.model->copy_cache({{CacheCopy::Kind::Slot, 0, 2}});
    const Draft d2 = draft(a, {2, L - 1, t[size_t(L)], kB});
    ASSERT_EQ(d1.tokens.size(), size_t(kB));
    for (int32_t tok : d1.tokens) EXPECT_TRUE(tok >= 0 && tok < kV);
    EXPECT_EQ(d2.tokens, d1.tokens);
    EXPECT_TRUE(same(d2.logits, d1.logits));
    for (float v : d1.logits) ASSERT_TRUE(std::isfinite(v));
    EXPECT_TRUE(same(step(*a.model, {{0, L, {t[size_t(L)]}, 0}}), step(*plain.model, {{0, L, {t[size_t(L)]}, 0}})));
  }
}

TEST(V41Dspark, ConfidenceCut) {
  // DraftRequest::min_survival keeps the drafts while prod sigmoid(conf) >= it: a prefix of the
  // uncut draft, as long as the confidences (the same draft's, returned) say.
  const int L = 140;
  const std::vector<int32_t> t = tokens(L + 1, 6, kIds);
  Loaded a(true);
  step(*a.model, {{0, 0, sub(t, 0, L), 0}});
  const Draft full = draft(a, {0, L - 1, t[size_t(L)], kB});
  std::vector<double> survival;  // after each position
  double sv = 1.0;
  for (float c : full.conf) survival.push_back(sv *= 1.0 / (1.0 + std::exp(-double(c))));
  for (double ms : {1e-9, survival[0] * 0.999, survival[1] * 0.999, survival[0] * 1.001, 1.0}) {
    std::vector<std::vector<int32_t>> out;
    DraftRequest r{0, L - 1, t[size_t(L)], kB, ms};
    a.model->draft({r}, &out);
    size_t want = 0;
    while (want < survival.size() && survival[want] >= ms) ++want;
    EXPECT_EQ(out[0], sub(full.tokens, 0, int(want))) << "min_survival " << ms;
  }
}
