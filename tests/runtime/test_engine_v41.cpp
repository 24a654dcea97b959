// The engine on the real V4.1 CPU model: tests/data/v41-tiny, reference numerics, CPU backend
// (exact full forward, no bounded replay, so recomputation after preemption is exact).
// - greedy generation equals the HF float64 reference's greedy continuation;
// - 16 requests at once, under KV pressure (preemptions) and a 64-token budget, give exactly
//   their tokens alone, and the pool is full again afterwards.
#include <gtest/gtest.h>

#include "engine_harness.h"
#include "reference_check.h"

namespace dil::testing {
namespace {

EngineOptions v41_options() {
  EngineOptions o;
  o.model_dir = std::string(DIL_SOURCE_DIR) + "/tests/data/v41-tiny";
  o.device = "cpu";
  o.numerics = "reference";
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 512;
  o.max_model_len = 256;
  o.kv_blocks = 32;
  o.seed = 41;
  return o;
}

TEST(V41Engine, GreedyMatchesHfReference) { expect_greedy_matches_reference(v41_options()); }

TEST(V41Engine, BatchedUnderPressureMatchesAlone) {
  // Across the 128-token block boundary and the ratio-2 pairs (odd and even lengths).
  const std::vector<int> lens = {1, 2, 17, 40, 127, 128, 129, 60, 3, 90, 33, 20, 140, 9, 70, 45};
  auto reqs = mixed_requests(1024, lens);
  auto alone = run_alone(*make_engine(v41_options()), reqs);
  EngineOptions o = v41_options();
  o.kv_blocks = 3;
  o.max_num_batched_tokens = 64;
  auto e = make_engine(o);
  auto got = run_together(*e, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_NE(alone[i].finish, FinishReason::Error) << alone[i].error;
    EXPECT_EQ(got[i], alone[i]) << "request " << i;
  }
  EXPECT_GE(e->stats().preemptions, 3);
  EXPECT_TRUE(wait_stats(*e, [](const EngineStats& s) { return s.kv_blocks_used == 0 && s.kv_slots_used == 0; }));
}

}  // namespace
}  // namespace dil::testing
