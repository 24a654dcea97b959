// Engine behaviour with the fake model (fake_model.h): batching, budgets, preemption,
// cancellation, stops and validation. The fake aborts on any cache bookkeeping error.
#include <gtest/gtest.h>

#include "engine_harness.h"
#include "fake_model.h"
#include "runtime/engine_internal.h"

namespace dil::testing {
namespace {

constexpr int kVocab = 64;

EngineOptions base_options() {
  EngineOptions o;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 256;
  o.max_model_len = 512;
  o.kv_blocks = 200;
  o.block_tokens = 128;
  o.seed = 12345;
  return o;
}

std::unique_ptr<Engine> fake_engine(const EngineOptions& o, std::shared_ptr<FakeModelStats> st = nullptr) {
  if (!st) st = std::make_shared<FakeModelStats>();
  return runtime::make_engine_with_model(o, std::make_unique<FakeModel>(kVocab, st));
}

void expect_pool_empty(const Engine& e) {
  EXPECT_TRUE(wait_stats(e, [](const EngineStats& s) {
    return s.kv_blocks_used == 0 && s.kv_slots_used == 0 && s.running == 0 && s.waiting == 0 && s.kv_bytes_used == 0;
  }));
}

TEST(EngineFake, ConcurrentRequestsMatchAlone) {
  auto reqs = mixed_requests(kVocab);
  auto e = fake_engine(base_options());
  auto alone = run_alone(*e, reqs);
  auto together = run_together(*e, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_NE(alone[i].finish, FinishReason::Error) << alone[i].error;
    EXPECT_EQ(alone[i], together[i]) << "request " << i;
  }
  expect_pool_empty(*e);
}

TEST(EngineFake, PreemptionUnderPressureKeepsOutputs) {
  auto reqs = mixed_requests(kVocab);
  auto ref = run_together(*fake_engine(base_options()), reqs);
  EngineOptions o = base_options();
  o.kv_blocks = 5;  // the 16 requests want ~30 blocks at once
  auto e = fake_engine(o);
  auto got = run_together(*e, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(ref[i], got[i]) << "request " << i;
  EXPECT_GE(e->stats().preemptions, 3);
  expect_pool_empty(*e);
  EXPECT_EQ(e->stats().kv_blocks_total, 5);
}

TEST(EngineFake, TokenBudgetDoesNotChangeOutputs) {
  auto reqs = mixed_requests(kVocab);
  std::vector<std::vector<Result>> outs;
  for (int budget : {7, 64, 4096}) {
    EngineOptions o = base_options();
    o.max_num_batched_tokens = budget;
    auto st = std::make_shared<FakeModelStats>();
    auto e = fake_engine(o, st);
    outs.push_back(run_together(*e, reqs));
    EXPECT_LE(st->max_step_tokens, budget);
    EXPECT_LE(st->max_step_seqs, o.max_num_seqs);
    if (budget == 4096) {
      EXPECT_GT(st->max_step_seqs, 8);  // really batched
    }
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(outs[0][i], outs[1][i]) << "request " << i;
    EXPECT_EQ(outs[0][i], outs[2][i]) << "request " << i;
  }
}

TEST(EngineFake, MaxNumSeqsLimitsTheBatch) {
  EngineOptions o = base_options();
  o.max_num_seqs = 3;
  auto st = std::make_shared<FakeModelStats>();
  auto e = fake_engine(o, st);
  auto reqs = mixed_requests(kVocab);
  auto got = run_together(*e, reqs);
  auto ref = run_alone(*fake_engine(base_options()), reqs);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(ref[i], got[i]) << "request " << i;
  EXPECT_EQ(st->max_step_seqs, 3);
}

TEST(EngineFake, CancelMidPrefillAndMidDecodeFreesState) {
  auto st = std::make_shared<FakeModelStats>();
  EngineOptions o = base_options();
  o.max_num_batched_tokens = 8;
  o.max_model_len = 2048;
  st->step_delay_us = 1000;
  auto e = fake_engine(o, st);
  // A bystander that must finish with the same tokens as alone.
  GenRequest other = mixed_requests(kVocab)[7];
  auto ref = run_alone(*fake_engine(base_options()), {other});

  GenRequest pre;
  pre.id = "prefill";
  pre.prompt.assign(1000, 7);
  pre.stop.max_tokens = 5;
  auto s_other = e->submit(other);
  auto s_pre = e->submit(pre);
  ASSERT_TRUE(wait_stats(*e, [](const EngineStats& s) { return s.kv_blocks_used >= 3; }));  // both admitted
  e->cancel("prefill");
  Result r = drain(*s_pre);
  EXPECT_EQ(r.finish, FinishReason::Cancelled);
  EXPECT_TRUE(r.tokens.empty());
  EXPECT_EQ(drain(*s_other), ref[0]);
  expect_pool_empty(*e);

  GenRequest dec;
  dec.id = "decode";
  dec.prompt = {3, 4, 5};
  dec.stop.max_tokens = 400;
  dec.stop.ignore_eos = true;
  auto s_dec = e->submit(dec);
  GenOutput first;
  ASSERT_TRUE(s_dec->next(&first, std::chrono::seconds(20)));
  ASSERT_FALSE(first.tokens.empty());
  e->cancel("decode");
  r = drain(*s_dec);
  EXPECT_EQ(r.finish, FinishReason::Cancelled);
  EXPECT_LT(int(first.tokens.size() + r.tokens.size()), 400);
  expect_pool_empty(*e);
}

TEST(EngineFake, CancelAfterFinishAndUnknownIdsAreHarmless) {
  auto e = fake_engine(base_options());
  GenRequest r = mixed_requests(kVocab)[2];
  Result a = drain(*e->submit(r));
  e->cancel(r.id);
  e->cancel("never-submitted");
  Result b = drain(*e->submit(r));  // the id is free again
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.finish, FinishReason::Length);
  expect_pool_empty(*e);
}

TEST(EngineFake, StopTokensEosAndIgnoreEos) {
  auto e = fake_engine(base_options());
  GenRequest r;
  r.id = "s";
  r.prompt = {10, 11, 12};
  r.sampling.temperature = 0;
  r.stop.max_tokens = 12;
  r.stop.ignore_eos = true;
  Result full = drain(*e->submit(r));
  ASSERT_EQ(full.tokens.size(), 12u);
  EXPECT_EQ(full.finish, FinishReason::Length);
  EXPECT_EQ(full.completion_tokens, 12);

  // Stop at the first occurrence of the 4th generated token.
  const int32_t stop = full.tokens[3];
  size_t first = std::find(full.tokens.begin(), full.tokens.end(), stop) - full.tokens.begin();
  r.stop.stop_token_ids = {stop};
  Result s = drain(*e->submit(r));
  EXPECT_EQ(s.finish, FinishReason::Stop);
  EXPECT_EQ(s.stop_token, stop);
  EXPECT_EQ(s.tokens, std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + first));
  EXPECT_EQ(s.completion_tokens, int(first) + 1);

  // EOS (id 1) forced by a bias: stops at once unless ignored.
  r.stop.stop_token_ids.clear();
  r.sampling.logit_bias = {{1, 100.0f}};
  r.stop.ignore_eos = false;
  Result eos = drain(*e->submit(r));
  EXPECT_EQ(eos.finish, FinishReason::Stop);
  EXPECT_EQ(eos.stop_token, 1);
  EXPECT_TRUE(eos.tokens.empty());
  r.stop.ignore_eos = true;
  r.stop.max_tokens = 3;
  Result ign = drain(*e->submit(r));
  EXPECT_EQ(ign.finish, FinishReason::Length);
  EXPECT_EQ(ign.tokens, (std::vector<int32_t>{1, 1, 1}));
  expect_pool_empty(*e);
}

TEST(EngineFake, MinTokensMasksEosAndStopIdsUntilReached) {
  auto e = fake_engine(base_options());
  GenRequest r;
  r.id = "m";
  r.prompt = {10, 11, 12};
  r.sampling.temperature = 0;
  r.sampling.logit_bias = {{1, 100.0f}};  // EOS (id 1) would win every step
  r.stop.max_tokens = 12;
  r.stop.min_tokens = 4;
  Result a = drain(*e->submit(r));
  EXPECT_EQ(a.finish, FinishReason::Stop);
  EXPECT_EQ(a.stop_token, 1);
  ASSERT_EQ(a.tokens.size(), 4u);  // four tokens, none of them EOS, then EOS
  for (int32_t t : a.tokens) EXPECT_NE(t, 1);
  EXPECT_EQ(a.completion_tokens, 5);
  // A stop id is held back the same way.
  r.sampling.logit_bias = {{7, 100.0f}};
  r.stop.stop_token_ids = {7};
  r.stop.min_tokens = 2;
  Result b = drain(*e->submit(r));
  EXPECT_EQ(b.finish, FinishReason::Stop);
  EXPECT_EQ(b.stop_token, 7);
  EXPECT_EQ(b.tokens.size(), 2u);
  // allowed_token_ids restrict every draw.
  r.sampling.logit_bias.clear();
  r.stop.stop_token_ids.clear();
  r.stop.min_tokens = 0;
  r.stop.ignore_eos = true;
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 5;
  r.sampling.allowed_token_ids = {20, 21};
  Result c = drain(*e->submit(r));
  ASSERT_EQ(c.tokens.size(), 12u);
  for (int32_t t : c.tokens) EXPECT_TRUE(t == 20 || t == 21) << t;
  r.stop.min_tokens = 13;  // more than max_tokens
  EXPECT_EQ(drain(*e->submit(r)).finish, FinishReason::Error);
  expect_pool_empty(*e);
}

TEST(EngineFake, InvalidRequestsFinishWithError) {
  auto e = fake_engine(base_options());
  auto error_of = [&](GenRequest r) {
    Result x = drain(*e->submit(std::move(r)));
    EXPECT_EQ(x.finish, FinishReason::Error);
    return x.error;
  };
  GenRequest ok;
  ok.prompt = {1, 2};
  GenRequest r = ok;
  r.prompt.clear();
  EXPECT_NE(error_of(r).find("empty"), std::string::npos);
  r = ok;
  r.prompt = {1, kVocab};
  EXPECT_NE(error_of(r).find("outside"), std::string::npos);
  r = ok;
  r.stop.max_tokens = 511;
  EXPECT_NE(error_of(r).find("context length"), std::string::npos);
  r = ok;
  r.sampling.top_p = 0;
  EXPECT_NE(error_of(r).find("top_p"), std::string::npos);
  r = ok;
  r.sampling.logprobs = 21;
  EXPECT_NE(error_of(r).find("logprobs"), std::string::npos);
  // Still serving.
  EXPECT_EQ(drain(*e->submit(ok)).finish, FinishReason::Length);
}

TEST(EngineFake, UnseededRequestsFollowTheEngineSeed) {
  GenRequest r;
  r.prompt = {4, 5, 6};
  r.sampling.temperature = 1.0f;
  r.stop.max_tokens = 16;
  r.stop.ignore_eos = true;
  std::vector<Result> runs;
  for (uint64_t seed : {7ull, 7ull, 8ull}) {
    EngineOptions o = base_options();
    o.seed = seed;
    runs.push_back(run_alone(*fake_engine(o), {r, r})[0]);
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_NE(runs[0].tokens, runs[2].tokens);
}

TEST(EngineFake, ShutdownEndsOpenStreams) {
  auto st = std::make_shared<FakeModelStats>();
  st->step_delay_us = 2000;
  auto e = fake_engine(base_options(), st);
  GenRequest r;
  r.prompt = {4, 5, 6};
  r.stop.max_tokens = 500;
  r.stop.ignore_eos = true;
  auto s = e->submit(r);
  ASSERT_TRUE(wait_stats(*e, [](const EngineStats& x) { return x.running == 1; }));
  e->shutdown();
  Result x = drain(*s);
  EXPECT_EQ(x.finish, FinishReason::Error);
  EXPECT_EQ(drain(*e->submit(r)).finish, FinishReason::Error);
}

TEST(EngineFake, RejectsBadGeometry) {
  EngineOptions o = base_options();
  o.block_tokens = 100;
  EXPECT_THROW(fake_engine(o), Error);
  o = base_options();
  o.kv_blocks = 3;  // 384 tokens < max_model_len 512
  EXPECT_THROW(fake_engine(o), Error);
}

}  // namespace
}  // namespace dil::testing
