// Lightning-indexer scoring and top-k selection (model-spec §3.7, §4.3).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"

namespace dil {
namespace {

// The fast-numerics score of one (token, row): the arithmetic of the CUDA FP8 tensor-core
// scorer (src/kernels/cuda/indexer_fp8.cu, which derives why its e4m3 products and per-block
// MMA sums are exact for FP4-QDQ'd inputs), in its order:
//   B_b(h) = f32 of the exact sum of q[h, c] * k[c] over the 32 dims of block b (dims ascending,
//            in double: exact for FP4-QDQ'd values, and the same rounding as the device's for any)
//   d_h    = ((B_0 + B_1) + B_2) + ...                       (f32)
//   term_h = f32(w_h * max(d_h, 0))                          (0 for heads >= Hi)
//   p_g    = sum over 16-head tiles mt ascending of (term_{16mt+g} + term_{16mt+g+8}), g < 8
//   score  = ((p_0 + p_1) + (p_2 + p_3)) + ((p_4 + p_5) + (p_6 + p_7))
// (the heads as the MMA fragments hold them: lane group g has heads g and g+8 of each tile).
// q [Hi, di], w [Hi], k [di].
float fast_score(const float* q, const float* w, const float* k, int64_t Hi, int64_t di) {
  auto term = [&](int64_t h) -> float {
    if (h >= Hi) return 0.f;
    float d = 0.f;
    for (int64_t b = 0; b * 32 < di; ++b) {
      double s = 0.0;
      for (int64_t c = b * 32; c < std::min(di, (b + 1) * 32); ++c) s += double(q[h * di + c]) * double(k[c]);
      const float B = float(s);
      d = b == 0 ? B : d + B;
    }
    return w[h] * (d > 0.f ? d : 0.f);
  };
  float p[8] = {};
  for (int64_t mt = 0; mt * 16 < Hi; ++mt)
    for (int g = 0; g < 8; ++g) {
      const float pair = term(16 * mt + g) + term(16 * mt + g + 8);
      p[g] = mt == 0 ? pair : p[g] + pair;
    }
  return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

}  // namespace

// Token t (sequence s, position p) sees n_vis = (p+1)/ratio index keys; key r lives at
// keys[block_table[s, r / rpb], r % rpb]. score(r) = sum_h w[t,h] * ReLU(q[t,h] . k_r), all in
// double (heads ascending), rounded once to f32; ranking uses the f32 score. The top
// min(topk, n_vis) rows are selected, exact ties going to the lowest row index; they are
// written in descending score order (ties: ascending index), or in ascending row index when
// sort_ascending (V4.1), then padded with -1 up to topk.
// V4.1 candidates (model-spec §4.3): with cand_out, blocks b of cand_block rows score
// B_b = max of their visible rows' scores, the newest visible block (n_vis-1)/cand_block scores
// +inf, and the top min(cand_topk, #blocks) blocks (ties: lowest block) are written ascending,
// -1 padded. With cand_in, rows outside the listed blocks are not selectable.
// q, w and keys: f32|bf16 (widened exactly); keys may be packed (keys_pack: dequantized on load).
// Fast numerics score with fast_score above (f32 arithmetic in the tensor-core kernel's order)
// instead of the double sum; the selection is the same.
void CpuBackend::indexer_topk(const IndexerArgs& a, const StepMeta& m) {
  cpu::Staged sq(a.q, "indexer q"), sw(a.w, "indexer w");
  cpu::check_i32(a.out_idx, "indexer out_idx");
  const int64_t T = m.n_tokens, di = cpu::last_dim(a.q), Hi = a.q.numel() / (T * di), rpb = a.rows_per_block;
  const int topk = a.topk;
  DIL_CHECK(T * Hi * di == a.q.numel() && a.w.numel() == T * Hi, "indexer: q ", a.q.shape_str(), " w ",
            a.w.shape_str());
  cpu::check_kv(a.keys, a.keys_pack, di, "indexer keys");
  DIL_CHECK(a.keys.size(1) == rpb, "indexer: keys ", a.keys.shape_str(), " rpb ", rpb);
  DIL_CHECK(a.out_idx.numel() == T * topk, "indexer: out_idx ", a.out_idx.shape_str(), " topk ", topk);
  const int cand = !a.cand_out.empty() ? 1 : !a.cand_in.empty() ? 2 : 0;
  DIL_CHECK(a.scores_out.empty() || (a.cand_in.empty() && a.scores_out.dtype == DType::F32 &&
                                     a.scores_out.ndim == 2 && a.scores_out.size(0) == T),
            "indexer: scores_out ", a.scores_out.shape_str(), " (f32 [T, C], not with cand_in)");
  impl_for(indexer_site(int(Hi), int(di), topk, cand, a.cand_block, a.cand_topk, a.q.dtype, numerics()), T);
  const float *pq = sq.f(), *pw = sw.f();
  const bool fast = numerics() == Numerics::Fast;
  std::vector<float> krow(static_cast<size_t>(di));  // [di] one widened key
  std::vector<float> score;     // [n_vis]
  std::vector<int32_t> order;   // [n_vis] selectable rows
  std::vector<float> blocks;    // [n_blocks] candidate block scores
  std::vector<int32_t> border;  // [n_blocks]
  if (!a.cand_out.empty() || !a.cand_in.empty()) {
    DIL_CHECK(a.cand_block > 0 && a.cand_topk > 0, "indexer: candidates need cand_block and cand_topk");
    const Tensor& c = a.cand_out.empty() ? a.cand_in : a.cand_out;
    cpu::check_i32(c, "indexer candidates");
    DIL_CHECK(c.numel() == T * a.cand_topk, "indexer: candidates ", c.shape_str(), " for ", a.cand_topk);
  }
  for (int64_t t = 0; t < T; ++t) {
    const int s = m.h_tok_seq[t], p = m.h_tok_pos[t];
    const int n_vis = (p + 1) / a.ratio;
    score.resize(size_t(n_vis));
    for (int r = 0; r < n_vis; ++r) {
      const int blk = m.h_block_table[size_t(s) * m.max_blocks + r / rpb];
      DIL_CHECK(blk >= 0 && blk < a.keys.size(0), "indexer: row ", r, " of seq ", s, " has no block");
      const float* k = cpu::kv_row(a.keys, a.keys_pack, int64_t(blk) * rpb + r % rpb, di, krow.data());
      if (fast) {
        score[r] = fast_score(pq + t * Hi * di, pw + t * Hi, k, Hi, di);
        continue;
      }
      double acc = 0.0;
      for (int64_t h = 0; h < Hi; ++h) {
        const float* qh = pq + (t * Hi + h) * di;
        double dot = 0.0;
        for (int64_t c = 0; c < di; ++c) dot += double(qh[c]) * k[c];
        acc += double(pw[t * Hi + h]) * std::max(dot, 0.0);
      }
      score[r] = float(acc);
    }
    if (!a.scores_out.empty()) {
      const int64_t C = a.scores_out.size(1);
      float* so = a.scores_out.ptr<float>() + t * C;
      for (int r = 0; r < std::min<int64_t>(n_vis, C); ++r) so[r] = score[r];
    }
    if (!a.cand_out.empty()) {
      const int cb = a.cand_block, nb = (n_vis + cb - 1) / cb, last = nb - 1;
      blocks.assign(size_t(nb), -INFINITY);
      for (int r = 0; r < n_vis; ++r) blocks[r / cb] = std::max(blocks[r / cb], score[r]);
      if (last >= 0) blocks[last] = INFINITY;
      const int n_cb = std::min(a.cand_topk, nb);
      border.resize(size_t(nb));
      std::iota(border.begin(), border.end(), 0);
      std::partial_sort(border.begin(), border.begin() + n_cb, border.end(), [&](int32_t x, int32_t y) {
        return blocks[x] != blocks[y] ? blocks[x] > blocks[y] : x < y;
      });
      std::sort(border.begin(), border.begin() + n_cb);
      int32_t* co = a.cand_out.ptr<int32_t>() + t * a.cand_topk;
      for (int i = 0; i < a.cand_topk; ++i) co[i] = i < n_cb ? border[i] : -1;
    }
    // Selectable rows: all visible ones, or only those of the candidate blocks.
    order.clear();
    if (a.cand_in.empty()) {
      for (int r = 0; r < n_vis; ++r) order.push_back(r);
    } else {
      const int32_t* ci = a.cand_in.ptr<int32_t>() + t * a.cand_topk;
      for (int i = 0; i < a.cand_topk; ++i) {
        if (ci[i] < 0) continue;
        for (int r = ci[i] * a.cand_block; r < std::min(n_vis, (ci[i] + 1) * a.cand_block); ++r) order.push_back(r);
      }
      std::sort(order.begin(), order.end());
    }
    const int n_sel = std::min(topk, int(order.size()));
    std::partial_sort(order.begin(), order.begin() + n_sel, order.end(), [&](int32_t x, int32_t y) {
      return score[x] != score[y] ? score[x] > score[y] : x < y;
    });
    if (a.sort_ascending) std::sort(order.begin(), order.begin() + n_sel);
    int32_t* out = a.out_idx.ptr<int32_t>() + t * topk;
    for (int i = 0; i < topk; ++i) out[i] = i < n_sel ? order[i] : -1;
  }
}

}  // namespace dil
