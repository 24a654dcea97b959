// The sampler's executable specification (formulas in sampling.h): plain loops over one row at
// a time, so a row's result depends on nothing else in the batch.
#include "backend/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "backend/sampling_math.h"
#include "core/check.h"

namespace dil {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kInf = std::numeric_limits<float>::infinity();

float sanitize(float v) { return std::isnan(v) ? kNegInf : v; }

// log_softmax of y (sampling.h), every entry.
std::vector<float> log_softmax(const std::vector<float>& y) {
  float my = kNegInf;
  for (float v : y) my = std::max(my, v);
  std::vector<float> lp(y.size(), kNegInf);
  if (my == kNegInf) return lp;
  if (my == kInf) {
    int64_t n = 0;
    for (float v : y) n += v == kInf;
    const float l = float(-std::log(double(n)));
    for (size_t i = 0; i < y.size(); ++i)
      if (y[i] == kInf) lp[i] = l;
    return lp;
  }
  double sum = 0.0;
  for (float v : y)
    if (v != kNegInf) sum += std::exp(double(v) - double(my));
  const double lse = double(my) + std::log(sum);
  for (size_t i = 0; i < y.size(); ++i)
    if (y[i] != kNegInf) lp[i] = float(double(y[i]) - lse);
  return lp;
}

struct First {  // "larger value first, ties to the lower id"
  const float* v;
  bool operator()(int32_t a, int32_t b) const { return v[a] != v[b] ? v[a] > v[b] : a < b; }
};

// Steps 4's filters and draw on temperature-scaled x; returns the token (-1: nothing left).
int32_t filter_and_draw(std::vector<float>& x, const SampleRow& r, int F) {
  const int64_t V = int64_t(x.size());
  float mx = kNegInf;
  for (float v : x) mx = std::max(mx, v);
  if (mx == kNegInf) return -1;
  if (r.min_p_on) {
    const float floor = mx + r.log_min_p;
    for (float& v : x)
      if (v < floor) v = kNegInf;
  }
  const bool top_p = r.top_p < 1.0f;
  std::vector<int32_t> order;
  for (int32_t t = 0; t < V; ++t)
    if (x[size_t(t)] != kNegInf) order.push_back(t);
  const bool top_k = r.top_k > 0 && int64_t(r.top_k) < int64_t(order.size());
  if (top_k || top_p) {
    std::sort(order.begin(), order.end(), First{x.data()});
    size_t keep = order.size();
    if (top_k) keep = size_t(r.top_k);
    if (top_p) {
      uint64_t total = 0;
      for (size_t i = 0; i < keep; ++i) total += sampling::weight(x[size_t(order[i])], mx, F);
      const double thr = double(r.top_p) * double(total);
      uint64_t cum = 0;
      size_t n = 0;
      while (n < keep) {
        cum += sampling::weight(x[size_t(order[n])], mx, F);
        ++n;
        if (double(cum) >= thr) break;
      }
      keep = n;
    }
    for (size_t i = keep; i < order.size(); ++i) x[size_t(order[i])] = kNegInf;
  }
  uint64_t total = 0;
  for (float v : x) total += sampling::weight(v, mx, F);
  DIL_CHECK(total > 0, "sampler: the row maximum lost its weight");
  const uint64_t seed = uint64_t(r.seed_hi) << 32 | r.seed_lo, pos = uint64_t(r.pos_hi) << 32 | r.pos_lo;
  const uint64_t target = sampling::draw_target(sampling::philox_bits53(seed, pos), total);
  uint64_t cum = 0;
  for (int32_t t = 0; t < V; ++t) {
    cum += sampling::weight(x[size_t(t)], mx, F);
    if (cum > target) return t;
  }
  DIL_FAIL("sampler: the draw's target ", target, " is not below the total ", total);
}

}  // namespace

void sample_rows_reference(const float* logits, int64_t R, int64_t V, const SampleRow* rows, int64_t S,
                           const SampleEdit* edits, int64_t E, const uint64_t* masks, int64_t M, int n_top,
                           bool processed_logprobs, int32_t* out) {
  DIL_CHECK(V > 0 && n_top >= 0 && n_top <= kMaxSampleTop, "sample: vocab ", V, ", n_top ", n_top);
  const int F = sampling::weight_bits(V);
  const int64_t words = (V + 63) / 64, width = sample_out_words(n_top);
  for (int64_t s = 0; s < S; ++s) {
    const SampleRow& r = rows[s];
    DIL_CHECK(r.src_row >= 0 && r.src_row < R, "sample: logits row ", r.src_row, " of ", R);
    DIL_CHECK(r.mask_row < M && r.edit_begin >= 0 && r.edit_begin <= r.edit_end &&
                  r.edit_end <= E && r.n_top >= 0 && r.n_top <= n_top,
              "sample: row ", s, " refers outside the batch");
    const float* l = logits + r.src_row * V;
    std::vector<float> x(static_cast<size_t>(V));  // [V] f32, processed in place
    for (int64_t t = 0; t < V; ++t) x[size_t(t)] = sanitize(l[t]);
    std::vector<float> raw;  // [V] the sanitized logits, for raw logprobs
    const bool lp_any = r.want_logprob || r.n_top > 0;
    if (lp_any && !processed_logprobs) raw = x;
    if (r.mask_row >= 0) {
      const uint64_t* m = masks + r.mask_row * words;
      for (int64_t t = 0; t < V; ++t)
        if (!((m[t / 64] >> (t % 64)) & 1)) x[size_t(t)] = kNegInf;
    }
    for (int32_t e = r.edit_begin; e < r.edit_end; ++e) {
      const SampleEdit& ed = edits[e];
      DIL_CHECK(ed.token >= 0 && ed.token < V, "sample: edit of token ", ed.token);
      float& v = x[size_t(ed.token)];
      if (ed.flags & SampleEdit::kBias) v = v + ed.bias;
      if (ed.flags & SampleEdit::kBanned) v = kNegInf;
      if ((ed.flags & SampleEdit::kSeen) && r.repetition_penalty != 1.0f)
        v = v > 0 ? v / r.repetition_penalty : v * r.repetition_penalty;
      if (ed.out_count > 0 && (r.frequency_penalty != 0.0f || r.presence_penalty != 0.0f)) {
        const float pen = r.frequency_penalty * float(ed.out_count);
        v = v - (pen + r.presence_penalty);
      }
      v = sanitize(v);
    }
    int32_t token = -1;
    if (r.temperature < kGreedyTemperatureEps) {
      float best = kNegInf;
      for (int64_t t = 0; t < V; ++t)
        if (x[size_t(t)] > best) best = x[size_t(t)], token = int32_t(t);
    } else {
      for (float& v : x) v = v / r.temperature;
      token = filter_and_draw(x, r, F);
    }
    int32_t* o = out + int64_t(s) * width;
    std::fill(o, o + width, 0);
    std::fill(o + 2, o + 2 + n_top, -1);
    o[0] = token;
    if (token < 0) o[1] = int32_t(sampling::float_bits(kNegInf));
    if (token < 0 || !lp_any) continue;
    const std::vector<float> lp = log_softmax(processed_logprobs ? x : raw);
    o[1] = int32_t(sampling::float_bits(lp[size_t(token)]));
    const int n = int(std::min<int64_t>(r.n_top, V));
    std::vector<int32_t> idx(static_cast<size_t>(V));
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), First{lp.data()});
    for (int i = 0; i < n; ++i) {
      o[2 + i] = idx[size_t(i)];
      o[2 + n_top + i] = int32_t(sampling::float_bits(lp[size_t(idx[size_t(i)])]));
    }
  }
}

SampledToken read_sampled(const int32_t* o, int n_top_width, int n_top_row) {
  SampledToken r;
  r.token = o[0];
  r.logprob = sampling::bits_float(uint32_t(o[1]));
  for (int i = 0; i < n_top_row && i < n_top_width; ++i)
    if (o[2 + i] >= 0) r.top.push_back({o[2 + i], sampling::bits_float(uint32_t(o[2 + n_top_width + i]))});
  return r;
}

}  // namespace dil

#include "backend/backend.h"

namespace dil {

void Backend::sample(const SampleArgs& a) {
  DIL_CHECK(a.logits.ndim == 2 && a.logits.dtype == DType::F32, "sample: logits must be [R, V] f32");
  const int64_t R = a.logits.shape[0], V = a.logits.shape[1], S = a.rows.numel() / kSampleRowWords;
  const int64_t E = a.edits.empty() ? 0 : a.edits.numel() / 4, words = (V + 63) / 64;
  const int64_t M = a.masks.empty() ? 0 : a.masks.numel() / (2 * words);
  DIL_CHECK(a.out.numel() == S * sample_out_words(a.n_top), "sample: out has ", a.out.numel(), " words for ", S,
            " rows of ", sample_out_words(a.n_top));
  std::vector<float> logits(size_t(R * V));  // [R, V]
  download(logits.data(), a.logits);
  std::vector<SampleRow> rows(static_cast<size_t>(S));
  if (S) download(rows.data(), a.rows);
  std::vector<SampleEdit> edits(static_cast<size_t>(E));
  if (E) download(edits.data(), a.edits);
  std::vector<uint64_t> masks(size_t(M * words));  // [M, words]
  if (M) download(masks.data(), a.masks);
  std::vector<int32_t> out(size_t(a.out.numel()));  // [S, 2 + 2 n_top]
  sample_rows_reference(logits.data(), R, V, rows.data(), S, edits.data(), E, masks.data(), M, a.n_top,
                        a.processed_logprobs, out.data());
  if (S) upload(a.out, out.data());
}

}  // namespace dil
