// The sampler's specification beyond the request-level formulas (test_sampler.cpp): the
// shared host/device arithmetic (sampling_math.h), non-finite logits, ties in every filter,
// and the batched op (SampleBatch through Backend::sample on the CPU backend) equal to one
// row at a time.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "backend/sampling_math.h"
#include "runtime/philox.h"
#include "runtime/sampler.h"

namespace dil::runtime {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(SampleSpec, PhiloxBitsAreTheRuntimeUniform) {
  for (uint64_t seed : {0ull, 1ull, 0x123456789abcdefull, ~0ull})
    for (uint64_t pos : {0ull, 1ull, 77ull, (1ull << 40) + 3})
      EXPECT_EQ(double(sampling::philox_bits53(seed, pos)) * 0x1.0p-53, philox_uniform(seed, pos));
}

// exp_nonpos need not be correctly rounded (host and device share it), but it must be exp:
// within 1e-14 relative over the range where weights are non-zero.
TEST(SampleSpec, PortableExpIsExp) {
  for (double d = -45.0; d <= 0.0; d += 0.0137)
    EXPECT_NEAR(sampling::exp_nonpos(d) / std::exp(d), 1.0, 1e-14) << d;
  EXPECT_EQ(sampling::exp_nonpos(0.0), 1.0);
  EXPECT_EQ(sampling::exp_nonpos(-46.0), 0.0);
  EXPECT_EQ(sampling::exp_nonpos(-std::numeric_limits<double>::infinity()), 0.0);
}

TEST(SampleSpec, WeightsAndKeys) {
  // V4's vocabulary: 17 bits of ids, weights with 46 fraction bits (129280 * 2^46 < 2^63).
  EXPECT_EQ(sampling::weight_bits(129280), 46);
  EXPECT_EQ(sampling::id_bits(129280), 17);
  EXPECT_EQ(sampling::weight(3.0f, 3.0f, 46), uint64_t(1) << 46);
  EXPECT_EQ(sampling::weight(-kInf, 3.0f, 46), 0u);
  EXPECT_EQ(sampling::weight(kInf, kInf, 46), uint64_t(1) << 46);
  EXPECT_EQ(sampling::weight(1e30f, kInf, 46), 0u);
  // Keys: larger value first, ties to the lower id, -0 == +0.
  const int b = 17;
  EXPECT_GT(sampling::token_key(1.0f, 9, b), sampling::token_key(0.5f, 0, b));
  EXPECT_GT(sampling::token_key(1.0f, 3, b), sampling::token_key(1.0f, 4, b));
  EXPECT_GT(sampling::token_key(-0.0f, 3, b), sampling::token_key(0.0f, 4, b));
  EXPECT_GT(sampling::token_key(-1.0f, 3, b), sampling::token_key(-kInf, 0, b));
  EXPECT_GT(sampling::token_key(kInf, 100, b), sampling::token_key(3e38f, 0, b));
}

TEST(SampleSpec, NanLogitsAreImpossibleTokens) {
  const std::vector<float> x = {kNaN, 1.0f, kNaN, 0.5f};
  SamplingParams sp;
  sp.logprobs = 4;
  for (int pos = 0; pos < 200; ++pos) {
    const SampleResult r = sample_token(x, sp, {}, {}, 3, pos, LogprobsMode::Raw);
    ASSERT_TRUE(r.token == 1 || r.token == 3) << r.token;
    ASSERT_EQ(r.top.size(), 4u);
    EXPECT_EQ(r.top[2].token, 0);  // the -inf entries, lower id first
    EXPECT_EQ(r.top[2].logprob, -kInf);
    EXPECT_NEAR(std::exp(r.top[0].logprob) + std::exp(r.top[1].logprob), 1.0, 1e-6);
  }
  sp.temperature = 0;
  EXPECT_EQ(sample_token(x, sp, {}, {}, 3, 0, LogprobsMode::Raw).token, 1);
  // Nothing finite: token -1 (the engine ends the request).
  const std::vector<float> none = {kNaN, -kInf, kNaN};
  EXPECT_EQ(sample_token(none, sp, {}, {}, 3, 0, LogprobsMode::Raw).token, -1);
  sp.temperature = 1;
  EXPECT_EQ(sample_token(none, sp, {}, {}, 3, 0, LogprobsMode::Raw).token, -1);
}

TEST(SampleSpec, InfiniteLogitsShareTheMass) {
  const std::vector<float> x = {1.0f, kInf, 2.0f, kInf, kInf};
  SamplingParams sp;
  sp.logprobs = 1;
  int seen[5] = {};
  for (int pos = 0; pos < 3000; ++pos) {
    const SampleResult r = sample_token(x, sp, {}, {}, 11, pos, LogprobsMode::Raw);
    ++seen[r.token];
    EXPECT_FLOAT_EQ(r.logprob, -std::log(3.0f));
    EXPECT_EQ(r.top[0].token, 1);
  }
  EXPECT_EQ(seen[0] + seen[2], 0);
  for (int t : {1, 3, 4}) EXPECT_NEAR(seen[t], 1000, 120) << t;  // 4.6 sigma of Binomial(3000, 1/3)
  sp.temperature = 0;
  EXPECT_EQ(sample_token(x, sp, {}, {}, 11, 0, LogprobsMode::Raw).token, 1);  // first +inf
  // A temperature that overflows a finite logit to +inf makes it one of the +inf tokens.
  const std::vector<float> big = {3e38f, 1.0f, 3e38f};
  sp.temperature = 0.1f;
  for (int pos = 0; pos < 50; ++pos) EXPECT_NE(sample_token(big, sp, {}, {}, 2, pos, LogprobsMode::Raw).token, 1);
}

TEST(SampleSpec, TiesBreakTowardsTheLowerId) {
  const std::vector<float> x = {1.0f, 2.0f, 2.0f, 2.0f, 0.0f};
  SamplingParams sp;
  sp.top_k = 2;  // of the three tied 2.0s, ids 1 and 2
  int seen[5] = {};
  for (int pos = 0; pos < 400; ++pos) ++seen[sample_token(x, sp, {}, {}, 4, pos, LogprobsMode::Raw).token];
  EXPECT_GT(seen[1], 0);
  EXPECT_GT(seen[2], 0);
  EXPECT_EQ(seen[0] + seen[3] + seen[4], 0);
  // top_p 0.25 of three equal tokens (p = 1 / 3.503 = 0.285 each): the first one alone.
  sp = {};
  sp.top_p = 0.25f;
  for (int pos = 0; pos < 50; ++pos) EXPECT_EQ(sample_token(x, sp, {}, {}, 4, pos, LogprobsMode::Raw).token, 1);
  // top logprobs of tied values: by id.
  sp = {};
  sp.logprobs = 3;
  const SampleResult r = sample_token(x, sp, {}, {}, 4, 0, LogprobsMode::Raw);
  EXPECT_EQ(r.top[0].token, 1);
  EXPECT_EQ(r.top[1].token, 2);
  EXPECT_EQ(r.top[2].token, 3);
}

// Many rows through Backend::sample (the CPU backend: the specification behind the op) give
// what each row gives alone; two rows may sample one logits row (fork followers).
TEST(SampleSpec, BatchedOpEqualsOneRowAtATime) {
  const int64_t V = 1000, R = 3;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> logits(size_t(R * V));
  for (float& v : logits) v = nd(rng);
  auto be = make_backend(BackendKind::CPU);
  Buffer buf = be->alloc(logits.size() * 4);
  Tensor lg(buf.data(), DType::F32, {R, V});
  be->upload(lg, logits.data());
  std::vector<SamplingParams> sps(6);
  sps[0].temperature = 0;
  sps[1].top_k = 20, sps[1].logprobs = 5;
  sps[2].top_p = 0.8f, sps[2].min_p = 0.01f, sps[2].temperature = 0.8f;
  sps[3].repetition_penalty = 1.3f, sps[3].frequency_penalty = 0.4f, sps[3].presence_penalty = 0.2f;
  sps[3].logit_bias = {{7, 3.0f}}, sps[3].logprobs = 2;
  sps[4].allowed_token_ids = {3, 9, 500, 999};
  sps[5] = sps[1];
  const std::vector<int32_t> prompt = {7, 8, 9}, output = {9, 9, 12};
  const std::vector<int32_t> src = {0, 1, 2, 0, 1, 1};
  for (LogprobsMode mode : {LogprobsMode::Raw, LogprobsMode::Processed}) {
    SampleBatch b(V);
    for (size_t i = 0; i < sps.size(); ++i) b.add(src[i], sps[i], prompt, output, 100 + i, 42);
    const std::vector<SampleResult> got = b.run(*be, lg, mode);
    ASSERT_EQ(got.size(), sps.size());
    for (size_t i = 0; i < sps.size(); ++i) {
      std::span<const float> row(logits.data() + src[i] * V, size_t(V));
      const SampleResult one = sample_token(row, sps[i], prompt, output, 100 + i, 42, mode);
      EXPECT_EQ(got[i].token, one.token) << i;
      EXPECT_EQ(got[i].logprob, one.logprob) << i;
      ASSERT_EQ(got[i].top.size(), one.top.size()) << i;
      for (size_t j = 0; j < one.top.size(); ++j) {
        EXPECT_EQ(got[i].top[j].token, one.top[j].token);
        EXPECT_EQ(got[i].top[j].logprob, one.top[j].logprob);
      }
    }
  }
}

}  // namespace
}  // namespace dil::runtime
