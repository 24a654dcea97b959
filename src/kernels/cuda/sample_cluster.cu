// Backend::sample on the device, the fast kernel (semantics: backend/sampling.h; the CTA-per-row
// kernel in sample.cu is the fallback for vocabularies too large for it). A thread-block cluster
// of kCluster CTAs samples one row: CTA c owns the contiguous slice [c n, c n + n) of the
// vocabulary (n = ceil(V / kCluster)) and keeps its processed logits x [n] f32 and integer
// weights W [n] u64 in shared memory, so the logits are read from global memory once and every
// later pass (filters, radix searches, draw, logprobs) runs on chip. At V = 129,280 a slice is
// 16,160 tokens, 194 KB: one CTA per SM.
//
// Why clusters: a CTA per row left half the GPU idle at batch 64 and re-read the [V] scratch
// from global memory ~20 times per row (one SM cannot pull much bandwidth), and it evaluated
// the weight W (an exp in double) about ten times per token; here W is computed once per
// token and the row is spread over kCluster SMs.
//
// Cross-CTA steps go through distributed shared memory: each CTA reduces its slice in the
// fixed order of sample_block.cuh, publishes the result in its shared memory, and after a
// cluster barrier every CTA combines the kCluster partials in rank order (so all CTAs hold the
// same bits and take the same branches; a second barrier guards the slots against reuse, and
// no CTA exits while another may still read it). Masses are integer sums, so cuts and draws
// equal the CPU's exactly; the lse sum is a double tree of fixed shape (the parity test's bound).
// A row's result depends on nothing else in the batch.
#include <cooperative_groups.h>

#include "kernels/cuda/ops.cuh"
#include "kernels/cuda/sample_block.cuh"

namespace dil::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kCluster = 8;  // the portable maximum cluster size

struct CSmem {
  Smem b;                           // block reductions (sample_block.cuh)
  float top_lp[kMaxSampleTop];      // with b.top_key / b.top_id: this slice's top-logprob entries
  u64 x_u;                          // published partials (read by the other CTAs)
  double x_d;
  float x_f;
  int x_i;
  int gofs[kCluster + 1];           // rank 0: where each slice's entries go in the gathered list
  u64 hist_odd[256];                // the radix searches' second histogram buffer
  u64 comb[256];                    // the cluster's histogram of a pass
};

__device__ float cl_max(cg::cluster_group& cl, float v, CSmem& s) {
  v = block_max(v, s.b);
  if (threadIdx.x == 0) s.x_f = v;
  cl.sync();
  float r = neg_inf();
  for (int c = 0; c < kCluster; ++c) r = fmaxf(r, *cl.map_shared_rank(&s.x_f, c));
  cl.sync();
  return r;
}

__device__ u64 cl_sum_u(cg::cluster_group& cl, u64 v, CSmem& s) {
  v = block_sum_u(v, s.b);
  if (threadIdx.x == 0) s.x_u = v;
  cl.sync();
  u64 r = 0;
  for (int c = 0; c < kCluster; ++c) r += *cl.map_shared_rank(&s.x_u, c);
  cl.sync();
  return r;
}

__device__ double cl_sum_d(cg::cluster_group& cl, double v, CSmem& s) {
  v = block_sum_d(v, s.b);
  if (threadIdx.x == 0) s.x_d = v;
  cl.sync();
  double r = 0.0;
  for (int c = 0; c < kCluster; ++c) r = __dadd_rn(r, *cl.map_shared_rank(&s.x_d, c));  // rank order
  cl.sync();
  return r;
}

// Largest u64 over the cluster (block part: a warp max, then warp 0 over the warps).
__device__ u64 cl_max_u(cg::cluster_group& cl, u64 v, CSmem& s) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(~0u, v, o));
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  __syncthreads();
  if (l == 0) s.b.u_red[w] = v;
  __syncthreads();
  if (w == 0) {
    v = s.b.u_red[l];
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(~0u, v, o));
    if (l == 0) s.x_u = v;
  }
  cl.sync();
  u64 r = 0;
  for (int c = 0; c < kCluster; ++c) r = max(r, *cl.map_shared_rank(&s.x_u, c));
  cl.sync();
  return r;
}

// The largest key K such that pred(sum of q over the row's tokens with key >= K) holds (see
// sample.cu radix_search); key(i) and q(i) of the slice's local index i, q only evaluated for
// tokens that match the digits decided so far. q < 2^53 (a weight is at most 2^52, a count 1).
//
// Per pass: the slice's histogram with warp-aggregated atomics (the lanes of a warp that hit
// the same digit add their sum once: the first digit, sign and top exponent bits, takes a
// handful of values for a whole row, so plain atomics would serialize up to 32-way on one
// word; the sum is two 32-bit warp reductions of the low 26 and high 27 bits, exact for 32
// lanes), one cluster barrier, the 8 slices' histograms summed by 256 threads, the digit
// picked by warp 0. Histograms alternate between two buffers, so a pass never clears one that
// another CTA may still be reading (that CTA has passed the barrier in between).
template <class Key, class Q>
__device__ u64 cl_radix_search(cg::cluster_group& cl, int n, int key_bits, Key key, Q q, Pred pred, CSmem& s) {
  constexpr int kLoBits = 26;
  const int passes = (key_bits + 7) / 8;
  const int lane = threadIdx.x % 32;
  u64 prefix = 0, above = 0;
  for (int p = passes - 1; p >= 0; --p) {
    const int shift = 8 * p;
    u64* hist = (p & 1) ? s.hist_odd : s.b.hist;
    for (int i = threadIdx.x; i < 256; i += kThreads) hist[i] = 0;
    __syncthreads();
    for (int b = threadIdx.x - lane; b < n; b += kThreads) {  // a trip count uniform per warp
      const int i = b + lane;
      int digit = 256;  // none
      u64 w = 0;
      if (i < n) {
        const u64 k = key(i);
        if (!(shift + 8 < 64 && ((k ^ prefix) >> (shift + 8)) != 0)) {
          w = q(i);
          if (w != 0) digit = int((k >> shift) & 255);
        }
      }
      const unsigned peers = __match_any_sync(~0u, digit);
      if (digit < 256) {  // a whole peer group enters together
        const unsigned lo = __reduce_add_sync(peers, unsigned(w) & ((1u << kLoBits) - 1));
        const unsigned hi = __reduce_add_sync(peers, unsigned(w >> kLoBits));
        if ((peers & ((1u << lane) - 1)) == 0) atomicAdd(&hist[digit], (u64(hi) << kLoBits) + lo);  // lowest lane
      }
    }
    cl.sync();  // every slice's histogram complete
    if (threadIdx.x < 256) {
      u64 h = 0;
      for (int c = 0; c < kCluster; ++c) h += cl.map_shared_rank(hist, c)[threadIdx.x];
      s.comb[threadIdx.x] = h;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      const int l = lane;
      u64 loc[8], sum = 0;
      for (int j = 0; j < 8; ++j) sum += loc[j] = s.comb[255 - 8 * l - j];  // descending digits
      u64 incl = sum;
      for (int o = 1; o < 32; o <<= 1) {
        const u64 m = __shfl_up_sync(~0u, incl, o);
        if (l >= o) incl += m;
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
        s.b.b_i[0] = found >= 0 ? 255 - 8 * l - found : 0;
        s.b.b_u[1] = found >= 0 ? before : above;
      }
    }
    __syncthreads();
    prefix |= u64(s.b.b_i[0]) << shift;
    above = s.b.b_u[1];
  }
  cl.sync();  // the last pass's remote reads done before the buffers serve anything else
  return prefix;
}

// Dynamic shared memory of a slice of n tokens: W [n] u64, then x [n] f32.
size_t slice_bytes(int64_t n) { return size_t(n) * 12; }

__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kThreads, 1)
    sample_cluster_kernel(const float* __restrict__ logits, int V, int n, const SampleRow* __restrict__ rows,
                          const SampleEdit* __restrict__ edits, const u64* __restrict__ masks, int n_top_w,
                          int processed, int32_t* __restrict__ out) {
  __shared__ CSmem s;
  extern __shared__ u64 dyn[];
  u64* ws = dyn;                                     // [n] weights W of the slice
  float* xs = reinterpret_cast<float*>(dyn + n);     // [n] processed logits of the slice
  cg::cluster_group cl = cg::this_cluster();
  const int rank = int(cl.block_rank());
  const int srow = blockIdx.x / kCluster;
  const SampleRow r = rows[srow];
  const int g0 = rank * n;                           // first token of the slice
  const int len = max(0, min(V, g0 + n) - g0);       // tokens in the slice
  const float* l = logits + int64_t(r.src_row) * V + g0;
  const int64_t words = (V + 63) / 64;
  const u64* m = r.mask_row >= 0 ? masks + int64_t(r.mask_row) * words : nullptr;
  const int F = sm::weight_bits(V), idb = sm::id_bits(V);
  const float ninf = neg_inf();
  const u64 maxid = (u64(1) << idb) - 1;
  auto key_x = [&](int i) -> u64 { return sm::token_key(xs[i], g0 + i, idb); };

  // Steps 0, 2, 3: sanitize, mask, edits (each CTA applies the edits of its slice). Unrolled so
  // that several global loads are in flight per thread (16 per thread at V4's vocabulary).
#pragma unroll 4
  for (int i = threadIdx.x; i < len; i += kThreads) {
    const int t = g0 + i;
    float v = sanitize(l[i]);
    if (m && !((m[t / 64] >> (t % 64)) & 1)) v = ninf;
    xs[i] = v;
  }
  __syncthreads();
  for (int e = r.edit_begin + int(threadIdx.x); e < r.edit_end; e += kThreads) {
    const SampleEdit ed = edits[e];
    const int i = ed.token - g0;
    if (i < 0 || i >= len) continue;
    float v = xs[i];
    if (ed.flags & SampleEdit::kBias) v = __fadd_rn(v, ed.bias);
    if (ed.flags & SampleEdit::kBanned) v = ninf;
    if ((ed.flags & SampleEdit::kSeen) && r.repetition_penalty != 1.0f)
      v = v > 0 ? __fdiv_rn(v, r.repetition_penalty) : __fmul_rn(v, r.repetition_penalty);
    if (ed.out_count > 0 && (r.frequency_penalty != 0.0f || r.presence_penalty != 0.0f))
      v = __fsub_rn(v, __fadd_rn(__fmul_rn(r.frequency_penalty, float(ed.out_count)), r.presence_penalty));
    xs[i] = sanitize(v);
  }
  __syncthreads();

  int token = -1;
  if (r.temperature < kGreedyTemperatureEps) {
    // The first maximum = the largest key among the tokens that are not -inf (0: none).
    u64 best = 0;
    for (int i = threadIdx.x; i < len; i += kThreads)
      if (xs[i] != ninf) best = max(best, key_x(i));
    best = cl_max_u(cl, best, s);
    token = best == 0 ? -1 : int(maxid - (best & maxid));
  } else {
    float mx = ninf;
    for (int i = threadIdx.x; i < len; i += kThreads) {
      const float v = __fdiv_rn(xs[i], r.temperature);
      xs[i] = v;
      mx = fmaxf(mx, v);
    }
    mx = cl_max(cl, mx, s);  // its barriers also order the writes above before the reads below
    if (mx != ninf) {
      u64 kept = 0;
      const float floor = __fadd_rn(mx, r.log_min_p);
      for (int i = threadIdx.x; i < len; i += kThreads) {
        float v = xs[i];
        if (r.min_p_on && v < floor) xs[i] = v = ninf;
        kept += v != ninf;
      }
      kept = cl_sum_u(cl, kept, s);
      if (r.top_k > 0 && u64(r.top_k) < kept) {
        const u64 kk = cl_radix_search(
            cl, len, 32 + idb, key_x, [&](int i) -> u64 { return xs[i] != ninf; }, Pred{false, u64(r.top_k), 0.0},
            s);
        for (int i = threadIdx.x; i < len; i += kThreads)
          if (xs[i] != ninf && key_x(i) < kk) xs[i] = ninf;
        __syncthreads();
      }
      // W once per token; top-p's search and the draw read it.
      u64 tot = 0;
      for (int i = threadIdx.x; i < len; i += kThreads) {
        const u64 w = sm::weight(xs[i], mx, F);
        ws[i] = w;
        tot += w;
      }
      tot = cl_sum_u(cl, tot, s);
      if (r.top_p < 1.0f) {
        const double thr = __dmul_rn(double(r.top_p), __ull2double_rn(tot));
        const u64 kp = cl_radix_search(
            cl, len, 32 + idb, key_x, [&](int i) -> u64 { return ws[i]; }, Pred{true, 0, thr}, s);
        for (int i = threadIdx.x; i < len; i += kThreads)
          if (xs[i] != ninf && key_x(i) < kp) xs[i] = ninf, ws[i] = 0;
        __syncthreads();
      }
      // The draw in id order: slices in rank order, per-thread contiguous chunks in a slice.
      const int chunk = (len + kThreads - 1) / kThreads;
      const int t0 = min(len, int(threadIdx.x) * chunk), t1 = min(len, t0 + chunk);
      u64 mine = 0;
      {  // starting at a thread-dependent offset: contiguous chunks of u64 in one bank pair otherwise
        const int cnt = t1 - t0;
        int k = t0 + (cnt > 0 ? int(threadIdx.x) % cnt : 0);
        for (int j = 0; j < cnt; ++j) {
          mine += ws[k];
          if (++k == t1) k = t0;
        }
      }
      const u64 incl = block_scan_u(mine, s.b);
      const u64 slice = block_sum_u(mine, s.b);
      if (threadIdx.x == 0) s.x_u = slice;
      cl.sync();
      u64 base = 0, total = 0;
      for (int c = 0; c < kCluster; ++c) {
        const u64 v = *cl.map_shared_rank(&s.x_u, c);
        if (c < rank) base += v;
        total += v;
      }
      const u64 seed = u64(r.seed_hi) << 32 | r.seed_lo, pos = u64(r.pos_hi) << 32 | r.pos_lo;
      const u64 target = sm::draw_target(sm::philox_bits53(seed, pos), total);
      if (threadIdx.x == 0) s.x_i = -1;
      cl.sync();  // the reads of x_u done; x_i reset before any CTA publishes
      if (base <= target && target < base + slice) {
        const u64 tl = target - base;
        if (incl - mine <= tl && tl < incl) {
          u64 cum = incl - mine;
          for (int i = t0; i < t1; ++i) {
            cum += ws[i];
            if (cum > tl) {
              s.x_i = g0 + i;
              break;
            }
          }
        }
      }
      cl.sync();
      int tk = -1;
      for (int c = 0; c < kCluster; ++c) tk = max(tk, *cl.map_shared_rank(&s.x_i, c));
      cl.sync();
      token = tk;
    }
  }

  const bool lp_any = r.want_logprob || r.n_top > 0;
  float token_lp = token < 0 ? ninf : 0.0f;
  int n_sel = 0;  // rank 0: gathered top entries
  if (token >= 0 && lp_any) {
    // Step 5 / 1: log_softmax of the mode's distribution over the whole row.
    auto y = [&](int i) { return processed ? xs[i] : sanitize(l[i]); };
    Lse lse;
    float mloc = ninf;
    for (int i = threadIdx.x; i < len; i += kThreads) mloc = fmaxf(mloc, y(i));
    lse.my = cl_max(cl, mloc, s);
    lse.lse = 0.0;
    lse.inf_lp = ninf;
    if (lse.my == sm::f_inf()) {
      u64 c = 0;
      for (int i = threadIdx.x; i < len; i += kThreads) c += y(i) == sm::f_inf();
      c = cl_sum_u(cl, c, s);
      lse.inf_lp = __double2float_rn(-log(__ull2double_rn(c)));
    } else if (lse.my != ninf) {
      double sum = 0.0;
      for (int i = threadIdx.x; i < len; i += kThreads) {
        const float v = y(i);
        if (v != ninf) sum = __dadd_rn(sum, exp(__dadd_rn(double(v), -double(lse.my))));
      }
      sum = cl_sum_d(cl, sum, s);
      lse.lse = __dadd_rn(double(lse.my), log(sum));
    }
    {  // the token's value from the CTA that owns it
      const int owner = token / n, i = token - owner * n;
      if (rank == 0 && threadIdx.x == 0)
        token_lp = lse(processed ? *cl.map_shared_rank(&xs[i], owner) : sanitize(l[token - g0]));
      cl.sync();  // the remote read done
    }
    const int nt = min(r.n_top, V);
    if (nt > 0) {
      // Keys of the logprob order, into W's storage (the draw is done with it).
      for (int i = threadIdx.x; i < len; i += kThreads) ws[i] = sm::token_key(lse(y(i)), g0 + i, idb);
      __syncthreads();
      const u64 kn = cl_radix_search(
          cl, len, 32 + idb, [&](int i) -> u64 { return ws[i]; }, [](int) -> u64 { return 1; },
          Pred{false, u64(nt), 0.0}, s);
      if (threadIdx.x == 0) s.b.n_top = 0;
      __syncthreads();
      for (int i = threadIdx.x; i < len; i += kThreads) {
        if (ws[i] >= kn) {
          const int j = atomicAdd(&s.b.n_top, 1);
          s.b.top_key[j] = ws[i];
          s.b.top_id[j] = g0 + i;
          s.top_lp[j] = lse(y(i));
        }
      }
      cl.sync();  // every slice's entries listed
      if (rank == 0) {  // gather the other slices' entries after rank 0's own (nt in all)
        if (threadIdx.x == 0) {
          int at = 0;
          for (int c = 0; c < kCluster; ++c) s.gofs[c] = at, at += cl.map_shared_rank(&s, c)->b.n_top;
          s.gofs[kCluster] = at;
        }
        __syncthreads();
        for (int c = 1; c < kCluster; ++c) {
          const CSmem* src = cl.map_shared_rank(&s, c);
          const int at = s.gofs[c], cnt = s.gofs[c + 1] - at;
          for (int j = threadIdx.x; j < cnt; j += kThreads) {
            s.b.top_key[at + j] = src->b.top_key[j];
            s.b.top_id[at + j] = src->b.top_id[j];
            s.top_lp[at + j] = src->top_lp[j];
          }
        }
        __syncthreads();
        n_sel = s.gofs[kCluster];
      }
      cl.sync();  // the remote reads done: the other CTAs may exit
    }
  }
  if (rank != 0) return;

  int32_t* o = out + int64_t(srow) * (2 + 2 * int64_t(n_top_w));
  for (int i = threadIdx.x; i < 2 + 2 * n_top_w; i += kThreads) o[i] = i >= 2 && i < 2 + n_top_w ? -1 : 0;
  __syncthreads();
  if (threadIdx.x == 0) {
    o[0] = token;
    if (token < 0) o[1] = int32_t(sm::float_bits(ninf));
    else if (lp_any) o[1] = int32_t(sm::float_bits(token_lp));
  }
  for (int i = threadIdx.x; i < n_sel; i += kThreads) {  // rank = keys larger than mine (unique keys)
    int rk = 0;
    for (int j = 0; j < n_sel; ++j) rk += s.b.top_key[j] > s.b.top_key[i];
    o[2 + rk] = s.b.top_id[i];
    o[2 + n_top_w + rk] = int32_t(sm::float_bits(s.top_lp[i]));
  }
}

}  // namespace

bool sample_cluster(Ctx& c, const SampleArgs& a) {
  const int64_t V = a.logits.shape[1], S = a.rows.numel() / kSampleRowWords;
  const int64_t n = (V + kCluster - 1) / kCluster;
  const size_t dyn = slice_bytes(n);
  auto& fit = c.sample_cluster_fit[V];  // the device query once per vocabulary (host time per step)
  if (fit == 0) {
    fit = -1;
    int dev_max = 0;
    DIL_CUDA(cudaDeviceGetAttribute(&dev_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, c.device));
    if (dyn + sizeof(CSmem) <= size_t(dev_max)) {
      // The attribute is a bound, per device: the largest any vocabulary may use, so that one set
      // for a small vocabulary never rejects a larger one asked about earlier.
      DIL_CUDA(cudaFuncSetAttribute(sample_cluster_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    dev_max - int(sizeof(CSmem))));
      // A cluster needs kCluster SMs with this much shared memory free at once.
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(unsigned(kCluster));
      cfg.blockDim = dim3(kThreads);
      cfg.dynamicSmemBytes = dyn;
      cfg.stream = c.stream;
      int clusters = 0;
      if (cudaOccupancyMaxActiveClusters(&clusters, sample_cluster_kernel, &cfg) == cudaSuccess && clusters >= 1)
        fit = 1;
      else
        (void)cudaGetLastError();  // the failed query's error, not a kernel's
    }
  }
  if (fit < 0) return false;
  if (S == 0) return true;
  sample_cluster_kernel<<<unsigned(S * kCluster), kThreads, dyn, c.stream>>>(
      a.logits.ptr<float>(), int(V), int(n), static_cast<const SampleRow*>(a.rows.data),
      a.edits.empty() ? nullptr : static_cast<const SampleEdit*>(a.edits.data),
      a.masks.empty() ? nullptr : static_cast<const u64*>(a.masks.data), a.n_top, a.processed_logprobs ? 1 : 0,
      a.out.ptr<int32_t>());
  DIL_LAUNCH_CHECK("sample_cluster_kernel");
  return true;
}

}  // namespace dil::cuda
