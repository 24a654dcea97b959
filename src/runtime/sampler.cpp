#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

#include "core/check.h"
#include "runtime/philox.h"

namespace dil::runtime {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// log_softmax over `x` (entries may be -inf), in double for the reduction.
std::vector<float> log_softmax(std::span<const float> x) {
  float mx = kNegInf;
  for (float v : x) mx = std::max(mx, v);
  double sum = 0.0;
  for (float v : x)
    if (v != kNegInf) sum += std::exp(double(v) - mx);
  const double lse = double(mx) + std::log(sum);
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] == kNegInf ? kNegInf : float(double(x[i]) - lse);
  return out;
}

// Token order "more likely first, ties to the lower id".
struct MoreLikely {
  const float* v;
  bool operator()(int32_t a, int32_t b) const { return v[a] != v[b] ? v[a] > v[b] : a < b; }
};

std::vector<TokenLogprob> top_n(const std::vector<float>& lp, int n) {
  n = std::min<int>(n, int(lp.size()));
  std::vector<int32_t> idx(lp.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), MoreLikely{lp.data()});
  std::vector<TokenLogprob> out(n);
  for (int i = 0; i < n; ++i) out[i] = {idx[i], lp[idx[i]]};
  return out;
}

void apply_penalties(std::vector<float>& x, const SamplingParams& sp, std::span<const int32_t> prompt,
                     std::span<const int32_t> output) {
  const int32_t vocab = int32_t(x.size());
  if (sp.repetition_penalty != 1.0f) {
    std::unordered_set<int32_t> seen(prompt.begin(), prompt.end());
    seen.insert(output.begin(), output.end());
    for (int32_t t : seen) {
      if (t < 0 || t >= vocab) continue;
      x[t] = x[t] > 0 ? x[t] / sp.repetition_penalty : x[t] * sp.repetition_penalty;
    }
  }
  if (sp.frequency_penalty != 0.0f || sp.presence_penalty != 0.0f) {
    std::unordered_map<int32_t, int> count;
    for (int32_t t : output) ++count[t];
    for (auto [t, c] : count) {
      if (t < 0 || t >= vocab) continue;
      x[t] -= sp.frequency_penalty * float(c) + sp.presence_penalty;
    }
  }
}

// Masks (-inf) every token outside min-p, top-k and top-p, on temperature-scaled logits `x`.
void apply_filters(std::vector<float>& x, const SamplingParams& sp) {
  const int32_t vocab = int32_t(x.size());
  float mx = kNegInf;
  for (float v : x) mx = std::max(mx, v);
  if (sp.min_p > 0.0f) {
    // p_t >= min_p * p_max  <=>  x_t >= x_max + log(min_p)
    const float floor = mx + std::log(sp.min_p);
    for (float& v : x)
      if (v < floor) v = kNegInf;
  }
  const bool top_k = sp.top_k > 0 && sp.top_k < vocab;
  const bool top_p = sp.top_p < 1.0f;
  if (!top_k && !top_p) return;
  std::vector<int32_t> order;
  order.reserve(x.size());
  for (int32_t t = 0; t < vocab; ++t)
    if (x[t] != kNegInf) order.push_back(t);
  std::sort(order.begin(), order.end(), MoreLikely{x.data()});
  size_t keep = order.size();
  if (top_k) keep = std::min<size_t>(keep, size_t(sp.top_k));
  if (top_p) {
    double total = 0.0;
    for (size_t i = 0; i < keep; ++i) total += std::exp(double(x[order[i]]) - mx);
    double cum = 0.0;
    size_t n = 0;
    while (n < keep) {
      cum += std::exp(double(x[order[n]]) - mx);
      ++n;
      if (cum >= double(sp.top_p) * total) break;
    }
    keep = std::max<size_t>(n, 1);
  }
  for (size_t i = keep; i < order.size(); ++i) x[order[i]] = kNegInf;
}

}  // namespace

SampleResult sample_token(std::span<const float> logits, const SamplingParams& sp, std::span<const int32_t> prompt,
                          std::span<const int32_t> output, uint64_t seed, int64_t position, LogprobsMode mode,
                          std::span<const int32_t> banned, std::span<const uint64_t> allowed) {
  const int32_t vocab = int32_t(logits.size());
  DIL_CHECK(vocab > 0, "empty logits row");
  DIL_CHECK(allowed.empty() || allowed.size() == (size_t(vocab) + 63) / 64, "mask of ", allowed.size(),
            " words for ", vocab, " logits");
  std::vector<float> raw_lp;
  if (sp.logprobs >= 0 && mode == LogprobsMode::Raw) raw_lp = log_softmax(logits);

  std::vector<float> x(logits.begin(), logits.end());  // [vocab] f32, processed in place
  if (!allowed.empty()) {
    bool any = false;
    for (int32_t t = 0; t < vocab; ++t) {
      const bool ok = (allowed[size_t(t) / 64] >> (t % 64)) & 1;
      if (!ok) x[t] = kNegInf;
      any = any || ok;
    }
    DIL_CHECK(any, "sample_token: the mask allows no token");
  }
  if (!sp.allowed_token_ids.empty()) {
    std::vector<float> kept(size_t(vocab), kNegInf);  // [vocab] f32
    for (int32_t t : sp.allowed_token_ids)
      if (t >= 0 && t < vocab) kept[size_t(t)] = x[size_t(t)];
    x.swap(kept);
  }
  for (auto [t, b] : sp.logit_bias)
    if (t >= 0 && t < vocab) x[t] += b;
  for (int32_t t : banned)
    if (t >= 0 && t < vocab) x[t] = kNegInf;
  apply_penalties(x, sp, prompt, output);

  SampleResult r;
  if (sp.temperature < kGreedyTemperature) {
    r.token = int32_t(std::max_element(x.begin(), x.end()) - x.begin());  // first maximum = lowest id
  } else {
    for (float& v : x) v /= sp.temperature;
    apply_filters(x, sp);
    float mx = kNegInf;
    for (float v : x) mx = std::max(mx, v);
    double total = 0.0;
    for (float v : x)
      if (v != kNegInf) total += std::exp(double(v) - mx);
    const double target = philox_uniform(seed, uint64_t(position)) * total;
    double cum = 0.0;
    for (int32_t t = 0; t < vocab; ++t) {
      if (x[t] == kNegInf) continue;
      r.token = t;  // the last kept token catches rounding at the top of the CDF
      cum += std::exp(double(x[t]) - mx);
      if (cum > target) break;
    }
    DIL_CHECK(r.token >= 0, "every token masked");
  }

  if (sp.logprobs >= 0) {
    const std::vector<float>& lp = mode == LogprobsMode::Raw ? raw_lp : (raw_lp = log_softmax(x));
    r.logprob = lp[r.token];
    if (sp.logprobs > 0) r.top = top_n(lp, sp.logprobs);
  }
  return r;
}

}  // namespace dil::runtime
