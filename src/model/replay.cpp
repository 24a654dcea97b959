#include "model/replay.h"

#include <algorithm>

#include "model/step.h"

namespace dil {

ReplaySchedule replay_schedule(const ModelConfig& cfg) {
  ReplaySchedule s;
  s.n_layers = cfg.n_layers;
  s.window = cfg.window;
  // The last layer that writes compressed rows / indexer keys (V4: every layer with ratio > 0
  // compresses its own; V4.1: the kv sources).
  int last_source = -1;
  for (int L = 0; L < cfg.n_layers; ++L) {
    const bool source = cfg.arch == Arch::V4
                            ? cfg.ratio(L) > 0
                            : std::find(cfg.kv_source_layers.begin(), cfg.kv_source_layers.end(), L) !=
                                  cfg.kv_source_layers.end();
    if (source) last_source = L;
  }
  s.first = cfg.n_layers > 0 ? std::max(last_source, 0) : -1;
  return s;
}

ReplayRows replay_rows(const ReplaySchedule& s, int L, int n) {
  DIL_CHECK(L >= 0 && L < s.n_layers && n >= 0, "replay_rows: layer ", L, " of ", s.n_layers, ", ", n, " tokens");
  if (s.first < 0 || L < s.first) return {n, n, n};
  const int64_t w1 = s.window - 1, k = s.n_layers - 1 - L;  // k: layers after L
  auto cap = [n](int64_t v) { return int(std::min<int64_t>(n, v)); };
  ReplayRows r;
  r.out = cap(1 + w1 * k);
  r.kv = cap(1 + w1 * (k + 1));
  r.x = L == s.first ? n : r.kv;  // = out(L-1): the previous layer computed exactly these
  return r;
}

std::vector<LayerSpans> plan_replay(const ReplaySchedule& s, const StepBatch& batch, bool enabled) {
  std::vector<LayerSpans> out(size_t(s.n_layers));
  for (int L = 0; L < s.n_layers; ++L) {
    LayerSpans& ls = out[size_t(L)];
    for (const SeqChunk& c : batch.seqs) {
      const int n = c.n_tokens;
      const ReplayRows r = enabled && !c.all_logits ? replay_rows(s, L, n) : ReplayRows{n, n, n};
      ls.x.push_back({n - r.x, n});
      ls.head.push_back({n - r.kv, n - r.out});
      ls.out.push_back({n - r.out, n});
    }
  }
  return out;
}

StepMeta sub_meta(const StepMeta& m, const RowSpans& spans, Backend& be, std::vector<Buffer>* storage) {
  DIL_CHECK(int(spans.size()) == m.n_seqs, "sub_meta: ", spans.size(), " spans for ", m.n_seqs, " chunks");
  StepMeta r;
  r.block_tokens = m.block_tokens;
  r.max_blocks = m.max_blocks;
  int q = 0;
  for (int c = 0; c < m.n_seqs; ++c) {
    const RowSpan sp = spans[size_t(c)];
    DIL_CHECK(sp.begin >= 0 && sp.begin <= sp.end && sp.end <= m.h_len[size_t(c)], "sub_meta: span [", sp.begin, ", ",
              sp.end, ") of a ", m.h_len[size_t(c)], "-token chunk");
    if (sp.size() == 0) continue;
    const int i = r.n_seqs++;
    const int p0 = m.h_start_pos[size_t(c)] + sp.begin;
    r.h_q_start.push_back(q);
    r.h_len.push_back(sp.size());
    r.h_start_pos.push_back(p0);
    r.h_slot.push_back(m.h_slot[size_t(c)]);
    for (int t = 0; t < sp.size(); ++t) {
      r.h_tok_pos.push_back(p0 + t);
      r.h_tok_seq.push_back(i);
    }
    const auto row = m.h_block_table.begin() + ptrdiff_t(c) * m.max_blocks;
    r.h_block_table.insert(r.h_block_table.end(), row, row + m.max_blocks);
    q += sp.size();
  }
  r.n_tokens = q;
  upload_meta(r, be, storage);
  return r;
}

void gather_rows(Backend& be, const Tensor& src, const RowSpans& from, Tensor dst, const RowSpans& to) {
  DIL_CHECK(from.size() == to.size(), "gather_rows: ", from.size(), " and ", to.size(), " chunks");
  DIL_CHECK(src.data != dst.data, "gather_rows: in place");
  int64_t qa = 0, qb = 0;        // each layout's first row of the chunk
  int64_t run_src = 0, run_dst = 0, run_n = 0;  // the pending contiguous copy
  auto flush = [&] {
    if (run_n > 0) be.copy(dst.rows(run_dst, run_dst + run_n), src.rows(run_src, run_src + run_n));
    run_n = 0;
  };
  for (size_t c = 0; c < from.size(); ++c) {
    const RowSpan a = from[c], b = to[c];
    DIL_CHECK(b.size() == 0 || (a.begin <= b.begin && b.end <= a.end), "gather_rows: span [", b.begin, ", ", b.end,
              ") outside [", a.begin, ", ", a.end, ")");
    if (b.size() > 0) {
      const int64_t s = qa + (b.begin - a.begin);
      if (run_n > 0 && run_src + run_n == s) {
        run_n += b.size();  // dst runs are always contiguous
      } else {
        flush();
        run_src = s;
        run_dst = qb;
        run_n = b.size();
      }
    }
    qa += a.size();
    qb += b.size();
  }
  flush();
  DIL_CHECK(qa == src.size(0) && qb == dst.size(0), "gather_rows: ", qa, " -> ", qb, " rows for tensors of ",
            src.size(0), " -> ", dst.size(0));
}

int64_t total_rows(const RowSpans& spans) {
  int64_t n = 0;
  for (const RowSpan& s : spans) n += s.size();
  return n;
}

}  // namespace dil
