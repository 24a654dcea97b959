#include "model/cost.h"

#include <algorithm>

#include "model/replay.h"

namespace dil {

namespace {

// Sum over the new tokens' positions p of f(p) (positions cached .. cached+new-1).
template <typename F>
double sum_pos(int64_t cached, int64_t n, F f) {
  double s = 0;
  for (int64_t p = cached; p < cached + n; ++p) s += f(p);
  return s;
}

double fp8_bytes(double out, double in) { return out * in; }       // + scales, negligible
double fp4_bytes(double out, double in) { return out * in / 2; }

}  // namespace

std::map<std::string, ModuleCost> step_cost(const ModelConfig& c, const std::vector<int>& layers_in, int64_t n_seqs,
                                            int64_t cached, int64_t new_tokens, bool replay) {
  std::vector<int> layers = layers_in;
  if (layers.empty())
    for (int L = 0; L < c.n_layers; ++L) layers.push_back(L);
  std::map<std::string, ModuleCost> m;
  const double N = double(n_seqs * new_tokens), D = double(c.dim), H = c.n_heads, hd = c.head_dim;
  const double ql = double(c.q_lora_rank), ol = double(c.o_lora_rank), G = c.o_groups, I = double(c.moe_inter);
  const double E = c.n_routed, k = c.topk, Hi = c.index_heads, di = c.index_head_dim, n = c.hc_mult;
  const double W = c.window;
  const bool v41 = c.arch == Arch::V41;
  const ReplaySchedule rs = replay_schedule(c);
  for (int L : layers) {
    const int ratio = c.ratio(L);
    // Rows of each sequence the layer computes (model/replay.h): x enter, kv write a window
    // row, out run attention + MoE; every one of the new tokens without replay.
    const int nt = int(new_tokens);
    const ReplayRows r = replay && v41 ? replay_rows(rs, L, nt) : ReplayRows{nt, nt, nt};
    const double Nx = double(n_seqs) * r.x, Nkv = double(n_seqs) * r.kv, No = double(n_seqs) * r.out;
    const int64_t out_first = cached + new_tokens - r.out;  // position of the first out row
    // projections: wq_a, wq_b, wo_a (grouped), wo_b on the out rows, wkv on the kv rows
    auto& pr = m["projections"];
    pr.fp8_gemm = true;
    pr.flops += 2 * No * (D * ql + ql * H * hd + H * hd * ol + G * ol * D) + 2 * Nkv * D * hd;
    pr.bytes += fp8_bytes(ql, D) + fp8_bytes(H * hd, ql) + fp8_bytes(hd, D) + 2 * (G * ol) * (H * hd / G) +
                fp8_bytes(D, G * ol) + 4 * No * (2 * D + ql + 2 * H * hd + G * ol) + 4 * Nkv * hd +
                4 * (Nkv - No) * D;
    // attention core: QK + PV over window + compressed rows read
    auto& at = m["attention core"];
    double keys = sum_pos(out_first, r.out, [&](int64_t p) {
      double win = std::min<double>(W, double(p + 1));
      if (ratio == 0) return win;
      double vis = double((p + 1) / ratio);
      bool all_rows = !v41 && ratio == 128;  // V4 HCA attends every compressed row
      return win + (all_rows ? vis : std::min<double>(c.index_topk, vis));
    });
    at.flops += double(n_seqs) * 4 * hd * H * keys;
    // the floor reads every row a step touches once (FP8-sized), not once per query
    double ctx = double(cached + new_tokens);
    at.bytes += double(n_seqs) * ((ratio > 0 ? ctx / ratio : 0) + std::min(W, ctx) + double(r.kv)) * hd +
                4 * No * 2 * H * hd;
    if (ratio > 0) {
      const bool kv_source = !v41 || c.role(L) == LayerRole::Full;
      const bool index_source = v41 ? (c.role(L) == LayerRole::Full || c.role(L) == LayerRole::Reindex) : ratio == 4;
      if (kv_source) {
        auto& cp = m["compressors"];
        double coff = (!v41 && ratio == 4) ? 2 : 1;
        double gates = (v41 && ratio == 1) ? 1 : 2;  // V4.1 ratio 1 has no gate
        cp.flops += 2 * N * D * coff * hd * gates;
        cp.bytes += 2 * gates * coff * hd * D + 4 * N * (D + gates * coff * hd);
        if (!v41 && ratio == 4) {
          cp.flops += 2 * N * D * 2 * di * 2;
          cp.bytes += 2 * 2 * 2 * di * D;
        }
        if (v41) cp.flops += 2 * (N / ratio) * hd * di;  // indexer key wk
      }
      if (index_source) {
        auto& ix = m["indexer"];
        ix.flops += 2 * No * (ql * Hi * di + D * Hi);
        double rows = sum_pos(out_first, r.out, [&](int64_t p) {
          double vis = double((p + 1) / ratio);
          if (v41 && c.role(L) == LayerRole::Reindex)
            return std::min<double>(vis, double(c.candidate_topk_blocks) * c.candidate_block_size);
          return vis;
        });
        ix.flops += double(n_seqs) * rows * 2 * Hi * di;
        // key rows read once per sequence (FP4 in the official format: di/2 + scales)
        double ctx_rows = double((cached + new_tokens) / ratio);
        ix.bytes += fp8_bytes(Hi * di, ql) + 2 * Hi * D + double(n_seqs) * ctx_rows * (di / 2 + di / 32);
      }
    }
    auto& hc = m["mhc+norms"];
    double mix = (2 + n) * n;
    // two mixes on the out rows; the attention's collapse on the rows entering, the ffn's
    // collapse and both posts on the out rows
    hc.flops += 2 * 2 * No * n * D * mix + 2 * (Nx + No) * n * D * (n + 1);
    hc.bytes += 2 * 4 * (mix * n * D) + 4 * (Nx + No) * n * D * 3;
    auto& gt = m["moe gate"];
    gt.flops += 2 * No * D * E;
    gt.bytes += 2 * E * D + 4 * No * D;
    auto& ex = m["moe experts"];
    ex.fp8_gemm = true;
    ex.flops += 2 * No * k * 3 * D * I;
    // every expert a step of many tokens touches is read once
    double touched = std::min(E, No * k);
    ex.bytes += touched * 3 * fp4_bytes(I, D) + 4 * No * (D + k * 2 * I);
    auto& sh = m["moe shared"];
    sh.fp8_gemm = true;
    sh.flops += 2 * No * 3 * D * I;
    sh.bytes += 3 * fp8_bytes(I, D) + 4 * No * (D + 2 * I);
    if (v41 && c.is_engram_layer(L)) {
      auto& en = m["engram"];
      double rows = c.engram_max_ngram > 1 ? double(c.engram_max_ngram - 1) * c.engram_heads : 0;
      double ed = rows * c.engram_head_dim;
      en.fp8_gemm = true;
      en.flops += 2 * Nx * ed * (double(c.hc_mult) + 1) * D;
      en.bytes += fp8_bytes((double(c.hc_mult) + 1) * D, ed) + Nx * ed;
    }
  }
  auto& hd_ = m["embed+head"];
  hd_.flops += 2 * double(n_seqs) * D * double(c.vocab_size);
  hd_.bytes += 2 * double(c.vocab_size) * D + 2 * N * D;
  return m;
}

}  // namespace dil
