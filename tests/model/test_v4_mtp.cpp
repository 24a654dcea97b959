// V4's MTP drafter (model/v4_mtp.cpp) on v4-tiny with random mtp.0 weights (the drafter
// fixture, tests/data/make_drafter_fixtures.sh), CPU, reference numerics, where a row's numbers
// do not depend on what else its step holds or how the sequence was chunked (double sums rounded
// once per output): so every comparison below is exact (bit for bit), no tolerance to derive.
// - Against an independent float64 numpy computation written from model-spec §3 / §3.10
//   (tests/data/mtp_reference.py, made with the fixture): the MTP's logits at position 0 (the
//   backbone's streams after one token, enorm/hnorm, e_proj/h_proj, the block, its hc_head and
//   norm, the shared head); the script itself first reproduces the fixture's HF float64 logits
//   of the backbone there (1.8e-7), so the block code it shares with the MTP is checked too.
// - The draft of a sequence (logits of every chained step) is the same whether its positions
//   came in one prefill chunk or in chunks and decode steps batched with another sequence:
//   the MTP block's ring rows (the pairs of every earlier position, written one position behind
//   the backbone) and the slot's saved streams are the function of the tokens alone.
// - A slot copy drafts like its source (the MTP state is slot state). Drafting leaves the slot
//   as it was: the same draft twice, and the target's next logits
//   equal those of a model without the drafter (the MTP block never disturbs the backbone).
// - The structure, on a variant whose h_proj is zero (the block then sees token embeddings
//   only): the draft's window is the pairs (target at q, token q+1) of the last 128 positions,
//   exactly (a token just outside changes nothing, the oldest inside changes the logits), and
//   the chain's step 2 equals a fresh draft one position later (its own ring row for the
//   previous position is the one the next forward writes).
#include <gtest/gtest.h>

#include "core/safetensors.h"
#include "drafter_util.h"
#include "fixture_util.h"

using namespace dil;
using namespace dil::test;

namespace {

const std::string kDir = drafter_data() + "/v4-tiny";
constexpr int kIds = 1024;  // token ids below this

struct Loaded : DrafterModel {
  explicit Loaded(bool mtp, const std::string& dir = kDir, Numerics n = Numerics::Reference)
      : DrafterModel(mtp, dir, n) {}
};

std::vector<float> draft_logits(Model& m, const DraftRequest& r, std::vector<int32_t>* tokens = nullptr) {
  std::vector<std::vector<int32_t>> d;
  std::vector<float> lg;
  m.draft({r}, &d, &lg);
  if (tokens) *tokens = d[0];
  return lg;
}


}  // namespace

TEST(V4Mtp, MatchesTheNumpyReferenceAtPositionZero) {
  SafeTensors ref = SafeTensors::open(kDir + "/mtp-reference.safetensors");
  const std::vector<int32_t> ids = ids_of(ref, "ids");
  Loaded a(true);
  const std::vector<float> backbone = step(*a.model, {{0, 0, {ids[0]}, 0}});
  const std::vector<float> mtp = draft_logits(*a.model, {0, 0, ids[1], 1});
  // Reference numerics (f32 activations, double sums rounded once per op) against float64:
  // the bound of the backbone's own check against HF float64 (V4Fixture.ReferenceModeMatchesHF:
  // relative L2 1e-4 per position), the MTP being one more block of the same ops and a head.
  auto rel = [](const std::vector<float>& g, const std::vector<float>& w) { return rel_l2(g.data(), w.data(), w.size()); };
  const std::vector<float> wb = f32_of(ref, "backbone_logits"), wm = f32_of(ref, "mtp_logits");
  ASSERT_EQ(backbone.size(), wb.size());
  ASSERT_EQ(mtp.size(), wm.size());
  const double eb = rel(backbone, wb), em = rel(mtp, wm);
  std::printf("[mtp] position 0 vs numpy float64: backbone rel L2 %.2e, MTP rel L2 %.2e\n", eb, em);
  EXPECT_LT(eb, 1e-4);
  EXPECT_LT(em, 1e-4);
  // Not vacuous: the MTP's logits are not the backbone's (another prediction, another head path).
  EXPECT_GT(rel(wm, wb), 0.1);
}

TEST(V4Mtp, DraftDoesNotDependOnChunkingOrBatching) {
  // 150 computed positions: the window ring (128 rows) has wrapped.
  const int L = 150, k = 3;
  const std::vector<int32_t> t = tokens(L + 1, 1, kIds), other = tokens(90, 2, kIds);
  const int64_t V = 1024;
  Loaded a(true);
  ASSERT_TRUE(a.model->has_drafter());
  step(*a.model, {{0, 0, sub(t, 0, L), 0}});
  std::vector<std::vector<int32_t>> da;
  std::vector<float> la;
  a.model->draft({{0, L - 1, t[L], k}}, &da, &la);
  ASSERT_EQ(da.size(), 1u);
  ASSERT_EQ(da[0].size(), size_t(k));
  ASSERT_EQ(la.size(), size_t(k * V));
  // Drafting twice gives the same: the chain ran in its own ring rows.
  std::vector<std::vector<int32_t>> da2;
  std::vector<float> la2;
  a.model->draft({{0, L - 1, t[L], k}}, &da2, &la2);
  EXPECT_TRUE(same(la, la2));
  // A copy of the slot (prefix-cache snapshot, fork, speculative rollback) drafts the same: the
  // MTP's ring and saved streams are part of the slot.
  a.model->copy_cache({{CacheCopy::Kind::Slot, 0, 3}});
  std::vector<float> la3;
  a.model->draft({{3, L - 1, t[L], k}}, &da2, &la3);
  EXPECT_TRUE(same(la, la3));

  // Slot 1: chunks of 70 and 77 batched with another sequence in slot 2, then decode steps.
  Loaded b(true);
  step(*b.model, {{2, 0, sub(other, 0, 40), 4}, {1, 0, sub(t, 0, 70), 0}});
  step(*b.model, {{1, 70, sub(t, 70, 147), 0}, {2, 40, sub(other, 40, 90), 4}});
  for (int p = 147; p < L; ++p) step(*b.model, {{1, p, {t[size_t(p)]}, 0}});
  std::vector<std::vector<int32_t>> db;
  std::vector<float> lb;  // [k, 2, V]
  b.model->draft({{2, 89, 5, 2}, {1, L - 1, t[L], k}}, &db, &lb);
  ASSERT_EQ(db.size(), 2u);
  EXPECT_EQ(db[0].size(), 2u);
  EXPECT_EQ(db[1], da[0]);
  ASSERT_EQ(lb.size(), size_t(k * 2 * V));
  for (int j = 0; j < k; ++j) {
    std::vector<float> row(lb.begin() + (2 * j + 1) * V, lb.begin() + (2 * j + 2) * V);
    std::vector<float> want(la.begin() + j * V, la.begin() + (j + 1) * V);
    EXPECT_TRUE(same(row, want)) << "chain step " << j;
  }

  // The target after drafting: the same logits as a model without the drafter.
  const std::vector<float> next = step(*a.model, {{0, L, {t[L]}, 0}});
  Loaded plain(false);
  EXPECT_FALSE(plain.model->has_drafter());
  step(*plain.model, {{0, 0, sub(t, 0, L), 0}});
  EXPECT_TRUE(same(step(*plain.model, {{0, L, {t[L]}, 0}}), next));
  std::printf("[mtp] draft after %d tokens: %d %d %d\n", L, da[0][0], da[0][1], da[0][2]);
}

// v4-tiny-hzero: mtp.0.h_proj = 0, so the block's input is e_proj(enorm(embed(token))) on every
// stream and the target's streams drop out: a ring row at position q is a function of (token
// q+1, q) alone, and a draft's logits of the tokens whose rows its window holds. Exact, because
// h_proj(x) is then exactly 0 for every x.
const std::string kHZero = drafter_data() + "/v4-tiny-hzero";


std::vector<float> after_prefill(const std::vector<int32_t>& t, int L, const DraftRequest& r) {
  Loaded a(true, kHZero);
  step(*a.model, {{0, 0, sub(t, 0, L), 0}});
  return draft_logits(*a.model, r);
}

TEST(V4Mtp, WindowHoldsThePairsOfTheLast128Positions) {
  // A draft at position p = L-1 attends to positions [p-127, p]; the ring row at q pairs the
  // target at q with token q+1, so token j enters through row j-1: tokens L-127.. count, token
  // L-128 (row L-129) is outside. The window rows are the MTP's own (written one position behind
  // the backbone): were they paired with token q (off by one), the boundary would move by one.
  const int L = 200;
  std::vector<int32_t> t = tokens(L + 1, 5, kIds);
  const DraftRequest r{0, L - 1, t[L], 1};
  const std::vector<float> base = after_prefill(t, L, r);
  std::vector<int32_t> out = t, in = t;
  out[L - 128] = (out[L - 128] + 1) % 1024;
  in[L - 127] = (in[L - 127] + 1) % 1024;
  EXPECT_TRUE(same(after_prefill(out, L, r), base)) << "a token outside the window changed the draft";
  EXPECT_FALSE(same(after_prefill(in, L, r), base)) << "the oldest token of the window did not count";
}

TEST(V4Mtp, ChainStepIsTheNextDraft) {
  // With h_proj = 0 the chain's step 2 (position p+1, its step-1 token d) sees exactly what a fresh
  // draft at p+1 with token d sees after the target computed p+1: the chain's own row for p (from
  // step 1) must equal the one the next forward writes, so both logits are equal bit for bit.
  const int L = 140;
  const std::vector<int32_t> t = tokens(L + 1, 3, kIds);
  const int64_t V = 1024;
  Loaded a(true, kHZero);
  step(*a.model, {{0, 0, sub(t, 0, L), 0}});
  std::vector<int32_t> d;
  const std::vector<float> chain = draft_logits(*a.model, {0, L - 1, t[L], 2}, &d);
  ASSERT_EQ(chain.size(), size_t(2 * V));
  step(*a.model, {{0, L, {t[L]}, 0}});
  const std::vector<float> fresh = draft_logits(*a.model, {0, L, d[0], 1});
  EXPECT_TRUE(same(fresh, std::vector<float>(chain.begin() + V, chain.end())));
  // A draft of 1 is the first step of a draft of 2.
  Loaded b(true, kHZero);
  step(*b.model, {{0, 0, sub(t, 0, L), 0}});
  EXPECT_TRUE(same(draft_logits(*b.model, {0, L - 1, t[L], 1}), std::vector<float>(chain.begin(), chain.begin() + V)));
  // With the fixture's h_proj the streams matter: the chain (fed its own output streams) and a
  // fresh draft (the target's streams) differ.
  Loaded c(true);
  step(*c.model, {{0, 0, sub(t, 0, L), 0}});
  std::vector<int32_t> dc;
  const std::vector<float> cchain = draft_logits(*c.model, {0, L - 1, t[L], 2}, &dc);
  step(*c.model, {{0, L, {t[L]}, 0}});
  EXPECT_FALSE(same(draft_logits(*c.model, {0, L, dc[0], 1}), std::vector<float>(cchain.begin() + V, cchain.end())));
}

TEST(V4Mtp, RunsInEveryNumericsMode) {
  // Official and fast numerics: the MTP block's calls (FP8 activation quantization before e_proj /
  // h_proj, bf16 activations in fast) are the op sites listed for it (the CPU backend checks every
  // call against the installed plan and aborts on one that is not there), and the drafts are
  // finite tokens (official vs fast: printed, they differ by bf16 roundings).
  const int L = 40;
  const std::vector<int32_t> t = tokens(L + 1, 7, kIds);
  std::vector<std::vector<int32_t>> d[2];
  for (int i = 0; i < 2; ++i) {
    Loaded a(true, kDir, i == 0 ? Numerics::Official : Numerics::Fast);
    step(*a.model, {{0, 0, sub(t, 0, 25), 0}});
    step(*a.model, {{0, 25, sub(t, 25, L), 0}});
    std::vector<float> lg;
    a.model->draft({{0, L - 1, t[L], 3}}, &d[i], &lg);
    ASSERT_EQ(d[i][0].size(), 3u);
    for (float v : lg) ASSERT_TRUE(std::isfinite(v));
  }
  std::printf("[mtp] official draft %d %d %d, fast %d %d %d\n", d[0][0][0], d[0][0][1], d[0][0][2], d[1][0][0],
              d[1][0][1], d[1][0][2]);
}

TEST(V4Mtp, LoadNeedsTheWeights) {
  auto be = make_backend(BackendKind::CPU);
  ModelOptions o;
  o.load_mtp = true;
  // The committed fixture has no mtp.* tensors (and says num_nextn_predict_layers 0).
  EXPECT_THROW(load_model(std::string(DIL_SOURCE_DIR) + "/tests/data/v4-tiny", *be, o), Error);
  EXPECT_THROW(load_model(std::string(DIL_SOURCE_DIR) + "/tests/data/v41-tiny", *be, o), Error);
  // With the weights: V4's MTP block, V4.1's DSpark stages (tests/model/test_v41_dspark.cpp).
  EXPECT_TRUE(load_model(kDir, *be, o)->has_drafter());
  EXPECT_TRUE(load_model(drafter_data() + "/v41-tiny", *be, o)->has_drafter());
}
