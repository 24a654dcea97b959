// The sampler against its definition: Philox known answers, greedy, each filter and penalty by
// its formula, logprobs, and the draw distribution (chi-square against the softmax).
#include <gtest/gtest.h>

#include <cmath>

#include "runtime/philox.h"
#include "runtime/sampler.h"

namespace dil::runtime {
namespace {

// Random123 kat_vectors, "philox4x32 10" lines.
TEST(Philox, KnownAnswers) {
  using A4 = std::array<uint32_t, 4>;
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}), (A4{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (A4{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (A4{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

std::vector<double> softmax(const std::vector<float>& x) {
  double mx = -INFINITY, s = 0;
  for (float v : x) mx = std::max<double>(mx, v);
  std::vector<double> p(x.size());
  for (size_t i = 0; i < x.size(); ++i) s += p[i] = std::isinf(x[i]) ? 0.0 : std::exp(x[i] - mx);
  for (double& v : p) v /= s;
  return p;
}

SampleResult run(const std::vector<float>& logits, const SamplingParams& sp, int64_t pos = 0,
                 std::vector<int32_t> prompt = {}, std::vector<int32_t> out = {},
                 LogprobsMode mode = LogprobsMode::Raw, uint64_t seed = 1) {
  return sample_token(logits, sp, prompt, out, seed, pos, mode);
}

// Draws at positions 0..n-1 and compares the counts with `p` (chi-square, cells with p > 0;
// a token with p == 0 must never be drawn). Threshold: the 0.999 quantile for the dof.
void expect_distribution(const std::vector<float>& logits, const SamplingParams& sp, const std::vector<double>& p) {
  const int n = 40000;
  std::vector<int> count(logits.size(), 0);
  for (int i = 0; i < n; ++i) ++count[size_t(run(logits, sp, i, {}, {}, LogprobsMode::Raw, 99).token)];
  double chi2 = 0;
  int dof = -1;
  for (size_t t = 0; t < p.size(); ++t) {
    if (p[t] == 0) {
      EXPECT_EQ(count[t], 0) << "token " << t << " is filtered out";
      continue;
    }
    const double e = p[t] * n;
    chi2 += (count[t] - e) * (count[t] - e) / e;
    ++dof;
  }
  const double q999[] = {10.83, 13.82, 16.27, 18.47, 20.52, 22.46};  // chi-square 0.999 quantiles, dof 1..6
  if (dof == 0) return;  // a single kept token: every draw was it (checked through the zeros)
  EXPECT_LT(chi2, q999[dof - 1]) << "dof " << dof;
}

const std::vector<float> kLogits = {1.0f, 2.5f, 0.3f, 2.0f, -1.0f, 1.7f};

TEST(Sampler, GreedyIsArgmaxWithLowestIdTies) {
  SamplingParams sp;
  sp.temperature = 0;
  EXPECT_EQ(run(kLogits, sp).token, 1);
  EXPECT_EQ(run({0.5f, 3.0f, 3.0f, 1.0f}, sp).token, 1);
  sp.logit_bias = {{4, 4.0f}};  // -1 + 4 = 3 > 2.5
  EXPECT_EQ(run(kLogits, sp).token, 4);
}

TEST(Sampler, AllowedTokensAndBannedTokensAreMasked) {
  SamplingParams sp;
  sp.temperature = 0;
  sp.allowed_token_ids = {0, 4};
  EXPECT_EQ(run(kLogits, sp).token, 0);  // 1.0 > -1.0; the argmax 1 is not allowed
  sp.allowed_token_ids.clear();
  const std::vector<int32_t> ban = {1};
  EXPECT_EQ(sample_token(kLogits, sp, {}, {}, 1, 0, LogprobsMode::Raw, ban).token, 3);
  // A draw over the allowed set only, in proportion to its softmax; raw logprobs unchanged.
  sp.temperature = 1.0f;
  sp.allowed_token_ids = {3, 5};
  std::vector<float> only(kLogits.size(), -INFINITY);
  only[3] = kLogits[3];
  only[5] = kLogits[5];
  expect_distribution(kLogits, sp, softmax(only));
  sp.logprobs = 0;
  const SampleResult r = run(kLogits, sp);
  EXPECT_NEAR(r.logprob, std::log(softmax(kLogits)[size_t(r.token)]), 1e-5);
}

TEST(Sampler, TemperatureDrawFollowsTheSoftmax) {
  SamplingParams sp;
  sp.temperature = 0.7f;
  std::vector<float> scaled;
  for (float v : kLogits) scaled.push_back(v / 0.7f);
  expect_distribution(kLogits, sp, softmax(scaled));
}

TEST(Sampler, TopKTopPMinPKeepTheRightSets) {
  // p = softmax(kLogits): order 1 (2.5), 3 (2.0), 5 (1.7), 0 (1.0), 2 (0.3), 4 (-1.0).
  auto renorm = [](std::vector<float> x, std::vector<int> keep) {
    std::vector<float> y(x.size(), -INFINITY);
    for (int t : keep) y[size_t(t)] = x[size_t(t)];
    return softmax(y);
  };
  SamplingParams sp;
  sp.top_k = 3;
  expect_distribution(kLogits, sp, renorm(kLogits, {1, 3, 5}));
  // p = 0.4132, 0.2506, 0.1857, ...: the top two hold 0.664, so top_p 0.6 keeps {1, 3} and
  // 0.7 adds 5.
  sp = {};
  sp.top_p = 0.6f;
  expect_distribution(kLogits, sp, renorm(kLogits, {1, 3}));
  sp.top_p = 0.7f;
  expect_distribution(kLogits, sp, renorm(kLogits, {1, 3, 5}));
  sp.top_p = 0.4f;  // the top token alone holds 0.4132
  expect_distribution(kLogits, sp, renorm(kLogits, {1}));
  // min_p 0.3: keep p >= 0.3 * p_max, i.e. logit >= 2.5 + ln 0.3 = 1.296.
  sp = {};
  sp.min_p = 0.3f;
  expect_distribution(kLogits, sp, renorm(kLogits, {1, 3, 5}));
  // top_k 2 after min_p, then top_p 0.5 of the renormalised pair keeps only token 1.
  sp.top_k = 2;
  sp.top_p = 0.5f;
  expect_distribution(kLogits, sp, renorm(kLogits, {1}));
}

TEST(Sampler, PenaltiesFollowVllmSemantics) {
  // Processed logprobs of a greedy request expose the penalised logits exactly.
  const std::vector<float> x = {2.0f, -1.0f, 0.5f, 0.0f, 1.0f};
  SamplingParams sp;
  sp.temperature = 0;
  sp.logprobs = 5;
  sp.repetition_penalty = 2.0f;   // prompt+output tokens: >0 divided, <=0 multiplied
  sp.frequency_penalty = 0.5f;    // output tokens only, per occurrence
  sp.presence_penalty = 0.25f;    // output tokens only, once
  sp.logit_bias = {{3, 0.75f}};   // before the penalties
  const std::vector<int32_t> prompt = {0, 1}, output = {2, 2, 3};
  SampleResult r = run(x, sp, 0, prompt, output, LogprobsMode::Processed);
  std::vector<float> want = {2.0f / 2, -1.0f * 2, 0.5f / 2 - 2 * 0.5f - 0.25f, 0.75f / 2 - 0.5f - 0.25f, 1.0f};
  auto p = softmax(want);
  ASSERT_EQ(r.top.size(), 5u);
  EXPECT_EQ(r.token, 0);  // 1.0 (token 0) ties token 4: lowest id
  for (const TokenLogprob& t : r.top) EXPECT_NEAR(t.logprob, std::log(p[size_t(t.token)]), 1e-6) << t.token;
  EXPECT_EQ(r.top[0].token, 0);
  EXPECT_EQ(r.top[1].token, 4);
  EXPECT_NEAR(r.logprob, std::log(p[0]), 1e-6);
}

TEST(Sampler, RawLogprobsIgnoreProcessing) {
  SamplingParams sp;
  sp.temperature = 0.5f;
  sp.top_k = 2;
  sp.logit_bias = {{4, 1.0f}};
  sp.logprobs = 3;
  SampleResult r = run(kLogits, sp, 7);
  auto p = softmax(kLogits);
  EXPECT_NEAR(r.logprob, std::log(p[size_t(r.token)]), 1e-6);
  ASSERT_EQ(r.top.size(), 3u);
  EXPECT_EQ(r.top[0].token, 1);
  EXPECT_EQ(r.top[1].token, 3);
  EXPECT_EQ(r.top[2].token, 5);
  for (const TokenLogprob& t : r.top) EXPECT_NEAR(t.logprob, std::log(p[size_t(t.token)]), 1e-6);
  // Processed: the draw's distribution (temperature 0.5, top-2 of the biased logits).
  r = run(kLogits, sp, 7, {}, {}, LogprobsMode::Processed);
  std::vector<float> y(kLogits.size(), -INFINITY);
  y[1] = 2.5f / 0.5f;
  y[3] = 2.0f / 0.5f;
  auto q = softmax(y);
  EXPECT_NEAR(r.logprob, std::log(q[size_t(r.token)]), 1e-6);
  EXPECT_EQ(r.top[2].logprob, -INFINITY);
  sp.logprobs = -1;
  EXPECT_TRUE(run(kLogits, sp).top.empty());
}

TEST(Sampler, DrawsDependOnlyOnSeedAndPosition) {
  SamplingParams sp;
  std::vector<int> a, b, c;
  for (int pos = 0; pos < 64; ++pos) {
    a.push_back(run(kLogits, sp, pos, {}, {}, LogprobsMode::Raw, 5).token);
    b.push_back(run(kLogits, sp, pos, {}, {}, LogprobsMode::Raw, 5).token);
    c.push_back(run(kLogits, sp, pos, {}, {}, LogprobsMode::Raw, 6).token);
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

// The allowed-token mask (structured output): masked tokens are never drawn, the draw among
// the rest follows their renormalised softmax, greedy takes the best allowed one, raw
// logprobs still describe the model and processed ones give masked tokens -inf.
TEST(Sampler, AllowedMaskRestrictsEveryMode) {
  const std::vector<uint64_t> allowed = {(1u << 0) | (1u << 3) | (1u << 4)};  // tokens 0, 3, 4
  SamplingParams greedy;
  greedy.temperature = 0;
  EXPECT_EQ(sample_token(kLogits, greedy, {}, {}, 1, 0, LogprobsMode::Raw, {}, allowed).token, 3);
  SamplingParams sp;
  sp.temperature = 1.0f;
  std::vector<float> kept = kLogits;
  for (int t : {1, 2, 5}) kept[size_t(t)] = -INFINITY;
  std::vector<double> p = softmax(kept);
  const int n = 20000;
  std::vector<int> count(kLogits.size(), 0);
  for (int i = 0; i < n; ++i) ++count[size_t(sample_token(kLogits, sp, {}, {}, 5, i, LogprobsMode::Raw, {}, allowed).token)];
  double chi2 = 0;
  for (size_t t = 0; t < p.size(); ++t) {
    if (p[t] == 0) {
      EXPECT_EQ(count[t], 0) << "masked token " << t;
      continue;
    }
    chi2 += (count[t] - p[t] * n) * (count[t] - p[t] * n) / (p[t] * n);
  }
  EXPECT_LT(chi2, 13.82);  // chi-square 0.999 quantile, dof 2
  SamplingParams lp = greedy;
  lp.logprobs = 3;
  SampleResult raw = sample_token(kLogits, lp, {}, {}, 1, 0, LogprobsMode::Raw, {}, allowed);
  EXPECT_EQ(raw.top[0].token, 1);  // the model's favourite, although masked
  SampleResult proc = sample_token(kLogits, lp, {}, {}, 1, 0, LogprobsMode::Processed, {}, allowed);
  ASSERT_EQ(proc.top.size(), 3u);
  EXPECT_EQ(proc.top[0].token, 3);
  EXPECT_EQ(proc.top[1].token, 0);
  EXPECT_EQ(proc.top[2].token, 4);
  double total = 0;
  for (const TokenLogprob& t : proc.top) total += std::exp(double(t.logprob));
  EXPECT_NEAR(total, 1.0, 1e-6);  // all the mass is on the allowed tokens
}

}  // namespace
}  // namespace dil::runtime
