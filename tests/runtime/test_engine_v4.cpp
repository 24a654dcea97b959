// The engine on the real V4 CPU model: tests/data/v4-tiny, reference numerics, CPU backend.
// - greedy generation equals the HF float64 reference's greedy continuation;
// - 16 concurrent requests (greedy and seeded sampling) give exactly their tokens alone;
// - a KV pool too small for all of them (several preemptions) gives the same tokens, and
//   the pool is full again afterwards;
// - max_num_batched_tokens 7, 64, 4096 give the same tokens;
// - cancelling mid-prefill and mid-decode frees blocks and slots.
#include <gtest/gtest.h>

#include "engine_harness.h"
#include "reference_check.h"

namespace dil::testing {
namespace {

const std::string kDir = std::string(DIL_SOURCE_DIR) + "/tests/data/v4-tiny";

EngineOptions v4_options() {
  EngineOptions o;
  o.model_dir = kDir;
  o.device = "cpu";
  o.numerics = "reference";
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 512;
  o.max_model_len = 512;
  o.kv_blocks = 64;
  o.block_tokens = 128;
  o.seed = 2024;
  return o;
}

// Shorter than the fake-model mix (the CPU reference costs ~4 ms a token) but still across
// the 128-token block and compression boundaries: 127, 128, 129, 140 and chunk splits.
const std::vector<int> kV4Mix = {1, 5, 17, 40, 127, 128, 129, 60, 3, 90, 33, 20, 140, 9, 70, 45};

void expect_same(const std::vector<Result>& got, const std::vector<Result>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NE(want[i].finish, FinishReason::Error) << want[i].error;
    EXPECT_EQ(got[i], want[i]) << "request " << i;
  }
}

void expect_pool_empty(const Engine& e) {
  EXPECT_TRUE(wait_stats(e, [](const EngineStats& s) {
    return s.kv_blocks_used == 0 && s.kv_slots_used == 0 && s.running == 0 && s.waiting == 0;
  }));
}

TEST(V4Engine, GreedyMatchesHfReference) { expect_greedy_matches_reference(v4_options()); }

TEST(V4Engine, ConcurrentRequestsMatchAlone) {
  auto reqs = mixed_requests(1024, kV4Mix);
  auto e = make_engine(v4_options());
  auto alone = run_alone(*e, reqs);
  expect_same(run_together(*e, reqs), alone);
  expect_pool_empty(*e);
}

TEST(V4Engine, PreemptionUnderPressureKeepsOutputs) {
  EngineOptions o = v4_options();
  // 3 blocks (max_model_len 256 needs 2) where the 16 requests want ~20 at once; a 64-token
  // budget chunks the longer prompts, so running sequences keep asking for blocks.
  o.max_model_len = 256;
  o.kv_blocks = 3;
  o.max_num_batched_tokens = 64;
  auto reqs = mixed_requests(1024, kV4Mix);
  auto want = run_together(*make_engine(v4_options()), reqs);
  auto e = make_engine(o);
  expect_same(run_together(*e, reqs), want);
  EXPECT_GE(e->stats().preemptions, 3);
  std::printf("[preemption] %lld preemptions, %lld steps\n", (long long)e->stats().preemptions,
              (long long)e->stats().steps);
  expect_pool_empty(*e);
  EXPECT_EQ(e->stats().kv_blocks_total, 3);
}

TEST(V4Engine, TokenBudgetDoesNotChangeOutputs) {
  auto reqs = mixed_requests(1024, kV4Mix);
  std::vector<std::vector<Result>> outs;
  for (int budget : {4096, 64, 7}) {
    EngineOptions o = v4_options();
    o.max_num_batched_tokens = budget;
    outs.push_back(run_together(*make_engine(o), reqs));
  }
  {
    SCOPED_TRACE("64 vs 4096");
    expect_same(outs[1], outs[0]);
  }
  {
    SCOPED_TRACE("7 vs 4096");
    expect_same(outs[2], outs[0]);
  }
}

TEST(V4Engine, CancelMidPrefillAndMidDecodeFreesState) {
  EngineOptions o = v4_options();
  o.max_num_batched_tokens = 16;
  o.max_model_len = 1024;
  auto e = make_engine(o);
  GenRequest pre;
  pre.id = "prefill";
  for (int i = 0; i < 1000; ++i) pre.prompt.push_back(int32_t((i * 31 + 7) % 1024));
  pre.stop.max_tokens = 4;
  GenRequest other = mixed_requests(1024, kV4Mix)[4];
  other.stop.max_tokens = 40;  // decodes long enough to be seen running beside the long prompt
  other.stop.ignore_eos = true;
  auto other_alone = run_alone(*e, {other});
  auto s_other = e->submit(other);
  auto s_pre = e->submit(pre);
  // Both admitted: the 127-token bystander holds one block, the long prompt at least one more.
  ASSERT_TRUE(wait_stats(*e, [](const EngineStats& s) { return s.kv_blocks_used >= 2 && s.running == 2; }));
  e->cancel("prefill");
  Result r = drain(*s_pre);
  EXPECT_EQ(r.finish, FinishReason::Cancelled);
  EXPECT_TRUE(r.tokens.empty());
  EXPECT_EQ(drain(*s_other), other_alone[0]);
  expect_pool_empty(*e);

  GenRequest dec;
  dec.id = "decode";
  dec.prompt = {3, 4, 5};
  dec.stop.max_tokens = 300;
  dec.stop.ignore_eos = true;
  auto s_dec = e->submit(dec);
  GenOutput first;
  ASSERT_TRUE(s_dec->next(&first, std::chrono::seconds(60)));
  ASSERT_FALSE(first.tokens.empty());
  e->cancel("decode");
  r = drain(*s_dec);
  EXPECT_EQ(r.finish, FinishReason::Cancelled);
  EXPECT_LT(int(first.tokens.size() + r.tokens.size()), 300);
  expect_pool_empty(*e);
}

}  // namespace
}  // namespace dil::testing
