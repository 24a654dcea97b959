// Sparse attention, ring/paged writes and the compressor recurrence of the CPU reference
// against direct formulas (model-spec §3.1 sparse_attn, §3.6, §3.9).
#include <gtest/gtest.h>

#include <functional>

#include "kernels/cpu/cpu_backend.h"
#include "test_util.h"

namespace dil {
namespace {

using test::view;

// softmax with sink over the given key rows, in double (model-spec §3.1).
std::vector<double> direct_attention(const float* q, const std::vector<const float*>& keys, int d, double scale,
                                     double sink) {
  std::vector<double> s;
  double mx = -1e300;
  for (const float* k : keys) {
    double dot = 0;
    for (int c = 0; c < d; ++c) dot += double(q[c]) * k[c];
    s.push_back(dot * scale);
    mx = std::max(mx, s.back());
  }
  double den = std::exp(sink - mx);
  std::vector<double> o(d, 0.0);
  for (size_t j = 0; j < keys.size(); ++j) {
    const double e = std::exp(s[j] - mx);
    den += e;
    for (int c = 0; c < d; ++c) o[c] += e * keys[j][c];
  }
  for (auto& v : o) v /= den;
  return o;
}

struct AttnCase {
  static constexpr int d = 8, H = 2, W = 4, rpb = 2;
  std::vector<float> ring = test::random_vec(2 * W * d, 31);     // [2 slots, W, d]
  std::vector<float> comp = test::random_vec(3 * rpb * d, 32);   // [3 blocks, rpb, d]
  std::vector<float> sink = {0.3f, -1.2f};
  float scale = 0.35f;
};

TEST(Attention, WindowAcrossChunkBoundaryCompressedRowsAndSink) {
  CpuBackend be;
  AttnCase c;
  const int d = c.d, H = c.H, W = c.W, T = 3;
  // One sequence continuing at position 5 (slot 1): ring slot j % 4 holds positions 1..4;
  // its compressed rows (ratio 2) live in blocks [2, 0] of two rows each.
  StepMeta m = test::make_meta({{5, T, 1, {2, 0}}});
  std::vector<float> q = test::random_vec(T * H * d, 33, 2.0f), kv = test::random_vec(T * d, 34), out(T * H * d);
  auto window_key = [&](int j) { return j >= 5 ? &kv[(j - 5) * d] : &c.ring[(1 * W + j % W) * d]; };
  const int bt[2] = {2, 0};
  auto comp_key = [&](int r) { return &c.comp[(bt[r / 2] * c.rpb + r % 2) * d]; };
  std::vector<int32_t> cidx = {2, -1, 0, /**/ 0, 2, 3, /**/ 3, -1, 1};  // [T, 3]
  std::vector<std::vector<float>> by_shift;  // outputs without comp_idx, per sink shift
  for (bool use_idx : {false, true})
    for (float sink_shift : {0.0f, 3.0f}) {
      std::vector<float> sink = {c.sink[0] + sink_shift, c.sink[1] + sink_shift};
      AttnArgs a;
      a.q = view(q, {T, H, d});
      a.kv_new = view(kv, {T, d});
      a.ring = view(c.ring, {2, W, d});
      a.comp = view(c.comp, {3, c.rpb, d});
      a.comp_ratio = 2;
      a.rows_per_block = c.rpb;
      if (use_idx) a.comp_idx = view(cidx, {T, 3});
      a.sink = view(sink, {H});
      a.scale = c.scale;
      a.window = W;
      a.out = view(out, {T, H, d});
      be.sparse_attention(a, m);
      if (!use_idx) by_shift.push_back(out);
      for (int t = 0; t < T; ++t) {
        const int p = 5 + t;
        std::vector<const float*> keys;
        for (int j = p - W + 1; j <= p; ++j) keys.push_back(window_key(j));
        const int n_vis = (p + 1) / 2;
        if (!use_idx) {
          for (int r = 0; r < n_vis; ++r) keys.push_back(comp_key(r));
        } else {
          for (int k = 0; k < 3; ++k)
            if (cidx[t * 3 + k] >= 0 && cidx[t * 3 + k] < n_vis) keys.push_back(comp_key(cidx[t * 3 + k]));
        }
        for (int h = 0; h < H; ++h) {
          auto o = direct_attention(&q[(t * H + h) * d], keys, d, c.scale, sink[h]);
          for (int i = 0; i < d; ++i) EXPECT_NEAR(out[(t * H + h) * d + i], o[i], 1e-6 * std::fabs(o[i]) + 1e-9);
        }
      }
    }
  // The sink only rescales a (token, head): out(sink) / out(sink + 3) = (Z + e^(sink+3)) / (Z + e^sink) > 1.
  for (int th = 0; th < T * H; ++th)
    for (int i = 1; i < d; ++i) {
      const double r0 = double(by_shift[0][th * d]) / by_shift[1][th * d];
      EXPECT_GT(r0, 1.0);
      EXPECT_NEAR(double(by_shift[0][th * d + i]) / by_shift[1][th * d + i], r0, 1e-5 * r0);
    }
}

TEST(Attention, BatchInvarianceAndNoCompressedBranch) {
  CpuBackend be;
  AttnCase c;
  const int d = c.d, H = c.H, W = c.W;
  // Batch: seq A (slot 0, positions 0..1) then seq B (slot 1, positions 5..7).
  StepMeta mb = test::make_meta({{0, 2, 0, {1}}, {5, 3, 1, {2, 0}}});
  StepMeta ms = test::make_meta({{5, 3, 1, {2, 0}}});
  std::vector<float> q = test::random_vec(5 * H * d, 35), kv = test::random_vec(5 * d, 36);
  std::vector<float> outb(5 * H * d), outs(3 * H * d);
  auto run = [&](const StepMeta& m, float* qp, float* kvp, std::vector<float>& out, int ratio) {
    const int T = m.n_tokens;
    AttnArgs a;
    a.q = Tensor(qp, DType::F32, {T, H, d});
    a.kv_new = Tensor(kvp, DType::F32, {T, d});
    a.ring = view(c.ring, {2, W, d});
    if (ratio) {
      a.comp = view(c.comp, {3, c.rpb, d});
      a.comp_ratio = ratio;
      a.rows_per_block = c.rpb;
    }
    a.sink = view(c.sink, {H});
    a.scale = c.scale;
    a.window = W;
    a.out = view(out, {T, H, d});
    be.sparse_attention(a, m);
  };
  for (int ratio : {0, 2}) {
    run(mb, q.data(), kv.data(), outb, ratio);
    run(ms, q.data() + 2 * H * d, kv.data() + 2 * d, outs, ratio);
    EXPECT_TRUE(test::same_bits(outs, std::vector<float>(outb.begin() + 2 * H * d, outb.end())));
  }
  // Position 0 of seq A sees only itself: softmax over one key with the sink.
  run(mb, q.data(), kv.data(), outb, 0);
  for (int h = 0; h < H; ++h) {
    auto o = direct_attention(&q[h * d], {&kv[0]}, d, c.scale, c.sink[h]);
    for (int i = 0; i < d; ++i) EXPECT_NEAR(outb[h * d + i], o[i], 1e-6 * std::fabs(o[i]) + 1e-9);
  }
}

TEST(RingAndPagedWrite, Placement) {
  CpuBackend be;
  const int d = 3, W = 4;
  std::vector<float> ring(2 * W * d, -7.0f), kv = test::random_vec(6 * d, 37);
  // Seq 0: positions 5..7 (slot 1); seq 1: positions 0..2 (slot 0) -- here only 3 rows fit below.
  StepMeta m = test::make_meta({{5, 3, 1, {}}, {0, 3, 0, {}}});
  be.ring_write(view(kv, {6, d}), view(ring, {2, W, d}), m);
  for (int i = 0; i < 3; ++i)
    for (int c = 0; c < d; ++c) {
      EXPECT_EQ(ring[(1 * W + (5 + i) % W) * d + c], kv[i * d + c]);
      EXPECT_EQ(ring[(0 * W + i) * d + c], kv[(3 + i) * d + c]);
    }
  EXPECT_EQ(ring[(1 * W + 0) * d], -7.0f);  // position 4's slot untouched
  // A chunk longer than the window keeps only its last W positions (10..15 -> 12..15).
  std::vector<float> kv6 = test::random_vec(6 * d, 38);
  be.ring_write(view(kv6, {6, d}), view(ring, {2, W, d}), test::make_meta({{10, 6, 0, {}}}));
  for (int p = 12; p < 16; ++p)
    for (int c = 0; c < d; ++c) EXPECT_EQ(ring[(p % W) * d + c], kv6[(p - 10) * d + c]);
  // paged_write: rows 0, 1, 2 of seq 0 with 2 rows per block and blocks [2, 0].
  std::vector<float> cache(3 * 2 * d, 0.5f), rows = test::random_vec(3 * d, 39);
  EmitPlan plan;
  plan.n = 3;
  plan.h_seq = {0, 0, 0};
  plan.h_row = {0, 1, 2};
  plan.h_pos = {0, 2, 4};
  be.paged_write(view(rows, {3, d}), view(cache, {3, 2, d}), 2, plan, test::make_meta({{0, 6, 0, {2, 0}}}));
  for (int c = 0; c < d; ++c) {
    EXPECT_EQ(cache[(2 * 2 + 0) * d + c], rows[0 * d + c]);
    EXPECT_EQ(cache[(2 * 2 + 1) * d + c], rows[1 * d + c]);
    EXPECT_EQ(cache[(0 * 2 + 0) * d + c], rows[2 * d + c]);
    EXPECT_EQ(cache[(0 * 2 + 1) * d + c], 0.5f);
    EXPECT_EQ(cache[(1 * 2 + 0) * d + c], 0.5f);
  }
}

// A compressor configuration plus one sequence's inputs [len, width].
struct CompCase {
  int ratio, dc;
  bool overlap, ape;
  int len;
  int width() const { return (overlap ? 2 : 1) * dc; }
  int rows() const { return (overlap ? 2 : 1) * ratio; }
};

// Runs the sequence through the compressor in chunks (slot 1 of 2) and returns the emitted rows.
std::vector<float> run_chunks(CpuBackend& be, const CompCase& cc, std::vector<float>& A, std::vector<float>& G,
                              std::vector<float>& ape, const std::vector<int>& chunks) {
  const int wdt = cc.width(), rows = cc.rows();
  std::vector<float> skv(2 * rows * wdt, 9.0f), ssc(2 * rows * wdt, 9.0f), out;
  be.reset_state(view(skv, {2, rows, wdt}), view(ssc, {2, rows, wdt}), {1});
  int start = 0;
  for (int n : chunks) {
    EmitPlan plan;
    for (int p = start; p < start + n; ++p)
      if ((p + 1) % cc.ratio == 0) {
        plan.h_seq.push_back(0);
        plan.h_row.push_back(p / cc.ratio);
        plan.h_pos.push_back(p / cc.ratio * cc.ratio);
      }
    plan.n = int(plan.h_seq.size());
    std::vector<float> o(std::max(1, plan.n) * cc.dc);
    CompressorArgs a;
    a.a = Tensor(&A[start * wdt], DType::F32, {n, wdt});
    a.g = Tensor(&G[start * wdt], DType::F32, {n, wdt});
    if (cc.ape) a.ape = view(ape, {cc.ratio, wdt});
    a.state_kv = view(skv, {2, rows, wdt});
    a.state_score = view(ssc, {2, rows, wdt});
    a.ratio = cc.ratio;
    a.overlap = cc.overlap;
    a.dc = cc.dc;
    a.out = view(o, {std::max(1, plan.n), cc.dc});
    be.compressor(a, plan, test::make_meta({{start, n, 1, {}}}));
    out.insert(out.end(), o.begin(), o.begin() + plan.n * cc.dc);
    start += n;
  }
  return out;
}

// model-spec §3.6 window formula in double: entry w pools softmax-weighted tokens per channel.
std::vector<double> direct_compress(const CompCase& cc, const std::vector<float>& A, const std::vector<float>& G,
                                    const std::vector<float>& ape) {
  const int m = cc.ratio, dc = cc.dc, wdt = cc.width();
  std::vector<double> out;
  for (int w = 0; w < cc.len / m; ++w)
    for (int ch = 0; ch < dc; ++ch) {
      std::vector<std::pair<double, double>> e;  // (score, value)
      auto add = [&](int t, int col) {
        const float sc = G[t * wdt + col] + (cc.ape ? ape[(t % m) * wdt + col] : 0.0f);
        e.push_back({sc, A[t * wdt + col]});
      };
      if (cc.overlap && w > 0)
        for (int t = (w - 1) * m; t < w * m; ++t) add(t, ch);
      for (int t = w * m; t < (w + 1) * m; ++t) add(t, cc.overlap ? dc + ch : ch);
      double mx = -1e300, den = 0, acc = 0;
      for (auto& [s, v] : e) mx = std::max(mx, s);
      for (auto& [s, v] : e) {
        den += std::exp(s - mx);
        acc += std::exp(s - mx) * v;
      }
      out.push_back(acc / den);
    }
  return out;
}

TEST(Compressor, ChunkingIsBitIdenticalAndMatchesWindowFormula) {
  CpuBackend be;
  const std::vector<CompCase> cases = {{4, 8, true, true, 13}, {2, 8, false, false, 9}, {128, 4, false, true, 260}};
  for (const auto& cc : cases) {
    const int wdt = cc.width();
    std::vector<float> A = test::random_vec(cc.len * wdt, 40 + cc.ratio, 2.0f),
                       G = test::random_vec(cc.len * wdt, 50 + cc.ratio, 3.0f),
                       ape = test::random_vec(cc.ratio * wdt, 60 + cc.ratio);
    const auto whole = run_chunks(be, cc, A, G, ape, {cc.len});
    ASSERT_EQ(int(whole.size()), cc.len / cc.ratio * cc.dc);
    EXPECT_TRUE(test::same_bits(whole, run_chunks(be, cc, A, G, ape, std::vector<int>(cc.len, 1)))) << cc.ratio;
    EXPECT_TRUE(test::same_bits(whole, run_chunks(be, cc, A, G, ape, {3, 5, cc.len - 8}))) << cc.ratio;
    const auto ref = direct_compress(cc, A, G, ape);
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(whole[i], ref[i], 1e-6 * std::fabs(ref[i]) + 1e-9) << cc.ratio;
  }
}

TEST(Compressor, TwoSequencesInOneStep) {
  CpuBackend be;
  const CompCase cc{4, 4, true, true, 9};
  const int wdt = cc.width(), rows = cc.rows();
  std::vector<float> A = test::random_vec(18 * wdt, 70), G = test::random_vec(18 * wdt, 71), ape = test::random_vec(4 * wdt, 72);
  // Seq X = tokens 0..8 (slot 0), seq Y = tokens 9..17 (slot 1); Y's positions 0..1 run in an
  // earlier step, then one step holds X[0..8] and Y[2..8].
  std::vector<float> AX(A.begin(), A.begin() + 9 * wdt), GX(G.begin(), G.begin() + 9 * wdt);
  std::vector<float> AY(A.begin() + 9 * wdt, A.end()), GY(G.begin() + 9 * wdt, G.end());
  const auto soloX = run_chunks(be, cc, AX, GX, ape, {9}), soloY = run_chunks(be, cc, AY, GY, ape, {9});
  std::vector<float> skv(2 * rows * wdt), ssc(2 * rows * wdt);
  be.reset_state(view(skv, {2, rows, wdt}), view(ssc, {2, rows, wdt}), {0, 1});
  auto step = [&](const StepMeta& m, std::vector<float> a_in, std::vector<float> g_in) {
    EmitPlan plan;
    for (int t = 0; t < m.n_tokens; ++t) {
      const int p = m.h_tok_pos[t];
      if ((p + 1) % 4 == 0) {
        plan.h_seq.push_back(m.h_tok_seq[t]);
        plan.h_row.push_back(p / 4);
        plan.h_pos.push_back(p / 4 * 4);
      }
    }
    plan.n = int(plan.h_seq.size());
    std::vector<float> o(std::max(1, plan.n) * cc.dc);
    CompressorArgs a;
    a.a = view(a_in, {m.n_tokens, wdt});
    a.g = view(g_in, {m.n_tokens, wdt});
    a.ape = view(ape, {4, wdt});
    a.state_kv = view(skv, {2, rows, wdt});
    a.state_score = view(ssc, {2, rows, wdt});
    a.ratio = 4;
    a.overlap = true;
    a.dc = cc.dc;
    a.out = view(o, {std::max(1, plan.n), cc.dc});
    be.compressor(a, plan, m);
    o.resize(plan.n * cc.dc);
    return o;
  };
  step(test::make_meta({{0, 2, 1, {}}}), std::vector<float>(AY.begin(), AY.begin() + 2 * wdt),
       std::vector<float>(GY.begin(), GY.begin() + 2 * wdt));
  std::vector<float> a2(AX), g2(GX);
  a2.insert(a2.end(), AY.begin() + 2 * wdt, AY.end());
  g2.insert(g2.end(), GY.begin() + 2 * wdt, GY.end());
  const auto both = step(test::make_meta({{0, 9, 0, {}}, {2, 7, 1, {}}}), a2, g2);
  std::vector<float> want(soloX);
  want.insert(want.end(), soloY.begin(), soloY.end());
  EXPECT_TRUE(test::same_bits(both, want));
}

TEST(Compressor, ResetState) {
  CpuBackend be;
  std::vector<float> kv(3 * 2 * 2, 1.0f), sc(3 * 2 * 2, 1.0f);
  be.reset_state(view(kv, {3, 2, 2}), view(sc, {3, 2, 2}), {0, 2});
  for (int s = 0; s < 3; ++s)
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(kv[s * 4 + i], s == 1 ? 1.0f : 0.0f);
      EXPECT_EQ(sc[s * 4 + i], s == 1 ? 1.0f : -INFINITY);
    }
}

}  // namespace
}  // namespace dil
