// Sampler parity (issue 25): Backend::sample on the GPU against the specification
// (sample_rows_reference, the CPU backend's op) at V4's vocabulary, for the same logits, seeds
// and parameters. Tokens must be equal, always: every mass is an exact integer sum of weights
// that host and device compute bit for bit (backend/sampling_math.h), so there is no rounding
// for a boundary to fall into. Top-logprob ids must be equal too (the inputs keep distinct
// logprobs apart by far more than the bound below; exact ties are broken by id on both sides).
//
// Logprob bound (derivation). Both sides compute lse = my + log(S), S = sum exp(y_i - my) over
// n <= V finite entries, in double, then lp = float(double(y) - lse).
//  - each exp term: within 1 ulp (2^-52 relative) of exp on either side (glibc, CUDA);
//  - any summation order of n positive terms: relative error <= (n-1) 2^-53;
//    so |S_cpu - S_gpu| / S <= 2 ((n-1) 2^-53 + 2^-52) <= (n+1) 2^-52,
//    and |log S_cpu - log S_gpu| <= (n+1) 2^-52 (1 + tiny) + 2 ulp(log S) <= (n+2) 2^-52 + 2^-51 log n;
//  - the additions my + log S and y - lse round once each per side: 2 * 2^-53 (|lse| + |lp|);
//  - the final float(): |float(a) - float(b)| <= |a - b| + ulp_f32(max(|a|, |b|)).
//  tol(lp) = ulp_f32(|lp|) + (V+2) 2^-52 + 2^-51 log V + 2^-52 (L + |lp|), with L = 256 bounding
//  |lse| here: logits are clamped to |x| <= 24, biases <= 5, penalties at most double them, T >= 0.5,
//  so |y| <= 2 (24 + 5) / 0.5 = 116 and |lse| <= 116 + log V < 256. For V = 129280 the terms
//  beyond the ulp are ~3e-11: in practice the bound is one f32 ulp.
#include <chrono>
#include <cmath>
#include <random>
#include <set>
#include <string>
#include <algorithm>

#include "backend/sampling.h"
#include "parity.h"

namespace dil::test {
namespace {

constexpr int64_t kV = 129280;  // V4-Flash / V4.1-Flash vocabulary
constexpr float kInf = std::numeric_limits<float>::infinity();

float lp_tol(float lp, int64_t V = kV) {
  const float a = std::fabs(lp);
  const float ulp = std::isinf(a) ? 0.0f : std::nextafter(a, kInf) - a;
  return ulp + float(double(V + 2) * 0x1p-52 + 0x1p-51 * std::log(double(V)) + 0x1p-52 * (256.0 + a));
}

std::vector<float> make_logits(int64_t R, uint32_t seed, float quantum, int64_t V = kV) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> x(size_t(R * V));  // [R, V]
  for (float& v : x) {
    v = std::clamp(nd(rng), -24.0f, 24.0f);
    if (quantum > 0) v = std::round(v / quantum) * quantum;  // many exact ties
  }
  return x;
}

// A spread of sampling rows over the logits rows (each row's parameters are its own).
std::vector<SampleRow> make_rows(int64_t R, int S, uint32_t seed, std::vector<SampleEdit>* edits, int64_t* n_masks,
                                 int64_t V = kV) {
  std::mt19937 rng(seed);
  auto pick = [&](std::initializer_list<float> v) { return *(v.begin() + rng() % v.size()); };
  std::vector<SampleRow> rows;
  *n_masks = 0;
  for (int s = 0; s < S; ++s) {
    SampleRow r;
    r.src_row = int32_t(s % R);
    r.temperature = s % 7 == 0 ? 0.0f : pick({0.5f, 0.7f, 1.0f, 1.3f});
    r.top_k = int32_t(pick({0, 0, 1, 5, 50, 2000}));
    r.top_p = pick({1.0f, 0.9f, 0.5f, 0.99f, 0.1f});
    if (s % 3 == 0) r.min_p_on = 1, r.log_min_p = std::log(pick({0.05f, 0.001f, 0.3f}));
    const uint64_t sd = rng() * 0x9E3779B97F4A7C15ull, pos = rng() % 40000;
    r.seed_lo = uint32_t(sd), r.seed_hi = uint32_t(sd >> 32), r.pos_lo = uint32_t(pos), r.pos_hi = 0;
    r.want_logprob = s % 2;
    r.n_top = s % 4 == 1 ? int32_t(pick({1, 5, 20})) : 0;
    if (s % 5 == 2) r.mask_row = int32_t((*n_masks)++);
    r.edit_begin = int32_t(edits->size());
    if (s % 4 == 3) {
      r.repetition_penalty = 1.3f, r.frequency_penalty = 0.4f, r.presence_penalty = 0.25f;
      std::set<int32_t> toks;
      while (toks.size() < std::min<size_t>(300, size_t(V / 2))) toks.insert(int32_t(rng() % V));
      for (int32_t t : toks) {
        SampleEdit e;
        e.token = t;
        e.flags = SampleEdit::kSeen | (t % 3 == 0 ? uint32_t(SampleEdit::kBias) : 0u) |
                  (t % 17 == 0 ? uint32_t(SampleEdit::kBanned) : 0u);
        e.bias = float(int(t % 11) - 5);
        e.out_count = int32_t(t % 4);
        edits->push_back(e);
      }
    }
    r.edit_end = int32_t(edits->size());
    rows.push_back(r);
  }
  return rows;
}

class SampleParity : public CudaParity {
 protected:
  struct Result {
    std::vector<int32_t> out;
    double ms = 0;
  };
  // Runs `rows` on one backend; logits [R, V] and masks are uploaded to it.
  Result run(Backend& be, const std::vector<float>& logits, int64_t R, const std::vector<SampleRow>& rows,
             const std::vector<SampleEdit>& edits, const std::vector<uint64_t>& masks, int n_top, bool processed,
             int reps = 1, int64_t V = kV) {
    const Device d = be.device();
    const int64_t S = int64_t(rows.size()), E = int64_t(edits.size()), words = (V + 63) / 64;
    const int64_t M = int64_t(masks.size()) / words;
    Buffer bl = be.alloc(logits.size() * 4), br = be.alloc(rows.size() * sizeof(SampleRow));
    Buffer be_ = be.alloc(std::max<size_t>(1, edits.size() * sizeof(SampleEdit)));
    Buffer bm = be.alloc(std::max<size_t>(1, masks.size() * 8));
    Buffer bo = be.alloc(size_t(S * sample_out_words(n_top)) * 4);
    SampleArgs a;
    a.logits = Tensor(bl.data(), DType::F32, {R, V}, d);
    a.rows = Tensor(br.data(), DType::I32, {S, kSampleRowWords}, d);
    if (E) a.edits = Tensor(be_.data(), DType::I32, {E, 4}, d);
    if (M) a.masks = Tensor(bm.data(), DType::I32, {M, 2 * words}, d);
    a.n_top = n_top;
    a.processed_logprobs = processed;
    a.out = Tensor(bo.data(), DType::I32, {S, sample_out_words(n_top)}, d);
    be.upload(a.logits, logits.data());
    be.upload(a.rows, rows.data());
    if (E) be.upload(a.edits, edits.data());
    if (M) be.upload(a.masks, masks.data());
    Result res;
    be.sample(a);  // warm-up (and the result)
    if (reps > 1) {
      be.synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) be.sample(a);
      be.synchronize();
      res.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
    }
    res.out.resize(size_t(S * sample_out_words(n_top)));
    be.download(res.out.data(), a.out);
    return res;
  }

  // Compares GPU against CPU row by row; returns the number of rows compared.
  void expect_equal(const std::vector<int32_t>& g, const std::vector<int32_t>& c, const std::vector<SampleRow>& rows,
                    int n_top, const char* what, int64_t V = kV) {
    const int64_t w = sample_out_words(n_top);
    int tokens = 0, lps = 0;
    float worst = 0;
    for (size_t s = 0; s < rows.size(); ++s) {
      const SampledToken a = read_sampled(g.data() + int64_t(s) * w, n_top, rows[s].n_top);
      const SampledToken b = read_sampled(c.data() + int64_t(s) * w, n_top, rows[s].n_top);
      EXPECT_EQ(a.token, b.token) << what << " row " << s;
      tokens += a.token == b.token;
      if (rows[s].want_logprob || rows[s].n_top) {
        if (std::isinf(b.logprob)) EXPECT_EQ(a.logprob, b.logprob) << what << " row " << s;
        else EXPECT_LE(std::fabs(a.logprob - b.logprob), lp_tol(b.logprob, V)) << what << " row " << s;
        if (!std::isinf(b.logprob)) worst = std::max(worst, std::fabs(a.logprob - b.logprob));
        ++lps;
      }
      ASSERT_EQ(a.top.size(), b.top.size()) << what << " row " << s;
      for (size_t j = 0; j < b.top.size(); ++j) {
        EXPECT_EQ(a.top[j].first, b.top[j].first) << what << " row " << s << " top " << j;
        if (std::isinf(b.top[j].second)) EXPECT_EQ(a.top[j].second, b.top[j].second);
        else EXPECT_LE(std::fabs(a.top[j].second - b.top[j].second), lp_tol(b.top[j].second, V));
      }
    }
    std::printf("INFO   | sample parity %s: %zu rows, %d tokens equal, %d logprobs, max |dlp| %.3g\n", what,
                rows.size(), tokens, lps, double(worst));
  }
};

void add_masks(std::vector<uint64_t>* masks, int64_t n, uint32_t seed, int64_t V = kV) {
  std::mt19937_64 rng(seed);
  const int64_t words = (V + 63) / 64;
  for (int64_t m = 0; m < n; ++m)
    for (int64_t w = 0; w < words; ++w) masks->push_back(m % 2 ? rng() & rng() : (w % 97 == 0 ? rng() : 0));
}

TEST_F(SampleParity, DrawsEqualTheCpu) {
  const int64_t R = 6;
  for (float quantum : {0.0f, 0.25f}) {  // distinct values; many exact ties
    const std::vector<float> logits = make_logits(R, 7 + int(quantum * 4), quantum);
    std::vector<SampleEdit> edits;
    int64_t M = 0;
    const std::vector<SampleRow> rows = make_rows(R, 96, 3, &edits, &M);
    std::vector<uint64_t> masks;
    add_masks(&masks, M, 9);
    for (bool processed : {false, true}) {
      const int n_top = 20;
      const auto g = run(*gpu, logits, R, rows, edits, masks, n_top, processed);
      const auto c = run(*cpu, logits, R, rows, edits, masks, n_top, processed);
      expect_equal(g.out, c.out, rows, n_top,
                   quantum > 0 ? (processed ? "ties processed" : "ties raw") : (processed ? "processed" : "raw"));
    }
  }
}

// Many draws from one logits row at different positions: the draw's target sweeps the whole
// CDF, so every boundary region is visited.
TEST_F(SampleParity, ManyPositionsOneRow) {
  const std::vector<float> logits = make_logits(1, 21, 0.0f);
  for (float t : {1.0f, 2.5f}) {
    std::vector<SampleRow> rows;
    for (int i = 0; i < 512; ++i) {
      SampleRow r;
      r.temperature = t;
      r.top_p = i % 2 ? 0.95f : 1.0f;
      r.seed_lo = 1234, r.pos_lo = uint32_t(i);
      rows.push_back(r);
    }
    const auto g = run(*gpu, logits, 1, rows, {}, {}, 0, false);
    const auto c = run(*cpu, logits, 1, rows, {}, {}, 0, false);
    expect_equal(g.out, c.out, rows, 0, t > 1 ? "positions T2.5" : "positions T1");
  }
}

TEST_F(SampleParity, NonFiniteLogits) {
  const int64_t R = 4;
  std::vector<float> logits = make_logits(R, 5, 0.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t t = 0; t < kV; t += 3) logits[size_t(t)] = nan;                 // row 0: a third NaN
  for (int64_t t : {17, 90000, 129279}) logits[size_t(kV + t)] = kInf;        // row 1: three +inf
  for (int64_t t = 0; t < kV; ++t) logits[size_t(2 * kV + t)] = t % 2 ? nan : -kInf;  // row 2: nothing
  for (int64_t t = 0; t < kV; t += 2) logits[size_t(3 * kV + t)] = 3e38f;      // row 3: overflow at T < 1
  std::vector<SampleRow> rows;
  for (int s = 0; s < 32; ++s) {
    SampleRow r;
    r.src_row = s % 4;
    r.temperature = s % 8 < 2 ? 0.0f : (s % 2 ? 0.5f : 1.0f);
    r.top_k = s % 3 == 0 ? 10 : 0;
    r.top_p = s % 5 == 0 ? 0.7f : 1.0f;
    r.seed_lo = uint32_t(s), r.pos_lo = uint32_t(s * 7);
    r.want_logprob = 1;
    r.n_top = 5;
    rows.push_back(r);
  }
  for (bool processed : {false, true}) {
    const auto g = run(*gpu, logits, R, rows, {}, {}, 5, processed);
    const auto c = run(*cpu, logits, R, rows, {}, {}, 5, processed);
    expect_equal(g.out, c.out, rows, 5, processed ? "non-finite processed" : "non-finite raw");
    for (size_t s = 2; s < rows.size(); s += 4) EXPECT_EQ(g.out[s * sample_out_words(5)], -1);
  }
}

// Vocabularies the fast kernel (a cluster of 8 CTAs, sample_cluster.cu) splits unevenly or
// into empty slices (V < 8), and one too large for its shared memory (the CTA-per-row
// fallback, sample.cu): the same parity with every option on.
TEST_F(SampleParity, OtherVocabularies) {
  for (int64_t V : {int64_t(5), int64_t(1000), int64_t(50021), int64_t(190000)}) {
    const int64_t R = 3;
    const std::vector<float> logits = make_logits(R, 11 + uint32_t(V), V > 100 ? 0.0f : 0.5f, V);
    std::vector<SampleEdit> edits;
    int64_t M = 0;
    std::vector<SampleRow> rows = make_rows(R, 24, 5, &edits, &M, V);
    for (SampleRow& r : rows) r.n_top = std::min<int32_t>(r.n_top, int32_t(V));
    std::vector<uint64_t> masks;
    add_masks(&masks, M, 2, V);
    const int n_top = int(std::min<int64_t>(20, V));
    for (bool processed : {false, true}) {
      const auto g = run(*gpu, logits, R, rows, edits, masks, n_top, processed, 1, V);
      const auto c = run(*cpu, logits, R, rows, edits, masks, n_top, processed, 1, V);
      const std::string what = "V=" + std::to_string(V) + (processed ? " processed" : " raw");
      expect_equal(g.out, c.out, rows, n_top, what.c_str(), V);
    }
  }
}

// A row's result does not depend on the rows sampled with it (one CTA per row, fixed-order
// reductions): bitwise the same alone and inside a batch; and the time per batch.
TEST_F(SampleParity, BatchInvariantAndTimed) {
  const int64_t R = 256;
  const std::vector<float> logits = make_logits(R, 31, 0.0f);
  std::vector<SampleEdit> edits;
  int64_t M = 0;
  const std::vector<SampleRow> rows = make_rows(R, int(R), 8, &edits, &M);
  std::vector<uint64_t> masks;
  add_masks(&masks, M, 4);
  const auto all = run(*gpu, logits, R, rows, edits, masks, 20, false, 20);
  const int64_t w = sample_out_words(20);
  for (size_t s : {size_t(0), size_t(3), size_t(100), size_t(255)}) {
    std::vector<SampleRow> one = {rows[s]};
    std::vector<SampleEdit> e(edits.begin() + rows[s].edit_begin, edits.begin() + rows[s].edit_end);
    one[0].edit_begin = 0, one[0].edit_end = int32_t(e.size());
    std::vector<uint64_t> m;
    if (rows[s].mask_row >= 0) {
      const int64_t words = (kV + 63) / 64;
      m.assign(masks.begin() + rows[s].mask_row * words, masks.begin() + (rows[s].mask_row + 1) * words);
      one[0].mask_row = 0;
    }
    const auto alone = run(*gpu, logits, R, one, e, m, 20, false);
    for (int64_t i = 0; i < w; ++i) EXPECT_EQ(alone.out[size_t(i)], all.out[size_t(int64_t(s) * w + i)]) << s;
  }
  std::vector<SampleRow> greedy(static_cast<size_t>(R));
  for (int64_t s = 0; s < R; ++s) greedy[size_t(s)].src_row = int32_t(s), greedy[size_t(s)].temperature = 0;
  const auto g = run(*gpu, logits, R, greedy, {}, {}, 0, false, 20);
  std::vector<SampleRow> topp = greedy;
  for (SampleRow& r : topp) r.temperature = 0.8f, r.top_p = 0.95f, r.top_k = 0;
  const auto p = run(*gpu, logits, R, topp, {}, {}, 0, false, 20);
  std::printf("INFO   | sample time V=%lld rows=%lld: mixed %.3f ms, greedy %.3f ms, top_p %.3f ms\n", (long long)kV,
              (long long)R, all.ms, g.ms, p.ms);
  for (int64_t n : {int64_t(1), int64_t(64)}) {  // the decode batches of the acceptance
    const std::vector<SampleRow> sub(topp.begin(), topp.begin() + n);
    const auto q = run(*gpu, logits, R, sub, {}, {}, 0, false, 20);
    std::printf("INFO   | sample time V=%lld rows=%lld: top_p %.3f ms\n", (long long)kV, (long long)n, q.ms);
  }
}

}  // namespace
}  // namespace dil::test
