// The sampler as a backend op (Backend::sample): logits stay on the device, only token ids
// and the requested logprobs come back. This file is its specification; `sample_rows_reference`
// is the executable one (the CPU backend's op and the runtime's host helper call it), the CUDA
// kernels (kernels/cuda/sample.cu) equal it: the same tokens always (integer masses,
// sampling_math.h), logprobs within the bound derived in tests/cuda/test_sample.cpp.
//
// Per sampled row s (vLLM v1 Sampler order, runtime/sampler.h has the request-level view):
//  0. l = logits[src_row]; NaN -> -inf (a NaN logit is an impossible token).
//  1. raw logprobs: log_softmax(l).
//  2. x = l; x[t] = -inf where the row's mask has bit t clear (structured output and
//     allowed_token_ids, folded into one bitset by the host).
//  3. per edited token t (host-built list, each token once): x += bias; banned -> -inf;
//     seen in prompt or output and repetition r != 1: x > 0 ? x / r : x * r; output count c > 0:
//     x -= freq * float(c) + presence (f32, one rounding per operation, no FMA); NaN -> -inf.
//  4. temperature < 1e-5: greedy, the first maximum (lowest id). Otherwise x /= T (f32);
//     mx = max x; min-p: x < mx + log_min_p -> -inf (log_min_p = logf(min_p), computed on the host);
//     top-k (0 < k < kept): keep the k first in the order "larger x, then lower id";
//     top-p (< 1): with weights W (sampling_math.h) and total = sum W over the kept, keep the
//     shortest prefix of that order whose mass m has double(m) >= double(top_p) * double(total);
//     draw: target = floor(philox_bits53(seed, position) * total' / 2^53) (total' = sum W of
//     what is left), the token is the first in id order whose inclusive cumulative W > target.
//  5. processed logprobs: log_softmax(x) of the final x (greedy: after step 3).
//  log_softmax(y): lse = my + log(sum exp(double(y) - my)) in double, lp = float(double(y) - lse),
//  -inf stays -inf; my = +inf: the +inf entries get float(-log(n_inf)), the rest -inf.
//  top logprobs: the n_top first tokens by (lp desc, id asc) of the mode's distribution.
//  Nothing left (every x -inf, e.g. all-NaN logits): token -1, logprob -inf (the engine ends the
//  request with an error).
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace dil {

// One sampled row, as packed for the device: plain 4-byte fields (the same layout on host and
// device), kSampleRowWords i32 words.
struct SampleRow {
  int32_t src_row = 0;          // logits row it samples from
  float temperature = 1.0f;     // < 1e-5: greedy
  int32_t top_k = 0;            // <= 0 or >= vocab: off
  float top_p = 1.0f;           // (0, 1]; 1: off
  int32_t min_p_on = 0;         // min-p > 0
  float log_min_p = 0.0f;       // logf(min_p)
  float repetition_penalty = 1.0f, frequency_penalty = 0.0f, presence_penalty = 0.0f;
  uint32_t seed_lo = 0, seed_hi = 0, pos_lo = 0, pos_hi = 0;  // Philox key and counter
  int32_t want_logprob = 0;     // logprob of the token
  int32_t n_top = 0;            // top logprobs (<= SampleArgs::n_top)
  int32_t mask_row = -1;        // row of SampleArgs::masks, -1: every token allowed
  int32_t edit_begin = 0, edit_end = 0;  // its entries of SampleArgs::edits
};
inline constexpr int kSampleRowWords = int(sizeof(SampleRow) / 4);
static_assert(sizeof(SampleRow) % 4 == 0);

// A token the row's bias, ban or penalties touch (4 i32 words).
struct SampleEdit {
  enum : uint32_t { kBias = 1, kBanned = 2, kSeen = 4 };
  int32_t token = 0;
  int32_t out_count = 0;  // occurrences in the output (frequency / presence penalties)
  float bias = 0.0f;
  uint32_t flags = 0;
};
static_assert(sizeof(SampleEdit) == 16);

// Greedy below this temperature (vLLM's _SAMPLING_EPS).
inline constexpr float kGreedyTemperatureEps = 1e-5f;
// Largest SampleArgs::n_top a backend must support (the CUDA kernel ranks them in one block).
inline constexpr int kMaxSampleTop = 1024;

struct SampleArgs {
  Tensor logits;     // [R, V] f32
  Tensor rows;       // [S, kSampleRowWords] i32 (SampleRow)
  Tensor edits;      // [E, 4] i32 (SampleEdit); empty when E == 0
  Tensor masks;      // [M, 2 * ceil(V / 64)] i32: bitsets in little-endian u64 words; empty when M == 0
  int n_top = 0;     // width of the top logprobs in `out` (max of the rows' n_top)
  bool processed_logprobs = false;  // logprobs of the processed distribution (else raw)
  // [S, 2 + 2 * n_top] i32: token, logprob (f32 bits), top ids [n_top] (-1 padded), top logprobs
  // [n_top] (f32 bits).
  Tensor out;
};
inline int64_t sample_out_words(int n_top) { return 2 + 2 * int64_t(n_top); }

// The specification on host memory: `logits` [R, V], rows, edits, masks [M, ceil(V/64)] u64,
// out [S, sample_out_words(n_top)].
// (Pointers and counts: this header is also compiled by nvcc as C++17, without std::span.)
void sample_rows_reference(const float* logits, int64_t R, int64_t V, const SampleRow* rows, int64_t S,
                           const SampleEdit* edits, int64_t E, const uint64_t* masks, int64_t M, int n_top,
                           bool processed_logprobs, int32_t* out);

// A row's result read back from `out`.
struct SampledToken {
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // descending, ties -> lower id
};
SampledToken read_sampled(const int32_t* out_row, int n_top_width, int n_top_row);

}  // namespace dil
