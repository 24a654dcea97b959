// The runtime's side of sampling: a request's SamplingParams, tokens and masks packed into the
// rows of Backend::sample (backend/sampling.h holds the semantics and the executable
// specification; the CUDA backend samples on the device, so only token ids and logprobs come
// back). `sample_token` runs one row through the specification on the host.
//
// Order of processing (vLLM v1 `Sampler.forward`, docs.vllm.ai vllm.v1.sample.sampler):
//  1. raw logprobs = log_softmax(model logits)                 (what logprobs report by default)
//  1b. allowed-token mask (structured output) and allowed_token_ids: every other token -inf
//  2. logit bias: logits[t] += bias[t], then the `banned` tokens -inf (the engine bans EOS and
//     stop ids before min_tokens)
//  3. penalties (OpenAI / vLLM semantics):
//     - repetition (vLLM/HF, multiplicative): for every token seen in the prompt OR the output,
//       logit > 0 ? logit / r : logit * r
//     - frequency: logit -= frequency_penalty * count of t in the OUTPUT
//     - presence:  logit -= presence_penalty * (t occurs in the OUTPUT)
//  4. temperature < 1e-5: greedy argmax (ties -> lowest id); otherwise
//     logits /= temperature, min-p (keep p >= min_p * p_max), top-k (keep the k most likely,
//     ties -> lower id first), top-p (smallest most-likely-first prefix with mass >= top_p),
//     then one draw: inverse CDF over the kept tokens in id order with u = Philox(seed, position)
//     (masses as exact integer sums, backend/sampling_math.h).
//  Processed logprobs (LogprobsMode::Processed) = log_softmax of the logits after step 4's
//  temperature and masks (greedy: after step 3). NaN logits count as -inf; a row left with no
//  token yields token -1.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "dil/engine.h"

namespace dil::runtime {

struct SampleResult {
  int32_t token = -1;
  float logprob = 0.0f;            // of `token`
  std::vector<TokenLogprob> top;   // top-N, descending (ties -> lower id)
};

// The rows of one Backend::sample call, packed on the host.
struct SampleBatch {
  std::vector<SampleRow> rows;
  std::vector<SampleEdit> edits;
  std::vector<uint64_t> masks;  // [n_masks, ceil(vocab / 64)]
  int n_top = 0;
  int64_t vocab = 0;
  explicit SampleBatch(int64_t v) : vocab(v) {}
  // A row sampling logits row `src_row`. `position`: the absolute position the sampled token
  // will occupy (its index in prompt + output). `banned`: ids set to -inf after the bias.
  // `allowed`: empty, or [ceil(vocab / 64)] words with bit t set for each token that may be
  // sampled (the engine leaves at least one that allowed_token_ids and `banned` keep too).
  void add(int32_t src_row, const SamplingParams& sp, std::span<const int32_t> prompt,
           std::span<const int32_t> output, uint64_t seed, int64_t position, std::span<const int32_t> banned = {},
           std::span<const uint64_t> allowed = {});
  // Samples every row from `logits` [R, vocab] f32 on `be` (uploads the rows, one
  // Backend::sample, downloads the [rows, 2 + 2 n_top] results).
  std::vector<SampleResult> run(Backend& be, const Tensor& logits, LogprobsMode mode) const;
  // The same on host memory, through the specification (sample_rows_reference).
  std::vector<SampleResult> run_host(std::span<const float> logits, LogprobsMode mode) const;
};

// `logits` [vocab] f32; one row of a SampleBatch run on the host.
SampleResult sample_token(std::span<const float> logits, const SamplingParams& sp, std::span<const int32_t> prompt,
                          std::span<const int32_t> output, uint64_t seed, int64_t position, LogprobsMode mode,
                          std::span<const int32_t> banned = {}, std::span<const uint64_t> allowed = {});

// Temperature under which sampling is greedy (vLLM's _SAMPLING_EPS).
inline constexpr float kGreedyTemperature = kGreedyTemperatureEps;

}  // namespace dil::runtime
