// The engine's prefix cache and fork with the fake model (fake_model.h), which aborts when a
// sequence's blocks or slot stop holding its own history (a wrong hit, a restore from the wrong
// snapshot, a shared block written in place). Outputs with the cache equal outputs without it;
// the counters say what was reused; n choices of one prompt compute the prompt once.
#include <gtest/gtest.h>

#include "engine_harness.h"
#include "fake_model.h"
#include "runtime/engine_internal.h"

namespace dil::testing {
namespace {

constexpr int kVocab = 64;

EngineOptions options(bool cache = true) {
  EngineOptions o;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 256;
  o.max_model_len = 1024;
  o.kv_blocks = 200;
  o.block_tokens = 128;
  o.seed = 99;
  o.enable_prefix_cache = cache;
  return o;
}

std::unique_ptr<Engine> engine(const EngineOptions& o, std::shared_ptr<FakeModelStats> st = nullptr) {
  if (!st) st = std::make_shared<FakeModelStats>();
  return runtime::make_engine_with_model(o, std::make_unique<FakeModel>(kVocab, st));
}

std::vector<int32_t> tokens(int n, int salt) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(int32_t((i * 11 + salt * 7 + 3) % kVocab));
  return v;
}

GenRequest request(std::vector<int32_t> prompt, int i, int max_tokens = 6) {
  GenRequest r;
  r.id = "p" + std::to_string(i);
  r.prompt = std::move(prompt);
  r.stop.max_tokens = max_tokens;
  r.stop.ignore_eos = true;
  r.sampling.temperature = i % 2 ? 0.9f : 0.0f;
  r.sampling.seed = 500 + i;
  r.sampling.logprobs = 2;
  return r;
}

// A shared "system prompt" of `shared` tokens, then per request a suffix of its own.
std::vector<GenRequest> shared_prefix_requests(int n, int shared, int suffix) {
  std::vector<GenRequest> reqs;
  for (int i = 0; i < n; ++i) {
    auto p = tokens(shared, 1);
    auto s = tokens(suffix + i % 5, 100 + i);
    p.insert(p.end(), s.begin(), s.end());
    reqs.push_back(request(std::move(p), i));
  }
  return reqs;
}

void expect_same(const std::vector<Result>& got, const std::vector<Result>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NE(want[i].finish, FinishReason::Error) << want[i].error;
    EXPECT_EQ(got[i], want[i]) << "request " << i;
  }
}

void expect_pool_empty(const Engine& e) {
  EXPECT_TRUE(wait_stats(e, [](const EngineStats& s) {
    return s.kv_blocks_used == 0 && s.kv_slots_used == 0 && s.running == 0 && s.waiting == 0 && s.kv_bytes_used == 0;
  }));
}

TEST(EnginePrefix, SharedSystemPromptHitsAndChangesNothing) {
  auto reqs = shared_prefix_requests(8, 300, 20);
  auto cold = run_alone(*engine(options(false)), reqs);
  auto st = std::make_shared<FakeModelStats>();
  auto e = engine(options(), st);
  auto got = run_alone(*e, reqs);
  expect_same(got, cold);
  // The first request is cold; the second diverges from it at 300 and records that point; from
  // the third on every request hits it.
  EXPECT_EQ(got[0].cached_tokens, 0);
  EXPECT_EQ(got[1].cached_tokens, 0);
  for (size_t i = 2; i < got.size(); ++i) EXPECT_EQ(got[i].cached_tokens, 300) << "request " << i;
  const EngineStats s = e->stats();
  int64_t prompt = 0;
  for (const auto& r : reqs) prompt += int64_t(r.prompt.size());
  EXPECT_EQ(s.prefix_cache_queries, prompt);
  EXPECT_EQ(s.prefix_cache_hits, 6 * 300);
  EXPECT_EQ(s.prompt_tokens_cached, 6 * 300);
  EXPECT_EQ(s.prompt_tokens_computed, prompt - 6 * 300);
  // Computed positions: every prompt token not hit, plus the decode steps (the last token of
  // each request is not fed back).
  EXPECT_EQ(st->tokens, prompt - 6 * 300 + int64_t(reqs.size()) * 5);
  expect_pool_empty(*e);
  EXPECT_GT(s.prefix_cache_blocks, 0);
  EXPECT_GT(s.prefix_cache_snapshots, 0);
}

TEST(EnginePrefix, NextTurnHitsThePreviousPromptEnd) {
  auto e = engine(options());
  // Turn 1, then turn 2 = turn 1's prompt + its answer + a new message, for prompt ends on a
  // block boundary, just past it, inside the first window and far inside a block.
  for (int len : {128, 129, 60, 250, 1}) {
    GenRequest t1 = request(tokens(len, len), 0);
    Result r1 = drain(*e->submit(t1));
    GenRequest t2 = t1;
    t2.id = "turn2";
    t2.prompt.insert(t2.prompt.end(), r1.tokens.begin(), r1.tokens.end());
    auto more = tokens(30, 7);
    t2.prompt.insert(t2.prompt.end(), more.begin(), more.end());
    Result r2 = drain(*e->submit(t2));
    EXPECT_EQ(r2.cached_tokens, len) << "prompt of " << len;
    EXPECT_EQ(r2, run_alone(*engine(options(false)), {t2})[0]) << "prompt of " << len;
  }
  // --no-prefix-cache: nothing looked up, nothing found.
  auto off = engine(options(false));
  GenRequest t = request(tokens(200, 3), 0);
  drain(*off->submit(t));
  t.prompt.push_back(5);
  EXPECT_EQ(drain(*off->submit(t)).cached_tokens, 0);
  EXPECT_EQ(off->stats().prefix_cache_queries, 0);
  EXPECT_EQ(off->stats().prefix_cache_snapshots, 0);
}

TEST(EnginePrefix, ConcurrentRequestsSharingAPrefixMatchCold) {
  auto reqs = shared_prefix_requests(12, 400, 30);
  auto cold = run_alone(*engine(options(false)), reqs);
  auto e = engine(options());
  // Warm the shared prefix (two requests: the second records the divergence point), then all.
  run_alone(*e, {reqs[0], reqs[1]});
  auto got = run_together(*e, reqs);
  expect_same(got, cold);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_GE(got[i].cached_tokens, 400) << "request " << i;
  expect_pool_empty(*e);
}

TEST(EnginePrefix, EvictionUnderPressureKeepsOutputs) {
  // 40 requests over 3 system prompts in a pool of 6 blocks and 3 snapshot slots beside 4
  // sequence slots: the cache evicts all the time, sequences are preempted, outputs stay.
  std::vector<GenRequest> reqs;
  for (int i = 0; i < 40; ++i) {
    auto p = tokens(150 + 40 * (i % 3), i % 3);
    auto s = tokens(10 + i % 7, 200 + i);
    p.insert(p.end(), s.begin(), s.end());
    reqs.push_back(request(std::move(p), i, 4 + i % 9));
  }
  auto cold = run_alone(*engine(options(false)), reqs);
  EngineOptions o = options();
  o.kv_blocks = 6;
  o.max_model_len = 512;
  o.max_num_seqs = 4;
  o.prefix_cache_slots = 3;
  o.max_num_batched_tokens = 96;
  auto e = engine(o);
  auto got = run_together(*e, reqs);
  expect_same(got, cold);
  const EngineStats s = e->stats();
  EXPECT_GT(s.prefix_cache_hits, 0);
  EXPECT_GT(s.prefix_cache_evictions, 10);
  EXPECT_GT(s.preemptions, 0);
  std::printf("[prefix pressure] hits %lld of %lld queried tokens, %lld evictions, %lld preemptions\n",
              (long long)s.prefix_cache_hits, (long long)s.prefix_cache_queries, (long long)s.prefix_cache_evictions,
              (long long)s.preemptions);
  expect_pool_empty(*e);
  // Alone again after all that: still the cold outputs.
  expect_same(run_alone(*e, {reqs[3], reqs[17]}), {cold[3], cold[17]});
}

TEST(EnginePrefix, ForkComputesThePromptOnceAndEachChoiceEqualsItsSeedAlone) {
  for (bool cache : {true, false}) {
    SCOPED_TRACE(cache ? "prefix cache on" : "prefix cache off");
    for (int len : {77, 128, 300}) {
      std::vector<GenRequest> choices;
      for (int i = 0; i < 4; ++i) {
        GenRequest r = request(tokens(len, 9), i, 12);
        r.id = "c" + std::to_string(i);
        r.sampling.temperature = 0.8f;
        r.sampling.seed = 1234 + i;  // choice i: seed + i
        choices.push_back(r);
      }
      std::vector<Result> alone;
      for (const auto& c : choices) alone.push_back(run_alone(*engine(options(cache)), {c})[0]);
      auto st = std::make_shared<FakeModelStats>();
      auto e = engine(options(cache), st);
      auto got = run_all(*e, choices);
      expect_same(got, alone);
      const EngineStats s = e->stats();
      EXPECT_EQ(s.forks, 3);
      EXPECT_EQ(s.prompt_tokens_computed, len);
      EXPECT_EQ(s.prompt_tokens_cached, 3 * len);
      EXPECT_EQ(st->tokens, len + 4 * 11);  // the prompt once, then each choice's own decode steps
      EXPECT_EQ(got[0].cached_tokens, 0);
      for (int i = 1; i < 4; ++i) EXPECT_EQ(got[size_t(i)].cached_tokens, len);
      bool differ = false;
      for (int i = 1; i < 4; ++i) differ |= got[size_t(i)].tokens != got[0].tokens;
      EXPECT_TRUE(differ) << "the seeds should give different choices";
      expect_pool_empty(*e);
    }
  }
}

TEST(EnginePrefix, ForkWithoutRoomQueuesAndCancelsAreClean) {
  std::vector<GenRequest> choices;
  for (int i = 0; i < 4; ++i) {
    GenRequest r = request(tokens(200, 4), i, 8);
    r.id = "c" + std::to_string(i);
    choices.push_back(r);
  }
  std::vector<Result> alone;
  for (const auto& c : choices) alone.push_back(run_alone(*engine(options()), {c})[0]);
  {
    // Two sequences at a time: one choice forks, two queue. They are admitted together, when
    // the first two finish; the prompt's snapshot at 200 leaves no token to compute, so they
    // miss, and record where they diverge from the cache: at 199 (the whole prompt is cached).
    EngineOptions o = options();
    o.max_num_seqs = 2;
    auto e = engine(o);
    expect_same(run_all(*e, choices), alone);
    EXPECT_EQ(e->stats().forks, 1);
    EXPECT_EQ(e->stats().prefix_cache_hits, 0);
    // The same prompt again hits that point and computes one token.
    GenRequest again = choices[2];
    again.id = "again";
    const Result r = drain(*e->submit(again));
    EXPECT_EQ(r, alone[2]);
    EXPECT_EQ(r.cached_tokens, 199);
    expect_pool_empty(*e);
  }
  {
    // The leader is cancelled before its prompt is done: its followers go on without it; a
    // cancelled follower just ends.
    auto st = std::make_shared<FakeModelStats>();
    st->step_delay_us = 2000;
    EngineOptions o = options();
    o.max_num_batched_tokens = 16;  // a 13-step prefill
    auto e = engine(o, st);
    auto streams = e->submit_all(choices);
    e->cancel("c0");
    e->cancel("c2");
    EXPECT_EQ(drain(*streams[0]).finish, FinishReason::Cancelled);
    EXPECT_EQ(drain(*streams[2]).finish, FinishReason::Cancelled);
    EXPECT_EQ(drain(*streams[1]), alone[1]);
    EXPECT_EQ(drain(*streams[3]), alone[3]);
    expect_pool_empty(*e);
  }
}

}  // namespace
}  // namespace dil::testing
