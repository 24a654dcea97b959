// Structured output in the engine (GenRequest::constraint) with the fake model: masks reach
// the sampler, EOS only when complete, stuck grammars finish, the budget is passed down, the
// masks are computed off the engine thread, and nothing leaks into unconstrained requests.
#include <gtest/gtest.h>

#include <mutex>
#include <set>
#include <thread>

#include "alternating_constraint.h"
#include "engine_harness.h"
#include "fake_model.h"
#include "runtime/engine_internal.h"

namespace dil::testing {
namespace {

constexpr int kVocab = 64;
using Alternating = AlternatingConstraint<kVocab>;

EngineOptions options() {
  EngineOptions o;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 256;
  o.max_model_len = 512;
  o.kv_blocks = 200;
  o.block_tokens = 128;
  o.seed = 4242;
  return o;
}

std::unique_ptr<Engine> engine(EngineOptions o = options()) {
  return runtime::make_engine_with_model(o, std::make_unique<FakeModel>(kVocab));
}

GenRequest request(const std::string& id, std::shared_ptr<TokenConstraint> c, int max_tokens, float temperature) {
  GenRequest r;
  r.id = id;
  r.prompt = {5, 9, 17, 33};
  r.stop.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  r.sampling.seed = 7;
  r.sampling.logit_bias = {{1, 30.0f}};  // the model would love to stop at once
  r.constraint = std::move(c);
  return r;
}

TEST(EngineConstraint, MaskedTokensAreNeverSampledAndEosWaitsForCompletion) {
  auto e = engine();
  for (float temp : {0.0f, 1.0f}) {
    auto c = std::make_shared<Alternating>(7);
    Result r = drain(*e->submit(request("a", c, 20, temp)));
    ASSERT_EQ(r.tokens.size(), 7u) << r;
    expect_alternating(r.tokens);
    EXPECT_EQ(r.finish, FinishReason::Stop);
    EXPECT_EQ(r.stop_token, 1);  // EOS, as soon as the output is complete
    EXPECT_EQ(c->seen_, r.tokens);
    // remaining = max_tokens - generated - 1 at each step.
    ASSERT_EQ(c->remaining_.size(), 8u);
    for (size_t i = 0; i < c->remaining_.size(); ++i) EXPECT_EQ(c->remaining_[i], 20 - int(i) - 1);
    // Masks are computed on the mask worker, not on the engine thread that samples.
    EXPECT_EQ(c->threads_.size(), 1u);
    EXPECT_NE(*c->threads_.begin(), std::this_thread::get_id());
  }
  EXPECT_GT(e->stats().mask_seconds_total, 0.0);
}

TEST(EngineConstraint, CompleteWithoutEosOrStuckGrammarsFinish) {
  auto e = engine();
  GenRequest r = request("b", std::make_shared<Alternating>(3), 20, 0.0f);
  r.stop.ignore_eos = true;  // complete, and EOS may not end it: nothing is allowed -> Stop
  Result done = drain(*e->submit(r));
  EXPECT_EQ(done.tokens.size(), 3u);
  EXPECT_EQ(done.finish, FinishReason::Stop);
  EXPECT_EQ(done.stop_token, -1);
  // Not complete and nothing allowed: an error naming structured output.
  Result stuck = drain(*e->submit(request("c", std::make_shared<Alternating>(2, true), 20, 0.0f)));
  EXPECT_EQ(stuck.tokens.size(), 2u);
  EXPECT_EQ(stuck.finish, FinishReason::Error);
  EXPECT_NE(stuck.error.find("structured output"), std::string::npos) << stuck.error;
  // A stop token ends the request exactly when the output is complete, even where the
  // constraint's mask would allow it (60 is even) and the bias wants it.
  GenRequest s = request("d", std::make_shared<Alternating>(2), 20, 0.0f);
  s.sampling.logit_bias = {{60, 50.0f}};
  s.stop.ignore_eos = true;
  s.stop.stop_token_ids = {60};
  Result st = drain(*e->submit(s));
  ASSERT_EQ(st.tokens.size(), 2u) << st;
  EXPECT_NE(st.tokens[0], 60);
  EXPECT_EQ(st.finish, FinishReason::Stop);
  EXPECT_EQ(st.stop_token, 60);
}

// allowed_token_ids and min_tokens (main's vLLM fields) narrow a constrained row's mask before
// sampling: the sampler never meets an empty intersection.
TEST(EngineConstraint, AllowedTokenIdsAndMinTokensNarrowTheMask) {
  auto e = engine();
  for (float temp : {0.0f, 1.0f}) {
    GenRequest r = request("a", std::make_shared<Alternating>(6), 20, temp);
    r.sampling.allowed_token_ids = {4, 7, 1};  // 1: EOS
    Result got = drain(*e->submit(r));
    ASSERT_EQ(got.tokens.size(), 6u) << got;
    expect_alternating(got.tokens);
    for (int32_t t : got.tokens) EXPECT_TRUE(t == 4 || t == 7) << t;
    EXPECT_EQ(got.finish, FinishReason::Stop);
    EXPECT_EQ(got.stop_token, 1);
  }
  // The second token must be odd, and allowed_token_ids has only even ones: the request ends
  // with an error instead of sampling a token either side refuses.
  GenRequest even = request("b", std::make_shared<Alternating>(4), 20, 1.0f);
  even.sampling.allowed_token_ids = {4, 6};
  Result stuck = drain(*e->submit(even));
  ASSERT_EQ(stuck.tokens.size(), 1u) << stuck;
  EXPECT_TRUE(stuck.tokens[0] == 4 || stuck.tokens[0] == 6);
  EXPECT_EQ(stuck.finish, FinishReason::Error);
  EXPECT_NE(stuck.error.find("allowed_token_ids"), std::string::npos) << stuck.error;
  // min_tokens past the grammar's end: once the output is complete only EOS may follow, so the
  // ban yields rather than leave nothing; before that the grammar already holds EOS back.
  GenRequest min = request("c", std::make_shared<Alternating>(3), 20, 0.0f);
  min.stop.min_tokens = 5;
  Result m = drain(*e->submit(min));
  ASSERT_EQ(m.tokens.size(), 3u) << m;
  expect_alternating(m.tokens);
  EXPECT_EQ(m.finish, FinishReason::Stop);
  EXPECT_EQ(m.stop_token, 1);
}

TEST(EngineConstraint, UnconstrainedRequestsAreUnchangedAndPreemptionKeepsTheState) {
  auto reqs = mixed_requests(kVocab);
  auto ref = run_together(*engine(), reqs);
  // The same mix with every third request constrained, under KV pressure (preemption by
  // recomputation must not advance a constraint again).
  std::vector<std::shared_ptr<Alternating>> cons;
  for (size_t i = 0; i < reqs.size(); i += 3) {
    cons.push_back(std::make_shared<Alternating>(100));
    reqs[i].constraint = cons.back();
    reqs[i].stop.ignore_eos = true;
  }
  EngineOptions o = options();
  o.kv_blocks = 5;
  auto e = engine(o);
  auto got = run_together(*e, reqs);
  size_t k = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (i % 3 == 0) {
      expect_alternating(got[i].tokens);
      EXPECT_EQ(cons[k++]->seen_, got[i].tokens) << "request " << i;
      EXPECT_EQ(got[i].finish, FinishReason::Length);
    } else {
      EXPECT_EQ(ref[i], got[i]) << "request " << i;
    }
  }
  EXPECT_GE(e->stats().preemptions, 1);
}

}  // namespace
}  // namespace dil::testing
