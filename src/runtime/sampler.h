// The host sampler: one logits row in, one token (+ logprobs) out. A pure function of its
// arguments, so a request's tokens do not depend on the batch it was sampled in.
//
// Order of processing (vLLM v1 `Sampler.forward`, docs.vllm.ai vllm.v1.sample.sampler):
//  1. raw logprobs = log_softmax(model logits)                 (what logprobs report by default)
//  1b. allowed-token mask (structured output): logits[t] = -inf where the bit is clear
//  2. allowed_token_ids (every other token -inf), logit bias: logits[t] += bias[t], then the
//     `banned` tokens -inf (the engine bans EOS and stop ids before min_tokens)
//  3. penalties (OpenAI / vLLM semantics):
//     - repetition (vLLM/HF, multiplicative): for every token seen in the prompt OR the output,
//       logit > 0 ? logit / r : logit * r
//     - frequency: logit -= frequency_penalty * count of t in the OUTPUT
//     - presence:  logit -= presence_penalty * (t occurs in the OUTPUT)
//  4. temperature < 1e-5: greedy argmax (ties -> lowest id); otherwise
//     logits /= temperature, min-p (keep p >= min_p * p_max), top-k (keep the k most likely,
//     ties -> lower id first), top-p (smallest most-likely-first prefix with mass >= top_p),
//     then one draw: inverse CDF over the kept tokens in id order with u = Philox(seed, position).
//  Processed logprobs (LogprobsMode::Processed) = log_softmax of the logits after step 4's
//  temperature and masks (greedy: after step 3).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "dil/engine.h"

namespace dil::runtime {

struct SampleResult {
  int32_t token = -1;
  float logprob = 0.0f;            // of `token`
  std::vector<TokenLogprob> top;   // top-N, descending (ties -> lower id)
};

// `logits` [vocab] f32. `position`: the absolute position the sampled token will occupy (its
// index in prompt + output). `banned`: ids set to -inf after the bias. `allowed`: empty, or
// [ceil(vocab / 64)] words with bit t set for each token that may be sampled (the engine
// leaves at least one that allowed_token_ids and `banned` keep too).
SampleResult sample_token(std::span<const float> logits, const SamplingParams& sp, std::span<const int32_t> prompt,
                          std::span<const int32_t> output, uint64_t seed, int64_t position, LogprobsMode mode,
                          std::span<const int32_t> banned = {}, std::span<const uint64_t> allowed = {});

// Temperature under which sampling is greedy (vLLM's _SAMPLING_EPS).
inline constexpr float kGreedyTemperature = 1e-5f;

}  // namespace dil::runtime
