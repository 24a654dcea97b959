// Exact top-k per row of f32 scores (topk_rows.h): one CTA per row, radix select over the
// 64-bit keys c = order-preserving score bits << 32 | ~row, which are distinct, so the k-th
// largest is found exactly and ties go to the lowest row.
//
// Rows of at least 32 k entries (aligned) first take a sampled path: a histogram of one float4
// per kSample = 16 (256 bytes: an eighth of the sectors) picks a bucket that about 2k entries
// of the row should reach, one pass keeps the entries at or above it (only ~2k of them touch shared
// memory), and the remaining radix levels resolve them exactly. The bucket is monotone in the
// score, so when at least k entries are kept the top k are among them; when fewer than k, or
// more than fit, are kept (a sample unlike its row), the exact path below runs from the start.
//
// The exact path's passes over the row in global memory (the second one mostly hits L2, the row having just
// been read): (1) a histogram of an 11-bit monotone bucket of the score (the top 11 bits of
// its order-preserving fp16 key: 32 buckets per binade, so the mass spreads over many bins
// where the top bits of the f32 key would put it in a few); the bucket P1 holding the k-th
// largest is found by a parallel suffix scan; (2) the entries above P1 go straight to the
// selection, those in P1 to a candidate list in shared memory. The remaining radix levels
// (11 bits of c at a time) run over the candidates in shared memory until the entries equal
// to the prefix are exactly the ones still needed. Only when bucket P1 holds more than kCand
// entries (massive ties, or a distribution narrower than 1/32 of a binade) is the prefix
// refined by further global passes first. The selection (<= 2048 keys) is then bitonic-sorted.
#include <cuda_fp16.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/topk_rows.h"

namespace dil::cuda {
namespace {

constexpr int kBins = 2048;  // 11-bit digits

// Threads per CTA, candidates held in shared memory (8 bytes each).
template <int kThreads, int kCand>
struct Smem {
  static constexpr int kBinsPerThread = kBins / kThreads;
  uint64_t sel[kTopkRowsMaxK];  // selected keys, then the sorted output
  uint64_t cand[kCand];         // entries of the threshold bucket
  unsigned hist[kBins];
  unsigned warp_sum[kThreads / 32];
  int n_sel, n_cand;
  int bin;                       // find_bin results
  unsigned need_left, bin_count, total;
  unsigned long long diff;       // OR of the candidates' differences from the first
};

__device__ __forceinline__ uint32_t key32(float v) {
  if (v == 0.f) v = 0.f;  // -0 ties with +0
  const uint32_t b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
// A monotone (non-decreasing) 11-bit bucket of v: the fp16 rounding is monotone, so v > w
// implies bucket(v) >= bucket(w), and a larger bucket means a larger score.
__device__ __forceinline__ uint32_t bucket(float v) {
  if (v == 0.f) v = 0.f;
  const uint32_t h = __half_as_ushort(__float2half_rn(v));
  const uint32_t k = (h & 0x8000u) ? (~h & 0xffffu) : (h | 0x8000u);
  return k >> 5;
}
__device__ __forceinline__ uint64_t composite(float v, int row) {
  return (uint64_t(key32(v)) << 32) | uint64_t(0xffffffffu - uint32_t(row));
}

// The bin holding the need-th largest entry of s.hist (need clamped to the histogram's total):
// s.bin, s.need_left = need - (entries in higher bins), s.bin_count = hist[bin]; s.total = the
// histogram's total (s.bin = -1 when it is 0). Thread t owns bins kBins-1-4t .. kBins-4-4t (descending), so
// an exclusive scan over threads counts the entries above each thread's bins.
template <int kThreads, class S>
__device__ void find_bin(S& s, unsigned need) {
  constexpr int kBinsPerThread = S::kBinsPerThread;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  unsigned local[kBinsPerThread], sum = 0;
#pragma unroll
  for (int i = 0; i < kBinsPerThread; ++i) {
    local[i] = s.hist[kBins - 1 - (t * kBinsPerThread + i)];
    sum += local[i];
  }
  unsigned incl = sum;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) s.warp_sum[warp] = incl;
  __syncthreads();
  unsigned base = 0, total = 0;
  for (int w = 0; w < kThreads / 32; ++w) {
    const unsigned ws = s.warp_sum[w];
    base += w < warp ? ws : 0u;
    total += ws;
  }
  need = min(need, total);
  const unsigned above = base + incl - sum;
  if (t == 0) {
    s.total = total;
    if (need == 0) s.bin = -1;
  }
  if (need > 0 && above < need && need <= above + sum) {
    unsigned cum = above;
#pragma unroll
    for (int i = 0; i < kBinsPerThread; ++i) {
      if (cum + local[i] >= need) {
        s.bin = kBins - 1 - (t * kBinsPerThread + i);
        s.need_left = need - cum;
        s.bin_count = local[i];
        break;
      }
      cum += local[i];
    }
  }
  __syncthreads();
}

template <int kThreads, int kMinBlocks, int kCand, int kSample>
__global__ void __launch_bounds__(kThreads, kMinBlocks) topk_rows_kernel(TopkRows P) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  using S = Smem<kThreads, kCand>;
  S& s = *reinterpret_cast<S*>(smem_raw);
  const int tid = threadIdx.x;
  const int64_t q = blockIdx.x;
  const int n = P.tok_pos ? (P.tok_pos[q] + 1) / P.ratio : int(P.n_fixed);
  const float* sc = P.scores + q * P.ld;
  const int32_t* cq = P.cand ? P.cand + q * P.cand_topk : nullptr;
  const int cb = P.cand_block;
  auto row_of = [&](int j) -> int { return cq ? cq[j / cb] * cb + j % cb : j; };
  // fn(v, j) over entries 0..n-1: float4 loads (four in flight per thread) when rows are aligned.
  auto for_each = [&](auto&& fn) {
    int j0 = 0;
    if ((P.ld & 3) == 0 && (reinterpret_cast<uintptr_t>(P.scores) & 15) == 0) {
      const int n4 = n >> 2;
      const float4* s4 = reinterpret_cast<const float4*>(sc);
      int i = tid;
      for (; i + 3 * kThreads < n4; i += 4 * kThreads) {
        float4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) v[u] = __ldg(s4 + i + u * kThreads);
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int j = 4 * (i + u * kThreads);
          fn(v[u].x, j);
          fn(v[u].y, j + 1);
          fn(v[u].z, j + 2);
          fn(v[u].w, j + 3);
        }
      }
      for (; i < n4; i += kThreads) {
        const float4 v = __ldg(s4 + i);
        fn(v.x, 4 * i);
        fn(v.y, 4 * i + 1);
        fn(v.z, 4 * i + 2);
        fn(v.w, 4 * i + 3);
      }
      j0 = n4 * 4;
    }
    for (int j = j0 + tid; j < n; j += kThreads) fn(__ldg(sc + j), j);
  };
  auto clear_hist = [&] {
    for (int i = tid; i < kBins; i += kThreads) s.hist[i] = 0;
  };
  auto push = [&](uint64_t* buf, int* count, int cap, uint64_t c) {
    const int slot = atomicAdd(count, 1);
    if (slot < cap) buf[slot] = c;
  };

  // (3) The remaining radix levels over s.cand in shared memory: entries whose key matches
  // `prefix` under `mask` hold the `need` still wanted (ncand of them); the selected ones join
  // s.sel. Block-uniform arguments.
  auto resolve = [&](unsigned need, unsigned ncand, uint64_t prefix, uint64_t mask, int shift) {
    const int nc = min(s.n_cand, kCand);
    // Skip the levels where all candidates agree (the bucket fixes the score's top bits):
    // continue from the highest bit in which two of them differ.
    if (tid == 0) s.diff = 0;
    __syncthreads();
    const uint64_t c0 = s.cand[0];
    uint64_t diff = 0;
    for (int i = tid; i < nc; i += kThreads) diff |= s.cand[i] ^ c0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) diff |= __shfl_xor_sync(0xffffffffu, diff, o);
    if ((tid & 31) == 0 && diff) atomicOr(&s.diff, static_cast<unsigned long long>(diff));
    __syncthreads();
    diff = s.diff;
    if (diff) {
      const int top = 63 - __clzll(static_cast<long long>(diff));
      if (top + 1 < shift) {
        const uint64_t keep = ~((uint64_t(1) << (top + 1)) - 1);  // bits above top: common
        prefix |= c0 & keep & ~mask;
        mask |= keep;
        shift = top + 1;
      }
    }
    while (ncand != need && shift > 0) {
      const int w = min(11, shift);
      shift -= w;
      const uint64_t wm = (uint64_t(1) << w) - 1;
      clear_hist();
      __syncthreads();
      for (int i = tid; i < nc; i += kThreads) {
        const uint64_t c = s.cand[i];
        if ((c & mask) == prefix) atomicAdd(&s.hist[(c >> shift) & wm], 1u);
      }
      __syncthreads();
      find_bin<kThreads>(s, need);
      prefix |= uint64_t(s.bin) << shift;
      mask |= wm << shift;
      need = s.need_left;
      ncand = s.bin_count;
    }
    for (int i = tid; i < nc; i += kThreads) {
      const uint64_t c = s.cand[i];
      if ((c & mask) >= prefix) push(s.sel, &s.n_sel, kTopkRowsMaxK, c);
    }
    __syncthreads();
  };

  // (0) Fast path for long rows: a threshold bucket from a sample (one float4 in kSample, so a
  // 1/kSample fraction of the entries; kSample = 16 reads one 32-byte sector in 8), then one pass
  // that keeps only the entries at or above it, resolved exactly in shared memory. The sample asks
  // for about twice the k/kSample entries it should hold above the k-th largest, so the pass
  // keeps ~2k entries; when it keeps
  // fewer than k or more than fit, the exact path below runs from the start instead.
  bool done = false;
  const bool aligned = (P.ld & 3) == 0 && (reinterpret_cast<uintptr_t>(P.scores) & 15) == 0;
  if (aligned && n >= 32 * P.k) {
    clear_hist();
    if (tid == 0) s.n_sel = s.n_cand = 0;
    __syncthreads();
    const float4* s4 = reinterpret_cast<const float4*>(sc);
    for (int i = tid; 4 * kSample * (i + 1) <= n; i += kThreads) {
      const float4 v = __ldg(s4 + kSample * i);
      for (float x : {v.x, v.y, v.z, v.w})
        if (!isnan(x)) atomicAdd(&s.hist[bucket(x)], 1u);
    }
    __syncthreads();
    const unsigned k8 = unsigned(P.k) / kSample;
    const unsigned need_s = 2 * k8 + 3 * unsigned(sqrtf(float(k8))) + 8;
    find_bin<kThreads>(s, need_s);
    if (s.total >= need_s) {
      const uint32_t B = uint32_t(s.bin);
      for_each([&](float v, int j) {
        if (!isnan(v) && bucket(v) >= B) push(s.cand, &s.n_cand, kCand, composite(v, row_of(j)));
      });
      __syncthreads();
      const unsigned nc = unsigned(s.n_cand);
      if (nc >= unsigned(P.k) && nc <= unsigned(kCand)) {
        resolve(unsigned(P.k), nc, 0, 0, 64);
        done = true;
      }
    }
    __syncthreads();
  }
  // The exact path from the start.
  int kk = P.k;
  if (!done) {
    // (1) Bucket histogram of the selectable entries.
    clear_hist();
    if (tid == 0) s.n_sel = s.n_cand = 0;
    __syncthreads();
    for_each([&](float v, int) {
      if (!isnan(v)) atomicAdd(&s.hist[bucket(v)], 1u);
    });
    __syncthreads();
    find_bin<kThreads>(s, unsigned(P.k));
    kk = int(min(unsigned(P.k), s.total));
    if (kk > 0) {
      const uint32_t P1 = uint32_t(s.bin);
      unsigned need = s.need_left, ncand = s.bin_count;
      uint64_t prefix = 0, mask = 0;  // radix state on c within bucket P1
      int shift = 64;
      // Rare: bucket P1 too large for shared memory: refine the prefix over global memory.
      while (ncand > unsigned(kCand) && ncand != need && shift > 0) {
        const int w = min(11, shift);
        shift -= w;
        const uint64_t wm = (uint64_t(1) << w) - 1;
        clear_hist();
        __syncthreads();
        for_each([&](float v, int j) {
          if (isnan(v) || bucket(v) != P1) return;
          const uint64_t c = composite(v, row_of(j));
          if ((c & mask) == prefix) atomicAdd(&s.hist[(c >> shift) & wm], 1u);
        });
        __syncthreads();
        find_bin<kThreads>(s, need);
        prefix |= uint64_t(s.bin) << shift;
        mask |= wm << shift;
        need = s.need_left;
        ncand = s.bin_count;
      }
      // (2) Entries above the threshold to the selection, the threshold's to the candidates
      // (or to the selection too when all of them are needed).
      const bool all_eq = ncand == need;
      for_each([&](float v, int j) {
        if (isnan(v)) return;
        const uint32_t d = bucket(v);
        if (d < P1) return;
        const uint64_t c = composite(v, row_of(j));
        const uint64_t cm = c & mask;
        if (d > P1 || cm > prefix || (all_eq && cm == prefix))
          push(s.sel, &s.n_sel, kTopkRowsMaxK, c);
        else if (cm == prefix)
          push(s.cand, &s.n_cand, kCand, c);
      });
      __syncthreads();
      if (!all_eq) resolve(need, ncand, prefix, mask, shift);
    }
  }
  // Sort the kk selected keys: descending c (score desc, row asc), or ascending rows.
  const int ns = min(min(s.n_sel, kk), kTopkRowsMaxK);
  int P2 = 1;
  while (P2 < ns) P2 <<= 1;
  for (int i = tid; i < P2; i += kThreads) {
    uint64_t v = P.ascending ? ~uint64_t(0) : 0;
    if (i < ns) v = P.ascending ? uint64_t(0xffffffffu - uint32_t(s.sel[i] & 0xffffffffu)) : s.sel[i];
    s.sel[i] = v;
  }
  __syncthreads();
  if (P2 <= kThreads) {
    // One key per thread: strides below 32 exchange by warp shuffles, the longer ones through
    // shared memory, alternating between two buffers (s.sel, s.cand) so that one barrier per
    // stage suffices (10 of the 45 stages at P2 = 512). Threads >= P2 carry padding; a key's
    // partner t ^ stride stays below P2.
    uint64_t v = tid < P2 ? s.sel[tid] : 0;
    int buf = 0;
    for (int size = 2; size <= P2; size <<= 1) {
      for (int stride = size >> 1; stride > 0; stride >>= 1) {
        uint64_t o;
        if (stride >= 32) {
          uint64_t* b = buf ? s.cand : s.sel;
          buf ^= 1;
          b[tid] = v;
          __syncthreads();
          o = b[tid ^ stride];
        } else {
          o = __shfl_xor_sync(0xffffffffu, v, stride);
        }
        const bool up = ((tid & size) == 0) == P.ascending;  // as the loop below: the lower key takes the min when up
        const bool lower = (tid & stride) == 0;
        v = (lower == up) ? min(v, o) : max(v, o);
      }
    }
    __syncthreads();
    if (tid < P2) s.sel[tid] = v;
    __syncthreads();
  } else {
    for (int size = 2; size <= P2; size <<= 1) {
      for (int stride = size >> 1; stride > 0; stride >>= 1) {
        for (int i = tid; i < P2; i += kThreads) {
          const int j = i ^ stride;
          if (j > i) {
            const bool up = ((i & size) == 0) == P.ascending;
            const uint64_t a = s.sel[i], b = s.sel[j];
            if (up ? (a > b) : (a < b)) {
              s.sel[i] = b;
              s.sel[j] = a;
            }
          }
        }
        __syncthreads();
      }
    }
  }
  int32_t* out = P.out + q * P.k;
  for (int i = tid; i < P.k; i += kThreads) {
    int32_t v = -1;
    if (i < ns) v = P.ascending ? int32_t(s.sel[i]) : int32_t(0xffffffffu - uint32_t(s.sel[i] & 0xffffffffu));
    out[i] = v;
  }
}

__global__ void fill_uniform_kernel(float* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = (uint64_t(seed) << 40) ^ uint64_t(i);  // splitmix64
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    x[i] = float(int64_t(z >> 40) - (int64_t(1) << 23)) * (1.0f / float(1 << 23));
  }
}

template <int kThreads, int kMinBlocks, int kCand, int kSample>
void launch(const TopkRows& p, void* stream) {
  static_assert(sizeof(Smem<kThreads, kCand>) * kMinBlocks <= 227 * 1024, "kMinBlocks CTAs per SM");
  const size_t sm = sizeof(Smem<kThreads, kCand>);
  auto* k = topk_rows_kernel<kThreads, kMinBlocks, kCand, kSample>;
  DIL_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(sm)));
  k<<<unsigned(p.n_queries), kThreads, sm, static_cast<cudaStream_t>(stream)>>>(p);
  DIL_LAUNCH_CHECK("topk_rows_kernel");
}

}  // namespace

// 512 threads, 3 CTAs per SM, 4,096 candidates (32 KB), a sample of one float4 per 256 bytes:
// the fastest of the configurations measured on the H200 (docs/performance.md).
void topk_rows(const TopkRows& p, void* stream) {
  if (p.n_queries == 0) return;
  DIL_CHECK(p.k > 0 && p.k <= kTopkRowsMaxK, "topk_rows: k ", p.k, " not in [1, ", kTopkRowsMaxK, "]");
  DIL_CHECK(!p.cand || (p.cand_block > 0 && p.cand_topk > 0), "topk_rows: candidates need cand_block and cand_topk");
  launch<512, 3, 4096, 16>(p, stream);
}

void fill_uniform_f32(float* x, int64_t n, uint32_t seed, void* stream) {
  if (n == 0) return;
  fill_uniform_kernel<<<unsigned(std::min<int64_t>(ceil_div(n, 256), 65536)), 256, 0,
                        static_cast<cudaStream_t>(stream)>>>(x, n, seed);
  DIL_LAUNCH_CHECK("fill_uniform_kernel");
}

}  // namespace dil::cuda
