// Lightning-indexer scoring and top-k selection (model-spec §3.7, §4.3).
#include <algorithm>
#include <numeric>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"

namespace dil {

// Token t (sequence s, position p) sees n_vis = (p+1)/ratio index keys; key r lives at
// keys[block_table[s, r / rpb], r % rpb]. score(r) = sum_h w[t,h] * ReLU(q[t,h] . k_r), all in
// double (heads ascending), rounded once to f32; ranking uses the f32 score. The top
// min(topk, n_vis) rows are selected, exact ties going to the lowest row index; they are
// written in descending score order (ties: ascending index), or in ascending row index when
// sort_ascending (V4.1), then padded with -1 up to topk.
void CpuBackend::indexer_topk(const IndexerArgs& a, const StepMeta& m) {
  cpu::check_f32(a.q, "indexer q");
  cpu::check_f32(a.w, "indexer w");
  cpu::check_f32(a.keys, "indexer keys");
  cpu::check_i32(a.out_idx, "indexer out_idx");
  const int64_t T = m.n_tokens, di = cpu::last_dim(a.q), Hi = a.q.numel() / (T * di), rpb = a.rows_per_block;
  const int topk = a.topk;
  DIL_CHECK(T * Hi * di == a.q.numel() && a.w.numel() == T * Hi, "indexer: q ", a.q.shape_str(), " w ",
            a.w.shape_str());
  DIL_CHECK(a.keys.ndim == 3 && a.keys.size(1) == rpb && a.keys.size(2) == di, "indexer: keys ",
            a.keys.shape_str(), " rpb ", rpb);
  DIL_CHECK(a.out_idx.numel() == T * topk, "indexer: out_idx ", a.out_idx.shape_str(), " topk ", topk);
  const float *pq = a.q.ptr<float>(), *pw = a.w.ptr<float>(), *pk = a.keys.ptr<float>();
  std::vector<float> score;     // [n_vis]
  std::vector<int32_t> order;   // [n_vis]
  for (int64_t t = 0; t < T; ++t) {
    const int s = m.h_tok_seq[t], p = m.h_tok_pos[t];
    const int n_vis = (p + 1) / a.ratio;
    score.resize(size_t(n_vis));
    for (int r = 0; r < n_vis; ++r) {
      const int blk = m.h_block_table[size_t(s) * m.max_blocks + r / rpb];
      DIL_CHECK(blk >= 0 && blk < a.keys.size(0), "indexer: row ", r, " of seq ", s, " has no block");
      const float* k = pk + (int64_t(blk) * rpb + r % rpb) * di;
      double acc = 0.0;
      for (int64_t h = 0; h < Hi; ++h) {
        const float* qh = pq + (t * Hi + h) * di;
        double dot = 0.0;
        for (int64_t c = 0; c < di; ++c) dot += double(qh[c]) * k[c];
        acc += double(pw[t * Hi + h]) * std::max(dot, 0.0);
      }
      score[r] = float(acc);
    }
    const int n_sel = std::min(topk, n_vis);
    order.resize(size_t(n_vis));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + n_sel, order.end(), [&](int32_t x, int32_t y) {
      return score[x] != score[y] ? score[x] > score[y] : x < y;
    });
    if (a.sort_ascending) std::sort(order.begin(), order.begin() + n_sel);
    int32_t* out = a.out_idx.ptr<int32_t>() + t * topk;
    for (int i = 0; i < topk; ++i) out[i] = i < n_sel ? order[i] : -1;
  }
}

}  // namespace dil
