#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "core/check.h"

namespace dil::runtime {
namespace {

std::vector<SampleResult> unpack(const std::vector<int32_t>& out, const SampleBatch& b) {
  const int64_t width = sample_out_words(b.n_top);
  std::vector<SampleResult> res(b.rows.size());
  for (size_t s = 0; s < b.rows.size(); ++s) {
    const SampledToken t = read_sampled(out.data() + int64_t(s) * width, b.n_top, b.rows[s].n_top);
    res[s].token = t.token;
    res[s].logprob = t.logprob;
    for (auto [id, lp] : t.top) res[s].top.push_back({id, lp});
  }
  return res;
}

}  // namespace

void SampleBatch::add(int32_t src_row, const SamplingParams& sp, std::span<const int32_t> prompt,
                      std::span<const int32_t> output, uint64_t seed, int64_t position,
                      std::span<const int32_t> banned, std::span<const uint64_t> allowed) {
  const int64_t words = (vocab + 63) / 64;
  DIL_CHECK(allowed.empty() || int64_t(allowed.size()) == words, "mask of ", allowed.size(), " words for ", vocab,
            " logits");
  SampleRow r;
  r.src_row = src_row;
  r.temperature = sp.temperature;
  r.top_k = sp.top_k;
  r.top_p = sp.top_p;
  r.min_p_on = sp.min_p > 0.0f;
  r.log_min_p = r.min_p_on ? std::log(sp.min_p) : 0.0f;  // logf on the host: the device adds it
  r.repetition_penalty = sp.repetition_penalty;
  r.frequency_penalty = sp.frequency_penalty;
  r.presence_penalty = sp.presence_penalty;
  r.seed_lo = uint32_t(seed), r.seed_hi = uint32_t(seed >> 32);
  r.pos_lo = uint32_t(uint64_t(position)), r.pos_hi = uint32_t(uint64_t(position) >> 32);
  r.want_logprob = sp.logprobs >= 0;
  r.n_top = std::max(sp.logprobs, 0);
  n_top = std::max(n_top, r.n_top);
  if (!allowed.empty() || !sp.allowed_token_ids.empty()) {
    r.mask_row = int32_t(masks.size() / size_t(words));
    std::vector<uint64_t> m(size_t(words), ~uint64_t(0));  // [words]
    if (!allowed.empty()) {
      DIL_CHECK(std::any_of(allowed.begin(), allowed.end(), [](uint64_t w) { return w != 0; }),
                "sample_token: the mask allows no token");
      std::copy(allowed.begin(), allowed.end(), m.begin());
    }
    if (!sp.allowed_token_ids.empty()) {
      std::vector<uint64_t> keep(size_t(words), 0);
      for (int32_t t : sp.allowed_token_ids)
        if (t >= 0 && t < vocab) keep[size_t(t) / 64] |= uint64_t(1) << (t % 64);
      for (int64_t w = 0; w < words; ++w) m[size_t(w)] &= keep[size_t(w)];
    }
    masks.insert(masks.end(), m.begin(), m.end());
  }
  // Every token the bias, the ban or the penalties touch, once, in id order.
  std::map<int32_t, SampleEdit> ed;
  auto at = [&](int32_t t) -> SampleEdit* {
    if (t < 0 || t >= vocab) return nullptr;
    SampleEdit& e = ed[t];
    e.token = t;
    return &e;
  };
  for (auto [t, b] : sp.logit_bias)
    if (SampleEdit* e = at(t)) e->flags |= SampleEdit::kBias, e->bias = b;
  for (int32_t t : banned)
    if (SampleEdit* e = at(t)) e->flags |= SampleEdit::kBanned;
  if (sp.repetition_penalty != 1.0f) {
    for (int32_t t : prompt)
      if (SampleEdit* e = at(t)) e->flags |= SampleEdit::kSeen;
    for (int32_t t : output)
      if (SampleEdit* e = at(t)) e->flags |= SampleEdit::kSeen;
  }
  if (sp.frequency_penalty != 0.0f || sp.presence_penalty != 0.0f)
    for (int32_t t : output)
      if (SampleEdit* e = at(t)) ++e->out_count;
  r.edit_begin = int32_t(edits.size());
  for (auto& [t, e] : ed) edits.push_back(e);
  r.edit_end = int32_t(edits.size());
  rows.push_back(r);
}

std::vector<SampleResult> SampleBatch::run(Backend& be, const Tensor& logits, LogprobsMode mode) const {
  if (rows.empty()) return {};
  const int64_t S = int64_t(rows.size()), E = int64_t(edits.size()), words = (vocab + 63) / 64;
  const int64_t M = int64_t(masks.size()) / words, width = sample_out_words(n_top);
  const Device dev = be.device();
  // One buffer for the inputs, one for the results.
  const size_t rows_b = size_t(S) * sizeof(SampleRow), edits_b = size_t(E) * sizeof(SampleEdit);
  const size_t masks_b = masks.size() * 8;
  std::vector<char> host(rows_b + edits_b + masks_b);
  std::memcpy(host.data(), rows.data(), rows_b);
  if (E) std::memcpy(host.data() + rows_b, edits.data(), edits_b);
  if (M) std::memcpy(host.data() + rows_b + edits_b, masks.data(), masks_b);
  Buffer in = be.alloc_scratch(host.size()), res = be.alloc(size_t(S * width) * 4);  // in: uploaded whole
  be.upload(Tensor(in.data(), DType::I8, {int64_t(host.size())}, dev), host.data());
  char* base = static_cast<char*>(in.data());
  SampleArgs a;
  a.logits = logits;
  a.rows = Tensor(base, DType::I32, {S, kSampleRowWords}, dev);
  if (E) a.edits = Tensor(base + rows_b, DType::I32, {E, 4}, dev);
  if (M) a.masks = Tensor(base + rows_b + edits_b, DType::I32, {M, 2 * words}, dev);
  a.n_top = n_top;
  a.processed_logprobs = mode == LogprobsMode::Processed;
  a.out = Tensor(res.data(), DType::I32, {S, width}, dev);
  be.sample(a);
  std::vector<int32_t> out(size_t(S * width));  // [S, width]
  be.download(out.data(), a.out);
  return unpack(out, *this);
}

std::vector<SampleResult> SampleBatch::run_host(std::span<const float> logits, LogprobsMode mode) const {
  const int64_t R = int64_t(logits.size()) / vocab, words = (vocab + 63) / 64;
  DIL_CHECK(R * vocab == int64_t(logits.size()), "logits of ", logits.size(), " values for vocab ", vocab);
  std::vector<int32_t> out(rows.size() * size_t(sample_out_words(n_top)));
  sample_rows_reference(logits.data(), R, vocab, rows.data(), int64_t(rows.size()), edits.data(),
                        int64_t(edits.size()), masks.data(), int64_t(masks.size()) / words, n_top,
                        mode == LogprobsMode::Processed, out.data());
  return unpack(out, *this);
}

SampleResult sample_token(std::span<const float> logits, const SamplingParams& sp, std::span<const int32_t> prompt,
                          std::span<const int32_t> output, uint64_t seed, int64_t position, LogprobsMode mode,
                          std::span<const int32_t> banned, std::span<const uint64_t> allowed) {
  DIL_CHECK(!logits.empty(), "empty logits row");
  SampleBatch b(int64_t(logits.size()));
  b.add(0, sp, prompt, output, seed, position, banned, allowed);
  return b.run_host(logits, mode)[0];
}

}  // namespace dil::runtime
