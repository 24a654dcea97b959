// The prefix cache and fork on the real CPU models (tests/data/v4-tiny, v41-tiny) in every
// numerics mode: a request served from the cache gives exactly what the same request gives on
// an engine without the cache — the same greedy tokens and the same top-20 logprobs bit for bit
// (the raw logprobs are log_softmax of the model's logits, so equal top-20 rows mean the logits
// agree; no tolerance: restoring a snapshot and reading shared blocks must compute the very same
// numbers, as chunked prefill does — V4Engine.TokenBudgetDoesNotChangeOutputs).
//
// Hit positions, against the fixtures' geometry (V4: ratios 4 and 128, V4.1: ratios 2 and 1,
// both a 128-token window and 128-token blocks):
//   128  on a block boundary (every ratio's boundary; the HCA row of block 0 is shared);
//   131  off every compression-ratio boundary (partial compressor state, V4's overlap rows) and
//        inside a block (copy-on-write of the shared partial block);
//    60  inside the first window (the SWA ring not yet full, V4.1's Engram look-back short).
// The continuation (40 tokens, inside the 128-token window of the hit) attends into the restored
// ring and the shared compressed rows.
//
// Hits run in all six fixture x numerics cases; the heavier serving cases (pressure, fork) in
// two (V4 official, V4.1 reference) to keep the CPU suite's time down.
#include <gtest/gtest.h>

#include <cstdlib>
#include <tuple>

#include "engine_harness.h"

namespace dil::testing {
namespace {

struct Case {
  std::string fixture;  // tests/data/<fixture>
  std::string numerics;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.fixture << " " << c.numerics; }

std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  std::string s = i.param.fixture + "_" + i.param.numerics;
  for (char& c : s)
    if (c == '-') c = '_';
  return s;
}

class PrefixModel : public ::testing::TestWithParam<Case> {
 protected:
  EngineOptions options(bool cache) const {
    EngineOptions o;
    o.model_dir = std::string(DIL_SOURCE_DIR) + "/tests/data/" + GetParam().fixture;
    // DIL_PREFIX_DEVICE=cuda: the same checks on the GPU (scripts/gpu-check), where they also
    // check that the CUDA kernels give a chunk the same numbers whatever else the step holds.
    const char* dev = std::getenv("DIL_PREFIX_DEVICE");
    o.device = dev && *dev ? dev : "cpu";
    o.numerics = GetParam().numerics;
    o.max_num_seqs = 8;
    o.max_num_batched_tokens = 512;
    o.max_model_len = 512;
    o.kv_blocks = 32;
    o.block_tokens = 128;
    o.seed = 77;
    o.enable_prefix_cache = cache;
    return o;
  }
};

std::vector<int32_t> ids(int n, int salt) {
  std::vector<int32_t> v;
  for (int p = 0; p < n; ++p) v.push_back(int32_t(3 + (p * 37 + salt * 101 + (p * p) % 17) % 1000));
  return v;
}

GenRequest greedy(std::string id, std::vector<int32_t> prompt, int max_tokens = 4) {
  GenRequest r;
  r.id = std::move(id);
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.logprobs = 20;
  r.stop.max_tokens = max_tokens;
  r.stop.ignore_eos = true;
  return r;
}

void expect_same(const std::vector<Result>& got, const std::vector<Result>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NE(want[i].finish, FinishReason::Error) << want[i].error;
    EXPECT_EQ(got[i].top.size(), size_t(got[i].completion_tokens)) << "request " << i << ": logprobs missing";
    EXPECT_EQ(got[i], want[i]) << "request " << i;
  }
}

// Turn 1 caches its prompt's end; turn 2 (turn 1's prompt + a new message) hits it there.
TEST_P(PrefixModel, HitsEqualColdOnAndOffRatioBoundaries) {
  const std::vector<int> hits = {128, 131, 60};
  std::vector<GenRequest> turn1, turn2;
  for (int i = 0; i < int(hits.size()); ++i) {
    turn1.push_back(greedy("t1-" + std::to_string(i), ids(hits[size_t(i)], i), 1));
    std::vector<int32_t> p = turn1.back().prompt;
    auto more = ids(40, 50 + i);
    p.insert(p.end(), more.begin(), more.end());
    turn2.push_back(greedy("t2-" + std::to_string(i), std::move(p)));
  }
  auto cold = run_alone(*make_engine(options(false)), turn2);
  auto e = make_engine(options(true));
  run_alone(*e, turn1);
  auto got = run_alone(*e, turn2);
  expect_same(got, cold);
  for (size_t i = 0; i < hits.size(); ++i) EXPECT_EQ(got[i].cached_tokens, hits[i]) << "hit at " << hits[i];
  EXPECT_EQ(e->stats().prefix_cache_hits, 128 + 131 + 60);
}

class PrefixModelServing : public PrefixModel {};

// A shared system prompt, then requests at once in a pool too small for them and the cache:
// hits and evictions (the cache gives its blocks and its one extra slot back), every output as
// cold. (Preemption with the cache on is covered with the fake model, EnginePrefix.)
TEST_P(PrefixModelServing, SharedPrefixUnderPressureEqualsCold) {
  std::vector<GenRequest> reqs;
  for (int i = 0; i < 5; ++i) {
    auto p = ids(150, 7);
    auto own = ids(10 + 4 * i, 200 + i);
    p.insert(p.end(), own.begin(), own.end());
    reqs.push_back(greedy("s" + std::to_string(i), std::move(p), 2 + i % 3));
  }
  auto cold = run_alone(*make_engine(options(false)), reqs);
  EngineOptions o = options(true);
  o.kv_blocks = 5;  // 2 blocks a request, 3 running: the cache's blocks and snapshots go back
  o.max_model_len = 256;
  o.max_num_seqs = 3;
  o.prefix_cache_slots = 1;
  o.max_num_batched_tokens = 64;
  auto e = make_engine(o);
  // The first two record the prompt ends and the divergence at 150, then all at once.
  expect_same(run_alone(*e, {reqs[0], reqs[1]}), {cold[0], cold[1]});
  expect_same(run_together(*e, reqs), cold);
  const EngineStats s = e->stats();
  EXPECT_GT(s.prefix_cache_hits, 0);
  EXPECT_GT(s.prefix_cache_evictions, 0);
  std::printf("[prefix model pressure] hits %lld of %lld tokens, %lld evictions, %lld preemptions\n",
              (long long)s.prefix_cache_hits, (long long)s.prefix_cache_queries, (long long)s.prefix_cache_evictions,
              (long long)s.preemptions);
  EXPECT_TRUE(wait_stats(*e, [](const EngineStats& st) { return st.kv_blocks_used == 0 && st.kv_slots_used == 0; }));
}

// n = 4: the prompt is computed once, each choice (seed + i) equals that seed served alone.
TEST_P(PrefixModelServing, ForkOfFourChoicesEqualsEachSeedAlone) {
  std::vector<GenRequest> choices;
  for (int i = 0; i < 4; ++i) {
    GenRequest r = greedy("c" + std::to_string(i), ids(131, 9), 6);
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 4000 + i;
    choices.push_back(r);
  }
  std::vector<Result> alone;
  for (const auto& c : choices) alone.push_back(run_alone(*make_engine(options(false)), {c})[0]);
  auto e = make_engine(options(true));
  auto got = run_all(*e, choices);
  expect_same(got, alone);
  const EngineStats s = e->stats();
  EXPECT_EQ(s.forks, 3);
  EXPECT_EQ(s.prompt_tokens_computed, 131);
  EXPECT_EQ(s.prompt_tokens_cached, 3 * 131);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PrefixModel,
                         ::testing::Values(Case{"v4-tiny", "reference"}, Case{"v4-tiny", "official"},
                                           Case{"v4-tiny", "fast"}, Case{"v41-tiny", "reference"},
                                           Case{"v41-tiny", "official"}, Case{"v41-tiny", "fast"}),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Fixtures, PrefixModelServing,
                         ::testing::Values(Case{"v4-tiny", "official"}, Case{"v41-tiny", "reference"}), case_name);

}  // namespace
}  // namespace dil::testing
