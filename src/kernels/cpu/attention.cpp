// Sparse attention over [window rows ; compressed rows] with an attention sink, and the SWA
// ring write (model-spec §3.1 sparse_attn, §3.5, §3.7, §3.9).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"

namespace dil {

// Token t of sequence s = tok_seq[t] at position p = tok_pos[t] attends to:
//  - window positions j in [max(0, p-W+1), p], ascending: row kv_new[q_start[s] + j - start_pos[s]]
//    if j >= start_pos[s] (this step), else ring[slot[s], j % W] (earlier steps);
//  - if comp_ratio m > 0, compressed rows r < (p+1)/m: all of them ascending when comp_idx is
//    empty, else comp_idx[t, :] in its order, skipping -1 and r >= (p+1)/m; row r lives at
//    comp[block_table[s, r / rows_per_block], r % rows_per_block].
// non_causal (window only): every token of the chunk attends to ring positions
//  [max(0, start_pos[s] - W), start_pos[s] - 1], ascending, then to the chunk's len rows of
//  kv_new, ascending (the DSpark draft block, model-spec §4.7).
// Per head h, in double: s_j = (q[t,h] . k_j) * scale; mx = max_j s_j;
//   out[t,h] = sum_j e^(s_j-mx) k_j / (sum_j e^(s_j-mx) + e^(sink_h - mx)), rounded once to f32.
// Values are the keys (one shared d-wide row). q, kv_new, ring, comp and out: f32|bf16 (bf16
// rows are widened exactly; out rounded to its dtype). ring / comp may hold packed rows
// (ring_pack / comp_pack): dequantized on load, the values the writer's QDQ gives.
void CpuBackend::sparse_attention(const AttnArgs& a, const StepMeta& m) {
  cpu::check_act(a.q, "attention q");
  cpu::check_act(a.kv_new, "attention kv_new");
  cpu::check_f32(a.sink, "attention sink");
  cpu::check_act(a.out, "attention out");
  const int64_t T = m.n_tokens, d = cpu::last_dim(a.q), H = a.q.numel() / (T * d), W = a.window;
  DIL_CHECK(T * H * d == a.q.numel() && a.out.numel() == a.q.numel() && a.kv_new.numel() == T * d,
            "attention: q ", a.q.shape_str(), " kv_new ", a.kv_new.shape_str(), " out ", a.out.shape_str());
  DIL_CHECK(a.sink.numel() == H, "attention: sink ", a.sink.shape_str(), " for ", H, " heads");
  const bool has_ring = !a.ring.empty();
  if (has_ring) {
    cpu::check_kv(a.ring, a.ring_pack, d, "attention ring");
    DIL_CHECK(a.ring.size(1) == W, "attention: ring ", a.ring.shape_str(), " for window ", W);
  }
  const int ratio = a.comp_ratio;
  const int64_t rpb = a.rows_per_block;
  if (ratio > 0) {
    cpu::check_kv(a.comp, a.comp_pack, d, "attention comp");
    DIL_CHECK(rpb > 0 && a.comp.size(1) == rpb, "attention: comp ", a.comp.shape_str(), " rows_per_block ", rpb);
  }
  const int64_t K = a.comp_idx.empty() ? 0 : a.comp_idx.size(1);
  if (K) {
    cpu::check_i32(a.comp_idx, "attention comp_idx");
    DIL_CHECK(a.comp_idx.size(0) == T, "attention: comp_idx ", a.comp_idx.shape_str());
  }
  DIL_CHECK(!a.non_causal || ratio == 0, "attention: non-causal attention has no compressed rows (ratio ", ratio, ")");
  impl_for(attention_site(int(H), int(d), ratio, int(K), a.q.dtype, numerics(), a.non_causal), T);  // planned?
  const float* psink = a.sink.ptr<float>();
  std::vector<const float*> keys;  // [n_keys] pointers to d-wide f32 rows
  std::vector<float> wide;         // [W + n_comp, d] widened bf16 rows of one token
  std::vector<double> sc;          // [n_keys]
  std::vector<double> acc(static_cast<size_t>(d));  // [d]
  std::vector<float> qrow(static_cast<size_t>(d)), orow(static_cast<size_t>(d));  // [d]
  std::vector<std::pair<const Tensor*, int64_t>> rows;  // [n_keys] (tensor, row index) of one token
  // Rows that are not f32 in place (bf16, packed) are widened / dequantized into `wide`.
  const bool bf16 = a.q.dtype == DType::BF16 || a.kv_new.dtype == DType::BF16 ||
                    (has_ring && a.ring.dtype != DType::F32) || (ratio > 0 && a.comp.dtype != DType::F32);
  for (int64_t t = 0; t < T; ++t) {
    const int s = m.h_tok_seq[t], p = m.h_tok_pos[t];
    const int start = m.h_start_pos[s], q0 = m.h_q_start[s], slot = m.h_slot[s];
    keys.clear();
    rows.clear();  // the token's rows first; widened below, once their count is known
    // Window positions [lo, hi]: causal the W up to the token's own; non-causal the W before the
    // chunk and the whole chunk.
    const int lo = a.non_causal ? std::max<int>(0, start - int(W)) : std::max<int>(0, p - int(W) + 1);
    const int hi = a.non_causal ? start + m.h_len[s] - 1 : p;
    for (int j = lo; j <= hi; ++j) {
      if (j >= start) {
        rows.push_back({&a.kv_new, int64_t(q0 + j - start)});
      } else {
        DIL_CHECK(has_ring, "attention: position ", j, " needs the ring");
        rows.push_back({&a.ring, int64_t(slot) * W + j % W});
      }
    }
    if (ratio > 0) {
      const int n_vis = (p + 1) / ratio;
      auto add_row = [&](int r) {
        const int blk = m.h_block_table[size_t(s) * m.max_blocks + r / rpb];
        DIL_CHECK(blk >= 0 && blk < a.comp.size(0), "attention: compressed row ", r, " of seq ", s,
                  " has no block");
        rows.push_back({&a.comp, int64_t(blk) * rpb + r % rpb});
      };
      if (K == 0) {
        for (int r = 0; r < n_vis; ++r) add_row(r);
      } else {
        const int32_t* idx = a.comp_idx.ptr<int32_t>() + t * K;
        for (int64_t k = 0; k < K; ++k)
          if (idx[k] >= 0 && idx[k] < n_vis) add_row(idx[k]);
      }
    }
    const size_t nk = rows.size();
    if (bf16) wide.resize(nk * size_t(d));
    for (size_t j = 0; j < nk; ++j) {
      const Tensor* src = rows[j].first;
      const kvpack::RowShape none, &pack = src == &a.ring ? a.ring_pack : src == &a.comp ? a.comp_pack : none;
      keys.push_back(cpu::kv_row(*src, pack, rows[j].second, d, bf16 ? wide.data() + j * size_t(d) : nullptr));
    }
    sc.resize(nk);
    for (int64_t h = 0; h < H; ++h) {
      const float* qh = cpu::act_row(a.q, t * H + h, d, qrow.data());
      double mx = -INFINITY;
      for (size_t j = 0; j < nk; ++j) {
        double dot = 0.0;
        for (int64_t c = 0; c < d; ++c) dot += double(qh[c]) * keys[j][c];
        sc[j] = dot * double(a.scale);
        mx = std::max(mx, sc[j]);
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      double den = 0.0;
      for (size_t j = 0; j < nk; ++j) {
        const double e = std::exp(sc[j] - mx);
        den += e;
        for (int64_t c = 0; c < d; ++c) acc[c] += e * keys[j][c];
      }
      den += std::exp(double(psink[h]) - mx);
      for (int64_t c = 0; c < d; ++c) orow[c] = float(acc[c] / den);
      Tensor out = a.out;
      cpu::set_act_row(out, t * H + h, d, orow.data());
    }
  }
}

// kv_new [T, d], ring [n_slots, W, d] (f32|bf16, the same dtype; or U8 packed rows [n_slots, W, B]
// when pack.packed(), each row quantized once here): for each sequence, its step tokens at
// positions p >= start_pos + len - W (the last W of the sequence) are stored at ring[slot, p % W].
// Called after attention, so attention of this step reads the previous contents.
void CpuBackend::ring_write(const Tensor& kv_new, Tensor ring, const StepMeta& m, const kvpack::RowShape& pack) {
  cpu::check_act(kv_new, "ring_write kv_new");
  const int64_t d = cpu::last_dim(kv_new), W = ring.size(1);
  cpu::check_kv(ring, pack, d, "ring_write ring");
  DIL_CHECK(pack.packed() || kv_new.dtype == ring.dtype, "ring_write: ", dtype_name(kv_new.dtype), " rows into a ",
            dtype_name(ring.dtype), " ring");
  std::vector<float> tmp(static_cast<size_t>(d));  // [d] one widened row
  for (int s = 0; s < m.n_seqs; ++s) {
    const int start = m.h_start_pos[s], len = m.h_len[s], q0 = m.h_q_start[s], slot = m.h_slot[s];
    DIL_CHECK(slot >= 0 && slot < ring.size(0), "ring_write: slot ", slot);
    for (int i = std::max(0, len - int(W)); i < len; ++i) {
      const int p = start + i;
      const int64_t dst = int64_t(slot) * W + p % W;
      if (pack.packed()) {
        cpu::set_kv_row(ring, pack, dst, d, cpu::act_row(kv_new, q0 + i, d, tmp.data()));
        continue;
      }
      const size_t es = dtype_size(ring.dtype);
      std::memcpy(static_cast<char*>(ring.data) + size_t(dst * d) * es,
                  static_cast<const char*>(kv_new.data) + size_t(int64_t(q0 + i) * d) * es, size_t(d) * es);
    }
  }
}

}  // namespace dil
