// The KV compressor recurrence (model-spec §3.6 and §3.9 item 4; V4.1 §4.3), the paged write
// of emitted rows, and the reset of a slot's compressor state.
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"

namespace dil {

// Per sequence, its step tokens in position order run the decode recurrence, so any chunking
// of a sequence gives bit-identical rows. State of slot: kv, score [rows, c*dc].
//  - non-overlap (c = 1, rows = m): row p%m <- (a_p, g_p + ape[p%m]); when (p+1)%m == 0 emit
//    per channel ch < dc: sum_r softmax_r(score[r, ch]) * kv[r, ch] over the m rows.
//  - overlap (V4 ratio 4: c = 2, rows = 2m): row m + p%m <- (a_p, g_p + ape[p%m]) (full 2dc
//    width); on completion pool the 2m entries {rows 0..m-1, channel ch} and
//    {rows m..2m-1, channel dc+ch} (the previous window's first half and this window's
//    second half; -inf scores from a reset weigh 0), emit, then copy rows m..2m-1 over 0..m-1.
// g + ape is an f32 add; the softmax (max, exp, sum) and the weighted sum run in double and
// the pooled value is rounded once to f32 (then to out's dtype: f32|bf16; a, g and the state
// are f32, as the official compressor pools in fp32). Emitted rows go to out[k] in plan order, which is
// (sequence, window) order; the plan is checked against what is emitted.
void CpuBackend::compressor(const CompressorArgs& a, const EmitPlan& plan, const StepMeta& m) {
  cpu::check_f32(a.a, "compressor a");
  cpu::check_f32(a.g, "compressor g");
  cpu::check_f32(a.state_kv, "compressor state_kv");
  cpu::check_f32(a.state_score, "compressor state_score");
  const int ratio = a.ratio, c = a.overlap ? 2 : 1;
  const int64_t dc = a.dc, width = int64_t(c) * dc, rows = int64_t(c) * ratio;
  DIL_CHECK(ratio > 0 && dc > 0, "compressor: ratio ", ratio, " dc ", dc);
  DIL_CHECK(a.a.numel() == int64_t(m.n_tokens) * width && a.g.numel() == a.a.numel(), "compressor: a ",
            a.a.shape_str(), " g ", a.g.shape_str(), " for width ", width);
  DIL_CHECK(a.state_kv.ndim == 3 && a.state_kv.size(1) == rows && a.state_kv.size(2) == width &&
                a.state_score.numel() == a.state_kv.numel(),
            "compressor: state ", a.state_kv.shape_str(), " for ", rows, " rows of ", width);
  const float* ape = nullptr;
  if (!a.ape.empty()) {
    cpu::check_f32(a.ape, "compressor ape");
    DIL_CHECK(a.ape.numel() == int64_t(ratio) * width, "compressor: ape ", a.ape.shape_str());
    ape = a.ape.ptr<float>();
  }
  Tensor out;  // [plan.n, dc] f32 image of a.out
  std::unique_ptr<cpu::Staged> so;
  if (plan.n > 0) {
    so = std::make_unique<cpu::Staged>(a.out, "compressor out", true);
    out = so->t;
    DIL_CHECK(a.out.numel() >= int64_t(plan.n) * dc, "compressor: out ", a.out.shape_str(), " for ", plan.n,
              " rows");
  }
  const float *pa = a.a.ptr<float>(), *pg = a.g.ptr<float>();
  int k = 0;  // next plan entry
  std::vector<double> sc(static_cast<size_t>(rows));  // [rows] scores of one channel
  for (int s = 0; s < m.n_seqs; ++s) {
    const int start = m.h_start_pos[s], len = m.h_len[s], q0 = m.h_q_start[s], slot = m.h_slot[s];
    DIL_CHECK(slot >= 0 && slot < a.state_kv.size(0), "compressor: slot ", slot);
    float* kv = a.state_kv.ptr<float>() + int64_t(slot) * rows * width;     // [rows, width]
    float* score = a.state_score.ptr<float>() + int64_t(slot) * rows * width;  // [rows, width]
    for (int i = 0; i < len; ++i) {
      const int p = start + i;
      const int64_t t = q0 + i, phase = p % ratio, r = (a.overlap ? ratio : 0) + phase;
      for (int64_t ch = 0; ch < width; ++ch) {
        kv[r * width + ch] = pa[t * width + ch];
        score[r * width + ch] = pg[t * width + ch] + (ape ? ape[phase * width + ch] : 0.0f);
      }
      if ((p + 1) % ratio != 0) continue;
      DIL_CHECK(k < plan.n && plan.h_seq[k] == s && plan.h_row[k] == p / ratio, "compressor: emitted (seq ", s,
                ", row ", p / ratio, ") but plan entry ", k, " of ", plan.n, " differs");
      float* o = out.ptr<float>() + int64_t(k) * dc;
      for (int64_t ch = 0; ch < dc; ++ch) {
        // Entry e < rows: overlap -> (row e, channel ch) for e < m, (row e, channel dc+ch) after.
        auto at = [&](const float* base, int64_t e) {
          const int64_t col = (a.overlap && e >= ratio) ? dc + ch : ch;
          return base[e * width + col];
        };
        double mx = -INFINITY;
        for (int64_t e = 0; e < rows; ++e) {
          sc[e] = at(score, e);
          mx = std::max(mx, sc[e]);
        }
        double den = 0.0, acc = 0.0;
        for (int64_t e = 0; e < rows; ++e) {
          const double w = std::exp(sc[e] - mx);
          den += w;
          if (w != 0.0) acc += w * at(kv, e);  // a -inf score weighs 0 whatever its value
        }
        o[ch] = float(acc / den);
      }
      ++k;
      if (a.overlap) {
        std::memcpy(kv, kv + ratio * width, size_t(ratio * width) * 4);
        std::memcpy(score, score + ratio * width, size_t(ratio * width) * 4);
      }
    }
  }
  DIL_CHECK(k == plan.n, "compressor: emitted ", k, " rows, plan has ", plan.n);
}

// rows [n, d], cache [n_blocks, rpb, d] (f32|bf16, the same dtype):
// cache[block_table[plan.seq[k], plan.row[k] / rpb], plan.row[k] % rpb] = rows[k].
void CpuBackend::paged_write(const Tensor& rows, Tensor cache, int rows_per_block, const EmitPlan& plan,
                             const StepMeta& m, const kvpack::RowShape& pack) {
  if (plan.n == 0) return;
  cpu::check_act(rows, "paged_write rows");
  const int64_t d = cpu::last_dim(rows), rpb = rows_per_block;
  cpu::check_kv(cache, pack, d, "paged_write cache");
  DIL_CHECK(pack.packed() || rows.dtype == cache.dtype, "paged_write: rows ", dtype_name(rows.dtype), " into a ",
            dtype_name(cache.dtype), " cache");
  DIL_CHECK(cache.size(1) == rpb && rows.numel() >= int64_t(plan.n) * d, "paged_write: rows ", rows.shape_str(),
            " cache ", cache.shape_str(), " rpb ", rpb);
  std::vector<float> tmp(static_cast<size_t>(d));  // [d] one widened row
  for (int k = 0; k < plan.n; ++k) {
    const int s = plan.h_seq[k], r = plan.h_row[k];
    const int blk = m.h_block_table[size_t(s) * m.max_blocks + r / rpb];
    DIL_CHECK(blk >= 0 && blk < cache.size(0), "paged_write: row ", r, " of seq ", s, " has no block");
    const int64_t dst = int64_t(blk) * rpb + r % rpb;
    if (pack.packed()) {
      cpu::set_kv_row(cache, pack, dst, d, cpu::act_row(rows, k, d, tmp.data()));
      continue;
    }
    const size_t es = dtype_size(cache.dtype);
    std::memcpy(static_cast<char*>(cache.data) + size_t(dst * d) * es,
                static_cast<const char*>(rows.data) + size_t(int64_t(k) * d) * es, size_t(d) * es);
  }
}

// state_kv, state_score [n_slots, rows, width]: kv <- 0 and score <- -inf for the given slots.
void CpuBackend::reset_state(Tensor state_kv, Tensor state_score, const std::vector<int32_t>& slots) {
  cpu::check_f32(state_kv, "reset_state kv");
  cpu::check_f32(state_score, "reset_state score");
  const int64_t n_slots = state_kv.size(0), per = state_kv.numel() / n_slots;
  DIL_CHECK(state_score.numel() == state_kv.numel(), "reset_state: kv/score sizes differ");
  for (int32_t slot : slots) {
    DIL_CHECK(slot >= 0 && slot < n_slots, "reset_state: slot ", slot);
    float* kv = state_kv.ptr<float>() + slot * per;
    float* sc = state_score.ptr<float>() + slot * per;
    for (int64_t i = 0; i < per; ++i) {
      kv[i] = 0.0f;
      sc[i] = -INFINITY;
    }
  }
}

}  // namespace dil
