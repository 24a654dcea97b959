// Parity of attention and its state: sparse attention with a sink over window + compressed
// rows (CSA with indexer picks, HCA with all rows, SWA only, V4.1 ratio 2), the SWA ring
// write, the paged write and the compressor recurrence, at 64 heads x 512 with awkward
// chunks (1 token, 17 tokens, window and compression boundaries, 1M positions).
#include <algorithm>

#include "parity.h"

namespace dil::test {
namespace {

constexpr int64_t kH = 64, kD = 512, kW = 128;

struct AttnCase {
  const char* what;
  std::vector<SeqSpec> seqs;  // blocks filled in by the test
  int ratio;              // 0: SWA only
  bool with_idx;          // indexer picks (K = 512) instead of all visible rows
  int64_t n_blocks;       // physical compressed blocks
  bool non_causal = false;  // AttnArgs::non_causal (the DSpark draft block; ratio 0)
};

class CudaAttention : public CudaParity {
 protected:
  // split_bf16: the tensor-core path (official numerics). Its bound, fixed from the arithmetic
  // before any run: every product is formed from hi/lo BF16 halves with a relative error
  // <= 2^-16 (the dropped lo*lo term and the halves' own 2^-17), the f32 accumulation of 512
  // products adds <= 512 * 2^-24 of sum|q_i k_i|; with these inputs (U[-1,1], d 512, scale
  // 512^-0.5) sum|q_i k_i| * scale <= 512 * 0.25 * 0.044 = 5.7 in the worst case, so a score is
  // off by <= 5.7 * (2^-16 + 2^-15) = 2.6e-4 at worst (random signs: ~1e-5). A score error e
  // moves each softmax weight by a relative e, the output (a convex mix of rows in [-1, 1],
  // plus the sink) by <= 2e, and P.V adds another 2^-16 relative: abs 6e-4 per element, and a
  // relative L2 of 1e-4 (typical errors are ~20x smaller).
  void run(AttnCase c, uint32_t seed, bool split_bf16 = false) {
    const int rpb = c.ratio ? int(128 / c.ratio) : 0;
    int base = 0;
    for (auto& s : c.seqs) {
      if (!c.ratio) continue;
      int rows = (s.start_pos + s.len) / c.ratio;
      int nb = std::max(1, (rows + rpb - 1) / rpb);
      s.blocks = block_list(nb, base, seed + base);
      base += nb;
    }
    ASSERT_LE(base, c.n_blocks);
    StepMeta m = make_meta(c.seqs);
    const int64_t T = m.n_tokens, n_slots = 4;
    auto q = random_vec(size_t(T * kH * kD), seed + 1), kv = random_vec(size_t(T * kD), seed + 2);
    auto ring = random_vec(size_t(n_slots * kW * kD), seed + 3);
    auto comp = c.ratio ? random_vec(size_t(c.n_blocks * rpb * kD), seed + 4) : std::vector<float>();
    auto sink = random_vec(size_t(kH), seed + 5, 2.0f);
    const int64_t K = 512;
    std::vector<int32_t> idx;
    if (c.with_idx) {
      idx.assign(size_t(T * K), -1);
      std::mt19937 rng(seed + 6);
      for (int64_t t = 0; t < T; ++t) {
        int vis = (m.h_tok_pos[t] + 1) / c.ratio;
        std::vector<int32_t> all(static_cast<size_t>(vis));
        for (int r = 0; r < vis; ++r) all[r] = r;
        std::shuffle(all.begin(), all.end(), rng);
        for (int64_t k = 0; k < std::min<int64_t>(K, vis); ++k) idx[t * K + k] = all[k];
        if (vis > 3) idx[t * K + 1] = vis + 5;  // beyond the visible rows: must be skipped
      }
    }
    AttnArgs ha;
    ha.q = view(q, {T, kH, kD});
    ha.kv_new = view(kv, {T, kD});
    ha.ring = view(ring, {n_slots, kW, kD});
    if (c.ratio) ha.comp = view(comp, {c.n_blocks, rpb, kD});
    ha.comp_ratio = c.ratio;
    ha.rows_per_block = rpb;
    if (c.with_idx) ha.comp_idx = view(idx, {T, K});
    ha.sink = view(sink, {kH});
    ha.scale = 1.0f / std::sqrt(float(kD));
    ha.window = int(kW);
    ha.non_causal = c.non_causal;
    gpu->set_numerics(split_bf16 ? Numerics::Official : Numerics::Reference);  // the plan picks the path
    std::vector<float> ref(q.size());
    ha.out = view(ref, {T, kH, kD});
    cpu->sparse_attention(ha, m);

    StepMeta gm = m;
    upload_meta(gm);
    AttnArgs ga = ha;
    ga.q = devf(q, {T, kH, kD});
    ga.kv_new = devf(kv, {T, kD});
    ga.ring = devf(ring, {n_slots, kW, kD});
    if (c.ratio) ga.comp = devf(comp, {c.n_blocks, rpb, kD});
    if (c.with_idx) ga.comp_idx = devi(idx, {T, K});
    ga.sink = devf(sink, {kH});
    ga.out = poisoned(DType::F32, {T, kH, kD});
    gpu->sparse_attention(ga, gm);
    if (split_bf16) compare("sparse_attention bf16x3", c.what, down<float>(ga.out), ref, 1e-4, 6e-4);
    else compare("sparse_attention", c.what, down<float>(ga.out), ref, 1e-6, 1e-6);
  }
};

TEST_F(CudaAttention, CsaWithIndexerPicks) {
  // Prefill chunk straddling compression boundaries, a decode token inside the first window,
  // the very first token.
  run({"csa m4 K512 T=19 (17@4000,1@7,1@0)", {{4000, 17, 0, {}}, {7, 1, 1, {}}, {0, 1, 2, {}}}, 4, true, 40}, 201);
}

TEST_F(CudaAttention, HcaAllRows) {
  run({"hca m128 all rows T=18 (17@300,1@1M)", {{300, 17, 3, {}}, {1048575, 1, 1, {}}}, 128, false, 8200}, 211);
}

TEST_F(CudaAttention, SwaOnly) {
  run({"swa T=20 (17@0,3@126)", {{0, 17, 0, {}}, {126, 3, 2, {}}}, 0, false, 0}, 221);
}

TEST_F(CudaAttention, V41Ratio2) {
  run({"v41 m2 K512 T=18 (17@2040,1@129)", {{2040, 17, 0, {}}, {129, 1, 3, {}}}, 2, true, 20}, 231);
}

TEST_F(CudaAttention, TensorCoresAllKinds) {
  run({"csa m4 K512 T=19 (17@4000,1@7,1@0)", {{4000, 17, 0, {}}, {7, 1, 1, {}}, {0, 1, 2, {}}}, 4, true, 40}, 202, true);
  run({"hca m128 all rows T=18 (17@300,1@1M)", {{300, 17, 3, {}}, {1048575, 1, 1, {}}}, 128, false, 8200}, 212, true);
  run({"swa T=20 (17@0,3@126)", {{0, 17, 0, {}}, {126, 3, 2, {}}}, 0, false, 0}, 222, true);
  run({"v41 m2 K512 T=18 (17@2040,1@129)", {{2040, 17, 0, {}}, {129, 1, 3, {}}}, 2, true, 20}, 232, true);
}

TEST_F(CudaAttention, NonCausalDraftBlocks) {
  // DSpark's draft blocks (5 tokens seeing the W ring rows before the chunk and all 5 of its
  // own): right after position 0, with a partly filled ring, with the ring wrapped; both paths.
  const AttnCase c{"non-causal T=15 (5@1,5@100,5@300)", {{1, 5, 0, {}}, {100, 5, 1, {}}, {300, 5, 2, {}}}, 0, false, 0,
                   true};
  run(c, 241);
  run(c, 242, true);
}

// Fast numerics (bf16 q, rows and out): tests/cuda/test_attention_fast.cpp.

TEST_F(CudaParity, RingWriteAndPagedWriteBf16) {
  StepMeta m = make_meta({{0, 200, 1, {}}, {127, 3, 3, {}}, {5, 1, 0, {}}});
  const int64_t T = m.n_tokens, S = 4;
  auto kv = bf16_of(random_vec(size_t(T * kD), 291)), ring = bf16_of(random_vec(size_t(S * kW * kD), 292));
  Tensor gring = devb(ring, {S, kW, kD});
  StepMeta gm = m;
  upload_meta(gm);
  cpu->ring_write(bview(kv, {T, kD}), bview(ring, {S, kW, kD}), m);
  gpu->ring_write(devb(kv, {T, kD}), gring, gm);
  compare_bf16("ring_write", "bf16 T=204 (200@0 wraps, 3@127, 1@5)", downb(gring), widen(ring), 0, 0);
  // Paged rows of 128 (indexer keys) into shuffled blocks.
  EmitPlan plan;
  for (int k = 0; k < 6; ++k) {
    plan.h_seq.push_back(k % 3);
    plan.h_row.push_back(5 * k + 1);
    plan.h_pos.push_back(4 * (5 * k + 1));
  }
  plan.n = 6;
  EmitPlan gplan = plan;
  gplan.seq = devi(plan.h_seq, {plan.n});
  gplan.row = devi(plan.h_row, {plan.n});
  gplan.pos = devi(plan.h_pos, {plan.n});
  StepMeta pm = m;
  pm.max_blocks = 2;
  pm.h_block_table = {3, 0, 5, 1, 2, 4};
  StepMeta gpm = pm;
  upload_meta(gpm);
  const int64_t nb = 6, rpb = 32, di = 128;
  auto rows = bf16_of(random_vec(size_t(plan.n * di), 293)), cache = bf16_of(random_vec(size_t(nb * rpb * di), 294));
  Tensor gcache = devb(cache, {nb, rpb, di});
  cpu->paged_write(bview(rows, {plan.n, di}), bview(cache, {nb, rpb, di}), int(rpb), plan, pm);
  gpu->paged_write(devb(rows, {plan.n, di}), gcache, int(rpb), gplan, gpm);
  compare_bf16("paged_write", "bf16 6 rows of 128 into [6,32,128]", downb(gcache), widen(cache), 0, 0);
}

TEST_F(CudaParity, RingWrite) {
  StepMeta m = make_meta({{0, 200, 1, {}}, {127, 3, 3, {}}, {5, 1, 0, {}}});
  const int64_t T = m.n_tokens, S = 4;
  auto kv = random_vec(size_t(T * kD), 241), ring = random_vec(size_t(S * kW * kD), 242);
  Tensor gring = devf(ring, {S, kW, kD});
  StepMeta gm = m;
  upload_meta(gm);
  cpu->ring_write(view(kv, {T, kD}), view(ring, {S, kW, kD}), m);
  gpu->ring_write(devf(kv, {T, kD}), gring, gm);
  compare("ring_write", "T=204 (200@0 wraps, 3@127, 1@5)", down<float>(gring), ring, 0, 0);
}

// Rows a compressor emits during the step (sequence, window) order.
EmitPlan make_plan(const StepMeta& m, int ratio) {
  EmitPlan p;
  for (int s = 0; s < m.n_seqs; ++s)
    for (int i = 0; i < m.h_len[s]; ++i) {
      int pos = m.h_start_pos[s] + i;
      if ((pos + 1) % ratio) continue;
      p.h_seq.push_back(s);
      p.h_row.push_back(pos / ratio);
      p.h_pos.push_back((pos / ratio) * ratio);
    }
  p.n = int(p.h_seq.size());
  return p;
}

struct CompCase {
  const char* what;
  int ratio, dc;
  bool overlap, ape;
};

TEST_F(CudaParity, Compressor) {
  for (CompCase c : {CompCase{"v4 csa m4 overlap dc512", 4, 512, true, true},
                     CompCase{"v4 indexer m4 overlap dc128", 4, 128, true, true},
                     CompCase{"v4 hca m128 dc512", 128, 512, false, true},
                     CompCase{"v41 m2 dc512 no ape", 2, 512, false, false}}) {
    // Fresh sequence (reset), decode tokens, a chunk crossing the 128 boundary.
    StepMeta m = make_meta({{0, 17, 0, {}}, {6, 1, 1, {}}, {125, 7, 2, {}}, {3, 1, 3, {}}, {255, 1, 4, {}}});
    const int64_t T = m.n_tokens, S = 5, C = int64_t(c.overlap ? 2 : 1) * c.dc,
                  rows = int64_t(c.overlap ? 2 : 1) * c.ratio;
    auto a = random_vec(size_t(T * C), 251), g = random_vec(size_t(T * C), 252, 3.0f), ape = random_vec(size_t(c.ratio * C), 253);
    auto skv = random_vec(size_t(S * rows * C), 254), ssc = random_vec(size_t(S * rows * C), 255, 3.0f);
    std::vector<int32_t> reset = {0};
    cpu->reset_state(view(skv, {S, rows, C}), view(ssc, {S, rows, C}), reset);
    EmitPlan plan = make_plan(m, c.ratio);
    std::vector<float> out(size_t(std::max(1, plan.n) * c.dc));
    CompressorArgs ha;
    ha.a = view(a, {T, C});
    ha.g = view(g, {T, C});
    if (c.ape) ha.ape = view(ape, {c.ratio, C});
    ha.state_kv = view(skv, {S, rows, C});
    ha.state_score = view(ssc, {S, rows, C});
    ha.ratio = c.ratio;
    ha.overlap = c.overlap;
    ha.dc = c.dc;
    ha.out = view(out, {std::max(1, plan.n), c.dc});
    // Device side starts from the same (already reset) state.
    CompressorArgs ga = ha;
    ga.a = devf(a, {T, C});
    ga.g = devf(g, {T, C});
    if (c.ape) ga.ape = devf(ape, {c.ratio, C});
    ga.state_kv = devf(skv, {S, rows, C});
    ga.state_score = devf(ssc, {S, rows, C});
    ga.out = poisoned(DType::F32, {std::max(1, plan.n), c.dc});
    EmitPlan gplan = plan;
    if (plan.n) {
      gplan.seq = devi(plan.h_seq, {plan.n});
      gplan.row = devi(plan.h_row, {plan.n});
      gplan.pos = devi(plan.h_pos, {plan.n});
    }
    StepMeta gm = m;
    upload_meta(gm);
    cpu->compressor(ha, plan, m);
    gpu->compressor(ga, gplan, gm);
    std::string sh = std::string(c.what) + " emits " + std::to_string(plan.n);
    if (plan.n) {
      auto got = down<float>(ga.out);
      got.resize(size_t(plan.n * c.dc));
      out.resize(size_t(plan.n * c.dc));
      compare("compressor rows", sh, got, out, 1e-7, 3e-7);
    }
    compare("compressor state kv", sh, down<float>(ga.state_kv), skv, 0, 0);
    compare("compressor state score", sh, down<float>(ga.state_score), ssc, 0, 0);

    // The paged write of those rows (rows per block = 128 / ratio).
    if (!plan.n) continue;
    const int rpb = 128 / c.ratio;
    StepMeta pm = m;
    pm.max_blocks = 4;
    pm.h_block_table.clear();
    for (int s = 0; s < m.n_seqs; ++s)
      for (int b = 0; b < 4; ++b) pm.h_block_table.push_back(s * 4 + (3 - b));
    StepMeta gpm = pm;
    upload_meta(gpm);
    const int64_t nb = 4 * m.n_seqs;
    auto cache = random_vec(size_t(nb * rpb * c.dc), 256);
    Tensor gcache = devf(cache, {nb, rpb, c.dc});
    cpu->paged_write(view(out, {plan.n, c.dc}), view(cache, {nb, rpb, c.dc}), rpb, plan, pm);
    gpu->paged_write(devf(out, {plan.n, c.dc}), gcache, rpb, gplan, gpm);
    compare("paged_write", sh, down<float>(gcache), cache, 0, 0);
  }
}

}  // namespace
}  // namespace dil::test

namespace dil::test {
namespace {

// Fast numerics: the pooled rows are bf16 (a, g and the state stay f32, as the official
// compressor pools in fp32). The rows keep the f32 bound plus one bf16 ulp; the state exact.
TEST_F(CudaParity, CompressorBf16Rows) {
  for (CompCase c : {CompCase{"bf16 v4 csa m4 overlap dc512", 4, 512, true, true},
                     CompCase{"bf16 v4 indexer m4 overlap dc128", 4, 128, true, true},
                     CompCase{"bf16 v4 hca m128 dc512", 128, 512, false, true},
                     CompCase{"bf16 v41 m2 dc512 no ape", 2, 512, false, false}}) {
    StepMeta m = make_meta({{0, 17, 0, {}}, {6, 1, 1, {}}, {125, 7, 2, {}}, {3, 1, 3, {}}, {255, 1, 4, {}}});
    const int64_t T = m.n_tokens, S = 5, C = int64_t(c.overlap ? 2 : 1) * c.dc,
                  rows = int64_t(c.overlap ? 2 : 1) * c.ratio;
    auto a = random_vec(size_t(T * C), 257), g = random_vec(size_t(T * C), 258, 3.0f);
    auto ape = random_vec(size_t(c.ratio * C), 259);
    auto skv = random_vec(size_t(S * rows * C), 260), ssc = random_vec(size_t(S * rows * C), 261, 3.0f);
    std::vector<int32_t> reset = {0};
    cpu->reset_state(view(skv, {S, rows, C}), view(ssc, {S, rows, C}), reset);
    EmitPlan plan = make_plan(m, c.ratio);
    ASSERT_GT(plan.n, 0);
    std::vector<uint16_t> out(size_t(plan.n * c.dc));
    CompressorArgs ha;
    ha.a = view(a, {T, C});
    ha.g = view(g, {T, C});
    if (c.ape) ha.ape = view(ape, {c.ratio, C});
    ha.state_kv = view(skv, {S, rows, C});
    ha.state_score = view(ssc, {S, rows, C});
    ha.ratio = c.ratio;
    ha.overlap = c.overlap;
    ha.dc = c.dc;
    ha.out = bview(out, {plan.n, c.dc});
    CompressorArgs ga = ha;
    ga.a = devf(a, {T, C});
    ga.g = devf(g, {T, C});
    if (c.ape) ga.ape = devf(ape, {c.ratio, C});
    ga.state_kv = devf(skv, {S, rows, C});
    ga.state_score = devf(ssc, {S, rows, C});
    ga.out = poisoned(DType::BF16, {plan.n, c.dc});
    EmitPlan gplan = plan;
    gplan.seq = devi(plan.h_seq, {plan.n});
    gplan.row = devi(plan.h_row, {plan.n});
    gplan.pos = devi(plan.h_pos, {plan.n});
    StepMeta gm = m;
    upload_meta(gm);
    cpu->compressor(ha, plan, m);
    gpu->compressor(ga, gplan, gm);
    std::string sh = std::string(c.what) + " emits " + std::to_string(plan.n);
    compare_bf16("compressor rows", sh, downb(ga.out), widen(out), 1e-7, 3e-7);
    compare("compressor state kv", sh, down<float>(ga.state_kv), skv, 0, 0);
    compare("compressor state score", sh, down<float>(ga.state_score), ssc, 0, 0);
  }
}

}  // namespace
}  // namespace dil::test
