// Lightning indexer: score(t, s) = sum_h w[t,h] * relu(q[t,h,:] . key[s,:]) over the
// compressed rows visible to token t, then an exact top-k per token with ties broken towards
// the lowest row. Scores go to a scratch [T, max_visible]; the top-k is a radix select over
// 64-bit keys (order-preserving score bits << 32 | ~row), which are all distinct, so the
// k-th largest key is found exactly in 8 passes of 8 bits, then the selected keys are
// bitonic-sorted in shared memory.
// With quantizing numerics (the plan's mma_exact: FP4-QDQ'd q and keys) scores run on BF16 tensor cores instead
// (indexer_mma.cu), with the same bits; idx_score_kernel below is the path for arbitrary values.
// Fast numerics (the plan's wgmma_fp8 / mma_fp8 / fast_simt) score with the CPU's fast specification
// (indexer_fp8.cu) and select with the few-pass radix of topk_rows.cu, over 32-bit score keys
// and the row; a Reindex layer's scores are written compactly, candidate rows only.
// q, w and keys are f32 or bf16 activations (the FP64 scorer is a template over their storage
// types; bf16 values widen exactly, so the scores are the same function of the values).
#include <algorithm>

#include "kernels/cuda/indexer_fp8.cuh"
#include "kernels/cuda/indexer_mma.cuh"
#include "kernels/cuda/ops.cuh"
#include "kernels/cuda/topk_rows.h"

namespace dil::cuda {
namespace {

constexpr int kScoreRows = 128, kMaxQ = 8192, kMaxTopk = 2048, kTopkThreads = 1024;

template <class TQ, class TW, class TK>
struct IdxParams {
  const TQ* q;                // [T, Hi, di]
  const TW* w;                // [T, Hi]
  const TK* keys;             // [n_blocks, rpb, di]
  const int32_t *tok_seq, *tok_pos, *block_table;
  float* scores;              // [T, n_max]
  int Hi, di, ratio, rpb, max_blocks, n_max;
};

// Block (token t, 128 rows): q of the token in shared memory, one thread per row. The sums
// run in double in the reference's order (heads outer, dims inner; the library is built
// without FMA contraction) and are rounded once, so the f32 scores equal the CPU's bit for
// bit and the selection matches on near-ties too.
template <class TQ, class TW, class TK>
__global__ void idx_score_kernel(IdxParams<TQ, TW, TK> P) {
  pdl_enter();
  __shared__ float qs[kMaxQ];
  __shared__ float ws[128];
  int t = blockIdx.y;
  int p = P.tok_pos[t], s = P.tok_seq[t];
  int n_vis = (p + 1) / P.ratio;
  int r0 = blockIdx.x * kScoreRows;
  if (r0 >= n_vis) return;
  for (int i = threadIdx.x; i < P.Hi * P.di; i += blockDim.x) qs[i] = ld_act(P.q[int64_t(t) * P.Hi * P.di + i]);
  for (int i = threadIdx.x; i < P.Hi; i += blockDim.x) ws[i] = ld_act(P.w[int64_t(t) * P.Hi + i]);
  __syncthreads();
  int r = r0 + threadIdx.x;
  if (r >= n_vis) return;
  int b = P.block_table[s * P.max_blocks + r / P.rpb];
  const TK* key = P.keys + (int64_t(b) * P.rpb + r % P.rpb) * P.di;
  double score = 0.0;
  for (int h = 0; h < P.Hi; ++h) {
    double dot = 0.0;
    const float* qh = qs + h * P.di;
    for (int k = 0; k < P.di; ++k) dot += double(qh[k]) * double(ld_act(key[k]));
    score += double(ws[h]) * fmax(dot, 0.0);
  }
  P.scores[int64_t(t) * P.n_max + r] = float(score);
}

__device__ __forceinline__ uint64_t topk_key(float v, int r) {
  if (v == 0.f) v = 0.f;  // -0 ties with +0
  uint32_t b = __float_as_uint(v);
  uint32_t o = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (uint64_t(o) << 32) | uint64_t(0xffffffffu - uint32_t(r));
}

// Block-max scores of the V4.1 candidate source (model-spec §4.3), one thread per (token,
// block): B_b = max of the block's visible rows' scores (the CPU's std::max order), the
// newest visible block +inf. bscores [T, nb_max].
__global__ void idx_block_score_kernel(const float* scores, int n_max, const int32_t* tok_pos, int ratio, int cb,
                                       int nb_max, float* bscores) {
  pdl_enter();
  int t = blockIdx.y, b = blockIdx.x * blockDim.x + threadIdx.x;
  int n_vis = (tok_pos[t] + 1) / ratio;
  int nb = (n_vis + cb - 1) / cb;
  if (b >= nb) return;
  const float* sc = scores + int64_t(t) * n_max;
  float m = -INFINITY;
  for (int r = b * cb; r < min(n_vis, (b + 1) * cb); ++r) m = (m < sc[r]) ? sc[r] : m;
  bscores[int64_t(t) * nb_max + b] = (b == nb - 1) ? INFINITY : m;
}

// Reindex restriction: selectable[t, r] = 1 for the visible rows of token t's candidate blocks
// (cand_in [T, cand_topk], -1 entries skipped). selectable [T, n_max] u8, zeroed beforehand.
__global__ void idx_restrict_kernel(const int32_t* cand_in, int cand_topk, int cb, const int32_t* tok_pos,
                                    int ratio, int n_max, uint8_t* selectable) {
  pdl_enter();
  int t = blockIdx.x;
  int n_vis = (tok_pos[t] + 1) / ratio;
  for (int i = threadIdx.x; i < cand_topk; i += blockDim.x) {
    int b = cand_in[int64_t(t) * cand_topk + i];
    if (b < 0) continue;
    for (int r = b * cb; r < min(n_vis, (b + 1) * cb); ++r) selectable[int64_t(t) * n_max + r] = 1;
  }
}

// Token t ranks n = ceil(((pos+1)/ratio) / div) entries of its scores row (div 1: rows,
// div cand_block: candidate blocks). With `selectable`, only rows marked there compete;
// the others get key 0, below every real key (whose low word 0xffffffff - r is >= 1).
__global__ void __launch_bounds__(kTopkThreads) idx_topk_kernel(const float* scores, int n_max,
                                                                const uint8_t* selectable, const int32_t* tok_pos,
                                                                int ratio, int div, int topk, bool ascending,
                                                                int32_t* out) {
  pdl_enter();
  __shared__ unsigned hist[256];
  __shared__ uint64_t sel[kMaxTopk];
  __shared__ uint64_t prefix_s, mask_s;
  __shared__ int need_s, count_s, valid_s;
  int t = blockIdx.x;
  int n = ((tok_pos[t] + 1) / ratio + div - 1) / div;
  const float* sc = scores + int64_t(t) * n_max;
  const uint8_t* ok = selectable ? selectable + int64_t(t) * n_max : nullptr;
  auto key_of = [&](int r) -> uint64_t { return (ok && !ok[r]) ? uint64_t(0) : topk_key(sc[r], r); };
  if (threadIdx.x == 0) valid_s = 0;
  __syncthreads();
  if (ok) {
    int cnt = 0;
    for (int r = threadIdx.x; r < n; r += blockDim.x) cnt += ok[r] ? 1 : 0;
    atomicAdd(&valid_s, cnt);
  }
  __syncthreads();
  int kk = min(topk, ok ? valid_s : n);
  if (threadIdx.x == 0) {
    prefix_s = 0;
    mask_s = 0;
    need_s = kk;
    count_s = 0;
  }
  __syncthreads();
  if (kk > 0 && kk < n) {
    for (int shift = 56; shift >= 0; shift -= 8) {
      for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
      __syncthreads();
      uint64_t prefix = prefix_s, mask = mask_s;
      for (int r = threadIdx.x; r < n; r += blockDim.x) {
        uint64_t k = key_of(r);
        if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255], 1u);
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        int need = need_s;
        unsigned cum = 0;
        int d = 255;
        for (; d > 0; --d) {
          if (cum + hist[d] >= unsigned(need)) break;
          cum += hist[d];
        }
        need_s = need - int(cum);
        prefix_s = prefix | (uint64_t(d) << shift);
        mask_s = mask | (uint64_t(255) << shift);
      }
      __syncthreads();
    }
  }
  // Collect keys >= the k-th largest (every selectable row when kk == n). kk <= the number
  // of selectable rows, so the k-th largest key is a real one (>= 1) and key-0 rows drop out.
  uint64_t thr = (kk > 0 && kk < n) ? prefix_s : 1;
  for (int r = threadIdx.x; r < n && kk > 0; r += blockDim.x) {
    uint64_t k = key_of(r);
    if (k >= thr) {
      int slot = atomicAdd(&count_s, 1);
      if (slot < kMaxTopk) sel[slot] = ascending ? uint64_t(r) : k;
    }
  }
  __syncthreads();
  int P2 = 1;
  while (P2 < kk) P2 <<= 1;
  for (int i = kk + threadIdx.x; i < P2; i += blockDim.x) sel[i] = ascending ? ~uint64_t(0) : 0;
  __syncthreads();
  // Bitonic sort: descending keys (score desc, row asc), or ascending rows.
  for (int size = 2; size <= P2; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < P2; i += blockDim.x) {
        int j = i ^ stride;
        if (j > i) {
          bool up = ((i & size) == 0) == ascending;  // direction of this run
          uint64_t a = sel[i], b = sel[j];
          if (up ? (a > b) : (a < b)) {
            sel[i] = b;
            sel[j] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  for (int i = threadIdx.x; i < topk; i += blockDim.x) {
    int32_t v = -1;
    if (i < kk) v = ascending ? int32_t(sel[i]) : int32_t(0xffffffffu - uint32_t(sel[i] & 0xffffffffu));
    out[int64_t(t) * topk + i] = v;
  }
}

// IndexerArgs::scores_out (tests): the first columns of scores [T, ld].
void copy_scores_out(Ctx& c, const IndexerArgs& a, const float* scores, int64_t ld, int64_t n_cols) {
  if (a.scores_out.empty()) return;
  const int64_t C = a.scores_out.size(1), w = std::min(C, n_cols);
  DIL_CHECK(a.cand_in.empty() && a.scores_out.dtype == DType::F32 && a.scores_out.ndim == 2 &&
                a.scores_out.size(0) == a.q.size(0),
            "indexer_topk: scores_out ", a.scores_out.shape_str(), " (f32 [T, C], not with cand_in)");
  if (w > 0)
    DIL_CUDA(cudaMemcpy2DAsync(a.scores_out.data, size_t(C) * 4, scores, size_t(ld) * 4, size_t(w) * 4,
                               size_t(a.q.size(0)), cudaMemcpyDeviceToDevice, c.stream));
}

// Fast numerics: scores [T, ld] by the fast specification (V4 layout, or compact candidate
// entries in Reindex), the V4.1 candidate blocks as before, rows by topk_rows.
void indexer_topk_fast(Ctx& c, const IndexerArgs& a, const StepMeta& m, FastScorer how) {
  const int T = int(a.q.size(0));
  int max_pos = 0;
  for (int32_t p : m.h_tok_pos) max_pos = std::max(max_pos, int(p));
  const int n_max = std::max(1, (max_pos + 1) / a.ratio);
  const bool restricted = !a.cand_in.empty();
  const int64_t cols = restricted ? int64_t(a.cand_topk) * a.cand_block : n_max;
  const int64_t ld = std::max<int64_t>(4, (cols + 3) / 4 * 4);  // float4 rows for topk_rows
  Buffer sb = c.scratch(size_t(T) * ld * 4);
  float* scores = static_cast<float*>(sb.data());  // [T, ld]
  const int32_t* tok_pos = m.tok_pos.ptr<int32_t>();
  indexer_scores_fast(c, a, m, ld, scores, how);
  copy_scores_out(c, a, scores, ld, n_max);
  Buffer bb;
  if (!a.cand_out.empty()) {
    const int cb = a.cand_block, nb_max = ceil_div(n_max, cb);
    bb = c.scratch(size_t(T) * nb_max * 4);
    float* bscores = static_cast<float*>(bb.data());  // [T, nb_max]
    dim3 gb(unsigned(ceil_div(nb_max, 128)), unsigned(T));
    launch_pdl(c, "idx_block_score_kernel", idx_block_score_kernel, dim3(gb), dim3(128), 0, scores, int(ld), tok_pos, a.ratio, cb, nb_max, bscores);
    launch_pdl(c, "idx_topk_kernel (candidates)", idx_topk_kernel, dim3(unsigned(T)), dim3(kTopkThreads), 0, bscores, nb_max, nullptr, tok_pos, a.ratio, cb,
                                                               a.cand_topk, true, a.cand_out.ptr<int32_t>());
  }
  TopkRows p;
  p.scores = scores;
  p.ld = ld;
  p.n_queries = T;
  if (restricted) {
    p.n_fixed = cols;
    p.cand = a.cand_in.ptr<int32_t>();
    p.cand_topk = a.cand_topk;
    p.cand_block = a.cand_block;
  } else {
    p.tok_pos = tok_pos;
    p.ratio = a.ratio;
  }
  p.k = a.topk;
  p.ascending = a.sort_ascending;
  p.out = a.out_idx.ptr<int32_t>();
  topk_rows(p, c.stream);
}

}  // namespace

void indexer_topk(Ctx& c, const IndexerArgs& a, const StepMeta& m, const std::string& impl) {
  int T = int(a.q.size(0));
  if (T == 0) return;
  const int Hi = int(a.q.size(1)), di = int(a.q.size(2));
  DIL_CHECK(Hi * di <= kMaxQ && Hi <= 128, "indexer_topk: q ", a.q.shape_str());
  DIL_CHECK(a.w.numel() == int64_t(T) * Hi, "indexer_topk: w ", a.w.shape_str(), " for q ", a.q.shape_str());
  // Plain keys [n_blocks, rpb, di], or packed rows U8 [n_blocks, rpb, row bytes] (keys_pack).
  const int64_t key_cols = a.keys_pack.packed() ? int64_t(kvpack::row_bytes(a.keys_pack)) : di;
  DIL_CHECK(a.keys.ndim == 3 && a.keys.size(1) == a.rows_per_block && a.keys.size(2) == key_cols,
            "indexer_topk: keys ", a.keys.shape_str(), " rpb ", a.rows_per_block);
  DIL_CHECK(a.topk <= kMaxTopk, "indexer_topk: topk ", a.topk, " > ", kMaxTopk);
  DIL_CHECK(a.out_idx.size(1) == a.topk, "indexer_topk: out ", a.out_idx.shape_str());
  if (!a.cand_out.empty() || !a.cand_in.empty()) {
    DIL_CHECK(a.cand_block > 0 && a.cand_topk > 0 && a.cand_topk <= kMaxTopk,
              "indexer_topk: candidates need cand_block > 0 and 0 < cand_topk <= ", kMaxTopk);
    const Tensor& ct = a.cand_out.empty() ? a.cand_in : a.cand_out;
    DIL_CHECK(ct.dtype == DType::I32 && ct.numel() == int64_t(T) * a.cand_topk, "indexer_topk: candidates ",
              ct.shape_str(), " for ", a.cand_topk);
  }
  if (impl == "wgmma_fp8" || impl == "mma_fp8" || impl == "fast_simt") {
    indexer_topk_fast(c, a, m,
                      impl == "wgmma_fp8" ? FastScorer::Wgmma : impl == "mma_fp8" ? FastScorer::Mma : FastScorer::Simt);
    return;
  }
  DIL_CHECK(!a.keys_pack.packed(), "indexer_topk ", impl, ": packed keys are read by the fast implementations only");
  int max_pos = 0;
  for (int32_t p : m.h_tok_pos) max_pos = std::max(max_pos, int(p));
  const int n_max = std::max(1, (max_pos + 1) / a.ratio);
  Buffer sb = c.scratch(size_t(T) * n_max * 4);
  float* scores = static_cast<float*>(sb.data());  // [T, n_max]
  const int32_t* tok_pos = m.tok_pos.ptr<int32_t>();
  if (impl == "mma_exact") {
    indexer_scores_mma(c, a, m, n_max, scores);  // FP4-QDQ'd inputs: tensor cores, same bits
  } else {
    DIL_CHECK(impl == "fp64", "indexer_topk: implementation '", impl, "' has no launcher");
    with_act(a.q, "indexer q", [&](auto tq) {
      using TQ = decltype(tq);
      with_act(a.w, "indexer w", [&](auto tw) {
        using TW = decltype(tw);
        with_act(a.keys, "indexer keys", [&](auto tk) {
          using TK = decltype(tk);
          IdxParams<TQ, TW, TK> P{};
          P.Hi = Hi;
          P.di = di;
          P.q = a.q.ptr<const TQ>();
          P.w = a.w.ptr<const TW>();
          P.keys = a.keys.ptr<const TK>();
          P.tok_seq = m.tok_seq.ptr<int32_t>();
          P.tok_pos = tok_pos;
          P.block_table = m.block_table.ptr<int32_t>();
          P.scores = scores;
          P.ratio = a.ratio;
          P.rpb = a.rows_per_block;
          P.max_blocks = m.max_blocks;
          P.n_max = n_max;
          dim3 g1(unsigned(ceil_div(n_max, kScoreRows)), unsigned(T));
          launch_pdl(c, "idx_score_kernel", idx_score_kernel<TQ, TW, TK>, dim3(g1), dim3(kScoreRows), 0, P);
        });
      });
    });
  }
  copy_scores_out(c, a, scores, n_max, n_max);
  // V4.1 candidate source: the top cand_topk blocks by block score, ascending, -1 padded.
  Buffer bb;
  if (!a.cand_out.empty()) {
    const int cb = a.cand_block, nb_max = ceil_div(n_max, cb);
    bb = c.scratch(size_t(T) * nb_max * 4);
    float* bscores = static_cast<float*>(bb.data());  // [T, nb_max]
    dim3 gb(unsigned(ceil_div(nb_max, 128)), unsigned(T));
    launch_pdl(c, "idx_block_score_kernel", idx_block_score_kernel, dim3(gb), dim3(128), 0, scores, n_max, tok_pos, a.ratio, cb, nb_max, bscores);
    launch_pdl(c, "idx_topk_kernel (candidates)", idx_topk_kernel, dim3(unsigned(T)), dim3(kTopkThreads), 0, bscores, nb_max, nullptr, tok_pos, a.ratio, cb,
                                                               a.cand_topk, true, a.cand_out.ptr<int32_t>());
  }
  // Reindex: only the rows of the cand_in blocks are selectable.
  Buffer mb;
  uint8_t* selectable = nullptr;  // [T, n_max] u8
  if (!a.cand_in.empty()) {
    mb = c.scratch(size_t(T) * n_max);
    selectable = static_cast<uint8_t*>(mb.data());
    DIL_CUDA(cudaMemsetAsync(selectable, 0, size_t(T) * n_max, c.stream));
    launch_pdl(c, "idx_restrict_kernel", idx_restrict_kernel, dim3(unsigned(T)), dim3(256), 0, a.cand_in.ptr<int32_t>(), a.cand_topk, a.cand_block,
                                                           tok_pos, a.ratio, n_max, selectable);
  }
  launch_pdl(c, "idx_topk_kernel", idx_topk_kernel, dim3(unsigned(T)), dim3(kTopkThreads), 0, scores, n_max, selectable, tok_pos, a.ratio, 1,
                                                             a.topk, a.sort_ascending, a.out_idx.ptr<int32_t>());
}

}  // namespace dil::cuda
