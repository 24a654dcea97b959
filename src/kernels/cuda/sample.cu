// Backend::sample on the device (semantics and reference: backend/sampling.h, sampling.cpp).
// The fallback kernel (sample_cluster.cu is the fast one, used whenever a vocabulary slice
// fits its shared memory). One CTA of kThreads per sampled row, so a row's result never depends on the batch, and
// every reduction has a fixed order (run to run, batch to batch: the same bits).
//
// No sort of the vocabulary: top-k, top-p and the top logprobs are radix searches over the
// 64-bit token key "value, then lower id" (sampling_math.h token_key, unique per token), MSB
// first, 8 bits per pass (7 passes for a 129K vocabulary): each pass histograms a quantity
// (a count, or the integer weight W) over the tokens that match the digits decided so far and
// picks the digit where the cumulative quantity, taken from the largest key down, first meets
// the predicate; after the last pass the key of the boundary token is known exactly. Masses
// are integer sums (shared-memory atomics on uint64 are order-free), so the cut and the draw
// equal the CPU's. The draw scans the vocabulary in id order: per-thread contiguous chunks,
// a block scan of their masses, then the thread whose chunk holds the target walks it.
// Logprob sums are doubles reduced in a fixed tree (within the bound of the parity test).
//
// Memory: one [S, V] f32 scratch of processed logits (arena); logits are read once, the
// scratch about 2 + 7 per search (top-k, top-p, top logprobs) + 2 (draw) times per row.
#include <cfloat>
#include <climits>

#include "backend/sampling.h"
#include "backend/sampling_math.h"
#include "kernels/cuda/ops.cuh"
#include "kernels/cuda/sample_block.cuh"

namespace dil::cuda {
namespace {

// The largest key K such that pred(sum of q over tokens with key >= K) holds, given that it
// fails for the empty sum and holds over everything. item(t, &key) returns q (0: not counted).
template <class Item>
__device__ u64 radix_search(int V, int key_bits, Item item, Pred pred, Smem& s) {
  const int passes = (key_bits + 7) / 8;
  u64 prefix = 0, above = 0;
  for (int p = passes - 1; p >= 0; --p) {
    const int shift = 8 * p;
    for (int i = threadIdx.x; i < 256; i += kThreads) s.hist[i] = 0;
    __syncthreads();
    for (int t = threadIdx.x; t < V; t += kThreads) {
      u64 key;
      const u64 q = item(t, &key);
      if (q == 0) continue;
      if (shift + 8 < 64 && ((key ^ prefix) >> (shift + 8)) != 0) continue;
      atomicAdd(&s.hist[(key >> shift) & 255], q);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      const int l = threadIdx.x;
      u64 loc[8], sum = 0;
      for (int j = 0; j < 8; ++j) sum += loc[j] = s.hist[255 - 8 * l - j];  // descending digits
      u64 incl = sum;
      for (int o = 1; o < 32; o <<= 1) {
        const u64 n = __shfl_up_sync(~0u, incl, o);
        if (l >= o) incl += n;
      }
      u64 run = above + incl - sum;
      int found = -1;
      u64 before = 0;
      for (int j = 0; j < 8; ++j) {
        if (found < 0 && pred(run + loc[j])) found = j, before = run;
        run += loc[j];
      }
      const unsigned hit = __ballot_sync(~0u, found >= 0);
      const int first = hit ? __ffs(hit) - 1 : 0;
      if (l == first) {
        s.b_i[0] = found >= 0 ? 255 - 8 * l - found : 0;
        s.b_u[1] = found >= 0 ? before : above;
      }
    }
    __syncthreads();
    prefix |= u64(s.b_i[0]) << shift;
    above = s.b_u[1];
    __syncthreads();
  }
  return prefix;
}

template <class Load>
__device__ Lse row_lse(int V, Load y, Smem& s) {
  float m = neg_inf();
  for (int t = threadIdx.x; t < V; t += kThreads) m = fmaxf(m, y(t));
  Lse r;
  r.my = block_max(m, s);
  r.lse = 0.0;
  r.inf_lp = neg_inf();
  if (r.my == sm::f_inf()) {
    u64 n = 0;
    for (int t = threadIdx.x; t < V; t += kThreads) n += y(t) == sm::f_inf();
    n = block_sum_u(n, s);
    r.inf_lp = __double2float_rn(-log(__ull2double_rn(n)));
  } else if (r.my != neg_inf()) {
    double sum = 0.0;
    for (int t = threadIdx.x; t < V; t += kThreads) {
      const float v = y(t);
      if (v != neg_inf()) sum = __dadd_rn(sum, exp(__dadd_rn(double(v), -double(r.my))));
    }
    sum = block_sum_d(sum, s);
    r.lse = __dadd_rn(double(r.my), log(sum));
  }
  return r;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const float* __restrict__ logits, int V,
                                                          const SampleRow* __restrict__ rows,
                                                          const SampleEdit* __restrict__ edits,
                                                          const u64* __restrict__ masks, float* __restrict__ xbuf,
                                                          int n_top_w, int processed, int32_t* __restrict__ out) {
  pdl_enter();
  __shared__ Smem s;
  const int srow = blockIdx.x;
  const SampleRow r = rows[srow];
  const float* l = logits + int64_t(r.src_row) * V;
  float* x = xbuf + int64_t(srow) * V;
  const int64_t words = (V + 63) / 64;
  const u64* m = r.mask_row >= 0 ? masks + int64_t(r.mask_row) * words : nullptr;
  const int F = sm::weight_bits(V), idb = sm::id_bits(V);
  const float ninf = neg_inf();

  // Steps 0, 2, 3: sanitize, mask, edits.
  for (int t = threadIdx.x; t < V; t += kThreads) {
    float v = sanitize(l[t]);
    if (m && !((m[t / 64] >> (t % 64)) & 1)) v = ninf;
    x[t] = v;
  }
  __syncthreads();
  for (int e = r.edit_begin + int(threadIdx.x); e < r.edit_end; e += kThreads) {
    const SampleEdit ed = edits[e];
    float v = x[ed.token];
    if (ed.flags & SampleEdit::kBias) v = __fadd_rn(v, ed.bias);
    if (ed.flags & SampleEdit::kBanned) v = ninf;
    if ((ed.flags & SampleEdit::kSeen) && r.repetition_penalty != 1.0f)
      v = v > 0 ? __fdiv_rn(v, r.repetition_penalty) : __fmul_rn(v, r.repetition_penalty);
    if (ed.out_count > 0 && (r.frequency_penalty != 0.0f || r.presence_penalty != 0.0f))
      v = __fsub_rn(v, __fadd_rn(__fmul_rn(r.frequency_penalty, float(ed.out_count)), r.presence_penalty));
    x[ed.token] = sanitize(v);
  }
  __syncthreads();

  int token = -1;
  if (r.temperature < kGreedyTemperatureEps) {
    // First maximum: the largest key among finite-or-inf values.
    float best = ninf;
    int bi = INT_MAX;
    for (int t = threadIdx.x; t < V; t += kThreads)
      if (x[t] > best) best = x[t], bi = t;
    const float mxv = block_max(best, s);
    int cand = best == mxv && mxv != ninf ? bi : INT_MAX;
    for (int o = 16; o > 0; o >>= 1) cand = min(cand, __shfl_xor_sync(~0u, cand, o));
    if (threadIdx.x % 32 == 0) s.i_red[threadIdx.x / 32] = cand;
    __syncthreads();
    if (threadIdx.x < 32) {
      int c = s.i_red[threadIdx.x];
      for (int o = 16; o > 0; o >>= 1) c = min(c, __shfl_xor_sync(~0u, c, o));
      if (threadIdx.x == 0) s.b_i[1] = c == INT_MAX ? -1 : c;
    }
    __syncthreads();
    token = s.b_i[1];
  } else {
    float mx = ninf;
    for (int t = threadIdx.x; t < V; t += kThreads) {
      const float v = __fdiv_rn(x[t], r.temperature);
      x[t] = v;
      mx = fmaxf(mx, v);
    }
    mx = block_max(mx, s);  // also orders the writes above before the reads below
    if (mx != ninf) {
      u64 kept = 0;
      const float floor = __fadd_rn(mx, r.log_min_p);
      for (int t = threadIdx.x; t < V; t += kThreads) {
        float v = x[t];
        if (r.min_p_on && v < floor) x[t] = v = ninf;
        kept += v != ninf;
      }
      kept = block_sum_u(kept, s);
      if (r.top_k > 0 && u64(r.top_k) < kept) {
        const u64 kk = radix_search(
            V, 32 + idb,
            [&](int t, u64* key) -> u64 {
              const float v = x[t];
              *key = sm::token_key(v, t, idb);
              return v != ninf;
            },
            Pred{false, u64(r.top_k), 0.0}, s);
        for (int t = threadIdx.x; t < V; t += kThreads)
          if (x[t] != ninf && sm::token_key(x[t], t, idb) < kk) x[t] = ninf;
        __syncthreads();
      }
      if (r.top_p < 1.0f) {
        u64 tot = 0;
        for (int t = threadIdx.x; t < V; t += kThreads) tot += sm::weight(x[t], mx, F);
        tot = block_sum_u(tot, s);
        const double thr = __dmul_rn(double(r.top_p), __ull2double_rn(tot));
        const u64 kp = radix_search(
            V, 32 + idb,
            [&](int t, u64* key) -> u64 {
              const float v = x[t];
              *key = sm::token_key(v, t, idb);
              return sm::weight(v, mx, F);
            },
            Pred{true, 0, thr}, s);
        for (int t = threadIdx.x; t < V; t += kThreads)
          if (x[t] != ninf && sm::token_key(x[t], t, idb) < kp) x[t] = ninf;
        __syncthreads();
      }
      // The draw, in id order over contiguous chunks.
      const int chunk = (V + kThreads - 1) / kThreads;
      const int t0 = min(V, int(threadIdx.x) * chunk), t1 = min(V, t0 + chunk);
      u64 mine = 0;
      for (int t = t0; t < t1; ++t) mine += sm::weight(x[t], mx, F);
      const u64 incl = block_scan_u(mine, s);
      const u64 total = block_sum_u(mine, s);
      const u64 seed = u64(r.seed_hi) << 32 | r.seed_lo, pos = u64(r.pos_hi) << 32 | r.pos_lo;
      const u64 target = sm::draw_target(sm::philox_bits53(seed, pos), total);
      if (threadIdx.x == 0) s.b_i[1] = -1;
      __syncthreads();
      if (incl - mine <= target && target < incl) {
        u64 cum = incl - mine;
        for (int t = t0; t < t1; ++t) {
          cum += sm::weight(x[t], mx, F);
          if (cum > target) {
            s.b_i[1] = t;
            break;
          }
        }
      }
      __syncthreads();
      token = s.b_i[1];
    }
  }

  int32_t* o = out + int64_t(srow) * (2 + 2 * int64_t(n_top_w));
  for (int i = threadIdx.x; i < 2 + 2 * n_top_w; i += kThreads) o[i] = i >= 2 && i < 2 + n_top_w ? -1 : 0;
  __syncthreads();
  if (threadIdx.x == 0) {
    o[0] = token;
    if (token < 0) o[1] = int32_t(sm::float_bits(ninf));
  }
  if (token < 0 || !(r.want_logprob || r.n_top > 0)) return;

  // Step 5 / 1: logprobs of the mode's distribution.
  auto y = [&](int t) { return processed ? x[t] : sanitize(l[t]); };
  const Lse lse = row_lse(V, y, s);
  if (threadIdx.x == 0) o[1] = int32_t(sm::float_bits(lse(y(token))));
  const int n = min(r.n_top, V);
  if (n == 0) return;
  const u64 kn = radix_search(
      V, 32 + idb,
      [&](int t, u64* key) -> u64 {
        *key = sm::token_key(lse(y(t)), t, idb);
        return 1;
      },
      Pred{false, u64(n), 0.0}, s);
  if (threadIdx.x == 0) s.n_top = 0;
  __syncthreads();
  for (int t = threadIdx.x; t < V; t += kThreads) {
    const u64 key = sm::token_key(lse(y(t)), t, idb);
    if (key >= kn) {
      const int i = atomicAdd(&s.n_top, 1);
      s.top_key[i] = key;
      s.top_id[i] = t;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += kThreads) {  // rank = keys larger than mine (unique keys)
    int rank = 0;
    for (int j = 0; j < n; ++j) rank += s.top_key[j] > s.top_key[i];
    const int t = s.top_id[i];
    o[2 + rank] = t;
    o[2 + n_top_w + rank] = int32_t(sm::float_bits(lse(y(t))));
  }
}

}  // namespace

void sample(Ctx& c, const SampleArgs& a) {
  DIL_CHECK(a.logits.ndim == 2 && a.logits.dtype == DType::F32, "sample: logits must be [R, V] f32");
  const int64_t V = a.logits.shape[1], S = a.rows.numel() / kSampleRowWords;
  DIL_CHECK(a.n_top >= 0 && a.n_top <= kMaxSampleTop, "sample: n_top ", a.n_top, " above ", kMaxSampleTop);
  DIL_CHECK(V > 0 && V < (int64_t(1) << 30), "sample: vocab ", V);
  DIL_CHECK(a.out.numel() == S * sample_out_words(a.n_top), "sample: out of ", a.out.numel(), " words");
  if (sample_cluster(c, a)) return;
  if (S == 0) return;
  Buffer xbuf = c.scratch(size_t(S * V) * 4);  // [S, V] f32 processed logits
  launch_pdl(c, "sample_kernel", sample_kernel, dim3(unsigned(S)), dim3(kThreads), 0,
      a.logits.ptr<float>(), int(V), static_cast<const SampleRow*>(a.rows.data),
      a.edits.empty() ? nullptr : static_cast<const SampleEdit*>(a.edits.data),
      a.masks.empty() ? nullptr : static_cast<const u64*>(a.masks.data), static_cast<float*>(xbuf.data()), a.n_top,
      a.processed_logprobs ? 1 : 0, a.out.ptr<int32_t>());
}

}  // namespace dil::cuda
