// Parity of the fast-numerics sparse attention (bf16 q, rows and out) with the CPU fast
// backend (the specification: the exact function of the bf16 inputs, rounded once to bf16):
// wgmma_bf16 (attention_wgmma.cu) and flash_bf16 (attention_flash.cu): 64 heads per CTA, decode
// steps split over CTAs; mma_bf16
// (attention_mma.cu: 16 heads per CTA) and fp64, at V4 / V4.1 shapes: decode tokens, chunks of
// 17, prefill chunks of 4,096 (window + compressed + indexer-selected rows), sequences shorter
// than the window, 0 / 1 / 127 / 128 / 129 valid rows, tiles (and whole splits) masked.
//
// The tensor-core paths' bound per output element (token t, head h, dim c), derived from the
// arithmetic before any run and evaluated on the host from the test's own data (w_j the exact
// softmax weights of the reference, including the sink in the denominator; A_c = sum_j w_j
// |v_jc|; u = 2^-24; kUmma = 2^-20, the per-instruction model of the tensor cores' f32
// accumulation of test_moe_mma.cpp; R the rows per tile: 32 for mma_bf16, 64 for flash_bf16;
// C = ceil(candidates / R) tiles):
// 1. Scores. q and the rows are bf16, so every product q_i k_i is exact in f32; one mma.sync
//    adds 16 of them to the accumulator with an error <= kUmma (|c| + sum of the 16 |products|),
//    and over the 32 instructions of a 512-dim dot product (partial sums bounded by
//    a_j = sum_i |q_i k_ji|): |dS_j| <= 32 kUmma a_j = 2^-15 a_j; the f32 multiply by the scale
//    (flash_bf16: by the f32 constant scale * log2 e, itself within u) adds <= 2u |s_j|.
//    eps = max_j (scale 2^-15 a_j + 2u |s_j|) over the token's candidate rows.
// 2. exp. p_j = expf(s_j - m) (mma_bf16) or exp2f(s2_j - m2) (flash_bf16, the same value in
//    the log2 domain) in f32: relative error <= 2^-22 (2 ulp) + u |s_j - m| (the rounding of the
//    argument; in the log2 domain u |s2 - m2| ln 2 = u |s - m|); eta = the max over the rows.
//    The online rescaling multiplies the running sum and the accumulators by the same corr, so
//    corr's own error cancels in the ratio. flash_bf16's split steps weight each split by one
//    more exp2f (the combine) on the same terms: every row's weight is then a product of two
//    such exps, so eta doubles (taken for flash_bf16 whether it split or not).
// 3. Weights. With every score off by <= eps and every p by <= eta (relative), each normalised
//    weight (the denominator, sink included, moves by at most e^(eps + eta) as a whole) lies in
//    w_j e^(+-2(eps + eta)): |dw_j| <= (E - 1) w_j, E = e^(2(eps + eta)).
// 4. BF16 P. The probabilities are rounded to bf16 for P.V (RNE: relative 2^-8 at most, bf16 has
//    8 significant bits), the row sum keeps the f32 ones: the numerator moves by <= 2^-8 sum_j
//    w'_j |v_jc| <= 2^-8 E A_c.
// 5. P.V accumulation: R/16 instructions per tile, each off by <= kUmma times a partial sum of
//    p|v| (<= the total); the rescales and the row sums round once per value and tile (mma_bf16:
//    <= 14 u per 32-row tile, a quad's 8 + 2 shuffle sums, the rescale, the add; flash_bf16:
//    <= 24 u per 64-row tile, 16 + 2 sums, rescale, add); the final normalisation (sink, two exps,
//    a division, a product) <= 2^-17 relative; flash_bf16's combine of up to 16 splits adds
//    <= 34 u (16 sums in the numerator and in the denominator, a division, a product):
//    gamma = kUmma (C R/16 + 1) + kTileU C u + 2^-17 [+ 34 u].
// So |o_gpu - o_exact| <= ((E - 1) + E (1 + 2^-8)(2^-8 + gamma)) A_c, and both outputs are
// rounded once to bf16: one bf16 ulp more per element. The P rounding dominates (2^-8 A_c);
// it is a worst case (every rounding in the same direction).
// In L2 (random rounding directions): each rounding of p_j is an independent error of variance
// <= (2^-8)^2 / 3 relative (uniform within +-2^-8), so the f32 outputs differ by d_c with
// E d_c^2 <= s_c^2 = 2^-16 / 3 sum_j w_j^2 v_jc^2 + ((E - 1 + E gamma) A_c)^2 (steps 1-3 and 5
// taken at their worst); the two bf16 roundings then differ by one ulp where a rounding midpoint
// lies between the two values (probability |d_c| / ulp), so E (got - ref)^2 <= s_c^2 + s_c ulp_c.
// The test requires the sum over all elements of the squared differences to stay below 4x the
// sum of those expectations (a single dominant row's rounding error, fully correlated over the
// 512 dims, reaches at most 3x its expectation: rho^2 <= 2^-16 = 3 E rho^2).
// fp64 (forced, or at head dims != 512): double arithmetic like the reference, the f32 bound
// (1e-6 / 1e-6) plus one bf16 ulp.
#include <algorithm>

#include "parity.h"

namespace dil::test {
namespace {

constexpr int64_t kW = 128, kK = 512;

struct AttnCase {
  const char* what;
  std::vector<SeqSpec> seqs;  // blocks filled in by the test
  int ratio;                  // 0: SWA only
  bool with_idx;              // indexer picks (K = 512) instead of all visible rows
  int64_t n_blocks;           // physical compressed blocks
  bool non_causal = false;    // AttnArgs::non_causal (the DSpark draft block; ratio 0)
};

struct FastAttn {
  int64_t H = 64, D = 512;
  float q_amp = 1.0f;     // amplitude of q (6: peaky softmax, many rescales)
  const char* force = "";  // an implementation forced ("" = the plan's)
  int idx_keep = -1;      // with_idx: keep only this many valid picks per token (-1: all)
};

// One step's inputs on the host (bf16 as the fast cache stores them) and its layout.
struct FastStep {
  std::string what;
  StepMeta m;
  int64_t H = 0, D = 0, n_slots = 0, n_blocks = 0;
  int ratio = 0, rpb = 0;
  int64_t K = 0;  // 0: all visible compressed rows
  float scale = 0;
  bool non_causal = false;
  std::vector<uint16_t> q, kv, ring, comp;  // [T,H,D], [T,D], [n_slots,W,D], [n_blocks,rpb,D]
  std::vector<float> sink;                   // [H]
  std::vector<int32_t> idx;                  // [T,K]

  AttnArgs host_args() {
    const int64_t T = m.n_tokens;
    AttnArgs a;
    a.q = bview(q, {T, H, D});
    a.kv_new = bview(kv, {T, D});
    a.ring = bview(ring, {n_slots, kW, D});
    if (ratio) a.comp = bview(comp, {n_blocks, rpb, D});
    a.comp_ratio = ratio;
    a.rows_per_block = rpb;
    if (K) a.comp_idx = view(idx, {T, K});
    a.sink = view(sink, {H});
    a.scale = scale;
    a.window = int(kW);
    a.non_causal = non_causal;
    return a;
  }
};

// Indexer picks of token t: `keep` (-1: all up to K) distinct visible rows in random order at
// random columns, the other columns -1; one pick beyond the visible rows where there are more
// than 3 (must be skipped).
void fill_picks(int32_t* row, int vis, int keep, std::mt19937& rng) {
  std::fill(row, row + kK, -1);
  std::vector<int32_t> all(static_cast<size_t>(vis));
  for (int r = 0; r < vis; ++r) all[size_t(r)] = r;
  std::shuffle(all.begin(), all.end(), rng);
  const int64_t n = std::min<int64_t>(keep < 0 ? kK : keep, vis);
  if (keep < 0) {
    for (int64_t k = 0; k < n; ++k) row[k] = all[size_t(k)];
    if (vis > 3) row[1] = vis + 5;
    return;
  }
  std::vector<int32_t> cols(static_cast<size_t>(kK));
  for (int64_t k = 0; k < kK; ++k) cols[size_t(k)] = int32_t(k);
  std::shuffle(cols.begin(), cols.end(), rng);
  for (int64_t k = 0; k < n; ++k) row[cols[size_t(k)]] = all[size_t(k)];
}

class CudaAttentionFast : public CudaParity {
 protected:
  FastStep make_step(AttnCase c, uint32_t seed, const FastAttn& f) {
    FastStep st;
    st.what = c.what;
    st.H = f.H;
    st.D = f.D;
    st.ratio = c.ratio;
    st.non_causal = c.non_causal;
    st.rpb = c.ratio ? int(128 / c.ratio) : 0;
    int base = 0;
    for (auto& sq : c.seqs) {
      if (!c.ratio) continue;
      int rows = (sq.start_pos + sq.len) / c.ratio;
      int nb = std::max(1, (rows + st.rpb - 1) / st.rpb);
      sq.blocks = block_list(nb, base, seed + base);
      base += nb;
    }
    EXPECT_LE(base, c.n_blocks);
    st.m = make_meta(c.seqs);
    const int64_t T = st.m.n_tokens, H = st.H, D = st.D;
    st.n_slots = 4;
    st.n_blocks = c.n_blocks;
    st.q = bf16_of(random_vec(size_t(T * H * D), seed + 1, f.q_amp));
    st.kv = bf16_of(random_vec(size_t(T * D), seed + 2));
    st.ring = bf16_of(random_vec(size_t(st.n_slots * kW * D), seed + 3));
    if (c.ratio) st.comp = bf16_of(random_vec(size_t(c.n_blocks * st.rpb * D), seed + 4));
    st.sink = random_vec(size_t(H), seed + 5, 2.0f);
    if (c.with_idx) {
      st.K = kK;
      st.idx.assign(size_t(T * kK), -1);
      std::mt19937 rng(seed + 6);
      for (int64_t t = 0; t < T; ++t) fill_picks(st.idx.data() + t * kK, (st.m.h_tok_pos[t] + 1) / c.ratio, f.idx_keep, rng);
    }
    st.scale = 1.0f / std::sqrt(float(D));
    return st;
  }

  // Packed caches of a step (run_packed): the ring and compressed rows' bytes in their formats.
  struct PackedCaches {
    kvpack::RowShape ring_s, comp_s;
    std::vector<uint8_t> ring, comp;  // [n_slots, W, row bytes], [n_blocks, rpb, row bytes]
  };

  // The GPU's output for the step (the implementation `force`d, or the plan's), and its name;
  // on the packed caches instead of st's bf16 rows when `packed` is given.
  std::vector<float> run_gpu(FastStep& st, const char* force, std::string* impl, const PackedCaches* packed = nullptr) {
    if (forced_ != force) {  // a backend with the implementation forced, or the plan's again
      BackendOptions o = test_options();
      if (*force) o.force["sparse_attention"] = force;
      gpu = make_backend(BackendKind::CUDA, 0, o);
      forced_ = force;
    }
    gpu->set_numerics(Numerics::Fast);
    const int64_t T = st.m.n_tokens, H = st.H, D = st.D;
    StepMeta gm = st.m;
    upload_meta(gm);
    AttnArgs ga = st.host_args();
    ga.q = devb(st.q, {T, H, D});
    ga.kv_new = devb(st.kv, {T, D});
    if (packed) {
      ga.ring = dev(packed->ring, DType::U8, {st.n_slots, kW, int64_t(kvpack::row_bytes(packed->ring_s))});
      ga.ring_pack = packed->ring_s;
      if (st.ratio) {
        ga.comp = dev(packed->comp, DType::U8, {st.n_blocks, st.rpb, int64_t(kvpack::row_bytes(packed->comp_s))});
        ga.comp_pack = packed->comp_s;
      }
    } else {
      ga.ring = devb(st.ring, {st.n_slots, kW, D});
      if (st.ratio) ga.comp = devb(st.comp, {st.n_blocks, st.rpb, D});
    }
    if (st.K) ga.comp_idx = devi(st.idx, {T, st.K});
    ga.sink = devf(st.sink, {H});
    ga.out = poisoned(DType::BF16, {T, H, D});
    gpu->sparse_attention(ga, gm);
    *impl = gpu->impl_for(attention_site(int(H), int(D), st.ratio, int(st.K), DType::BF16, Numerics::Fast), T).name;
    return downb(ga.out);
  }

  std::vector<float> run_cpu(FastStep& st) {
    cpu->set_numerics(Numerics::Fast);
    std::vector<uint16_t> ref(st.q.size());
    AttnArgs ha = st.host_args();
    ha.out = bview(ref, {st.m.n_tokens, st.H, st.D});
    cpu->sparse_attention(ha, st.m);
    return widen(ref);
  }

  // got (the GPU's) against want (the CPU fast specification) within the derived bound of
  // `impl` (steps 1-5 above), evaluated from st's inputs.
  void check(const FastStep& st, const std::vector<float>& got, const std::vector<float>& want,
             const std::string& impl) {
    if (impl == "fp64") {
      compare_bf16("sparse_attention fp64", st.what, got, want, 1e-6, 1e-6);
      return;
    }
    ASSERT_TRUE(impl == "wgmma_bf16" || impl == "flash_bf16" || impl == "mma_bf16") << impl;
    // wgmma_bf16 has flash_bf16's tiles, splits and combine; its per-tile row-sum roundings
    // (8 adds, 2 shuffle sums, the rescale, the add, the warpgroups' sum) stay under flash's 24 u.
    const bool flash = impl == "flash_bf16" || impl == "wgmma_bf16";
    const double R = flash ? 64 : 32, tile_u = flash ? 24 : 14, combine_u = flash ? 34 : 0, eta_mult = flash ? 2 : 1;
    const StepMeta& m = st.m;
    const int64_t T = m.n_tokens, H = st.H, D = st.D, K = st.K;
    const auto qw = widen(st.q), kvw = widen(st.kv), ringw = widen(st.ring), compw = widen(st.comp);
    std::vector<double> bound(st.q.size()), sigma2(st.q.size());
    std::vector<const float*> rows;
    std::vector<double> sc, ab, w;
    for (int64_t t = 0; t < T; ++t) {
      const int sq = m.h_tok_seq[t], p = m.h_tok_pos[t];
      const int start = m.h_start_pos[sq], q0 = m.h_q_start[sq], slot = m.h_slot[sq];
      rows.clear();  // as CpuBackend::sparse_attention: window rows, then the visible compressed rows
      const int lo = st.non_causal ? std::max<int>(0, start - int(kW)) : std::max<int>(0, p - int(kW) + 1);
      const int hi = st.non_causal ? start + m.h_len[sq] - 1 : p;
      for (int j = lo; j <= hi; ++j)
        rows.push_back(j >= start ? kvw.data() + int64_t(q0 + j - start) * D
                                  : ringw.data() + (int64_t(slot) * kW + j % kW) * D);
      int n_cand = int(rows.size());
      if (st.ratio > 0) {
        const int n_vis = (p + 1) / st.ratio;
        auto add = [&](int r) {
          const int blk = m.h_block_table[size_t(sq) * m.max_blocks + r / st.rpb];
          rows.push_back(compw.data() + (int64_t(blk) * st.rpb + r % st.rpb) * D);
        };
        if (!K) {
          for (int r = 0; r < n_vis; ++r) add(r);
          n_cand += n_vis;
        } else {
          for (int64_t k = 0; k < K; ++k)
            if (st.idx[t * K + k] >= 0 && st.idx[t * K + k] < n_vis) add(st.idx[t * K + k]);
          n_cand += int(K);
        }
      }
      const size_t n = rows.size();
      const double C = std::ceil(double(n_cand) / R);
      sc.resize(n);
      ab.resize(n);
      w.resize(n);
      for (int64_t h = 0; h < H; ++h) {
        const float* qh = qw.data() + (t * H + h) * D;
        double mx = -INFINITY;
        for (size_t j = 0; j < n; ++j) {
          double dot = 0, a = 0;
          for (int64_t i = 0; i < D; ++i) {
            const double pr = double(qh[i]) * rows[j][i];
            dot += pr;
            a += std::fabs(pr);
          }
          sc[j] = dot * double(st.scale);
          ab[j] = a;
          mx = std::max(mx, sc[j]);
        }
        double eps = 0, eta = 0, den = 0;
        for (size_t j = 0; j < n; ++j) {
          eps = std::max(eps, double(st.scale) * 0x1p-15 * ab[j] + 0x1p-23 * std::fabs(sc[j]));
          w[j] = std::exp(sc[j] - mx);
          den += w[j];
        }
        for (size_t j = 0; j < n; ++j) eta = std::max(eta, 0x1p-22 + 0x1p-24 * (std::fabs(sc[j] - mx) + 2 * eps));
        eta *= eta_mult;
        den += std::exp(double(st.sink[size_t(h)]) - mx);
        for (size_t j = 0; j < n; ++j) w[j] /= den;
        const double E = std::exp(2 * (eps + eta));
        const double gamma = 0x1p-20 * (C * R / 16 + 1) + tile_u * C * 0x1p-24 + 0x1p-17 + combine_u * 0x1p-24;
        const double coef = (E - 1) + E * (1 + 0x1p-8) * (0x1p-8 + gamma);
        const double acc_coef = (E - 1) + E * gamma;  // the terms that are not the random P roundings
        for (int64_t cc = 0; cc < D; ++cc) {
          double A = 0, V = 0;
          for (size_t j = 0; j < n; ++j) {
            const double v = rows[j][cc];
            A += w[j] * std::fabs(v);
            V += w[j] * w[j] * v * v;
          }
          const size_t e = size_t((t * H + h) * D + cc);
          bound[e] = coef * A;
          sigma2[e] = 0x1p-16 / 3 * V + (acc_coef * A) * (acc_coef * A);  // s_c^2
        }
      }
    }
    size_t bad = 0, differ = 0;
    double max_abs = 0, worst = 0, num = 0, expect = 0, den = 0, bsum = 0, rabs = 0;
    ASSERT_EQ(got.size(), want.size());
    for (size_t e = 0; e < want.size(); ++e) {
      const double d = std::fabs(double(got[e]) - double(want[e]));
      const double ulp = ulp_bf16(std::max(std::fabs(got[e]), std::fabs(want[e])));
      differ += got[e] != want[e];
      if (!std::isfinite(got[e]) || !(d <= bound[e] + ulp)) ++bad;
      if (std::isfinite(got[e])) {
        max_abs = std::max(max_abs, d);
        worst = std::max(worst, d / (bound[e] + ulp));
        num += d * d;
      }
      expect += sigma2[e] + std::sqrt(sigma2[e]) * ulp;
      den += double(want[e]) * want[e];
      bsum += bound[e];
      rabs += std::fabs(double(want[e]));
    }
    std::printf("PARITY | %-22s | %-34s | max_abs %.3e | rel_l2 %.3e | err/bound max %.3f, L2 %.2f of its expectation, "
                "mean bound/|ref| %.1e, %zu of %zu differ | %s\n",
                ("attn " + impl).c_str(), st.what.c_str(), max_abs, std::sqrt(num / std::max(den, 1e-300)), worst,
                std::sqrt(num / std::max(expect, 1e-300)), bsum / std::max(rabs, 1e-300), differ, want.size(),
                bad == 0 && num <= 4 * expect ? "ok" : "FAIL");
    std::fflush(stdout);
    EXPECT_EQ(bad, 0u) << st.what << ": elements over the derived bound (or non-finite)";
    EXPECT_LE(num, 4 * expect) << st.what << ": squared error above 4x its expectation";
    // Bit-identical everywhere would mean the BF16 P rounding did not happen (the fp64 path ran).
    EXPECT_GT(differ, 0u) << st.what << ": bit-identical to the CPU: the tensor-core path did not run";
  }

  // want_impl: the implementation the plan must pick ("" when forced).
  void run(AttnCase c, uint32_t seed, FastAttn f = {}, const char* want_impl = "flash_bf16") {
    FastStep st = make_step(c, seed, f);
    std::string impl;
    const auto got = run_gpu(st, f.force, &impl);
    if (*f.force) EXPECT_EQ(impl, f.force);
    else EXPECT_EQ(impl, want_impl) << c.what;
    check(st, got, run_cpu(st), impl);
  }

  // A prefill chunk of T tokens of one sequence at start (ring slot 0 holds the window rows
  // before it): the GPU runs the whole chunk; the CPU specification and the bound run on
  // `sample` of its tokens, each as a one-token sequence whose ring holds the same window rows
  // (those of the chunk or of the ring), so every sampled token sees exactly the same rows.
  void run_prefill(const char* what, int start, int T, int ratio, bool with_idx, uint32_t seed,
                   const char* want_impl = "wgmma_bf16", const char* force = "") {
    const int64_t H = 64, D = 512, rpb = ratio ? 128 / ratio : 0;
    const int nb = ratio ? int(std::max<int64_t>(1, ((start + T) / ratio + rpb - 1) / rpb)) : 0;
    FastStep st;
    st.what = what;
    st.H = H;
    st.D = D;
    st.ratio = ratio;
    st.rpb = int(rpb);
    st.m = make_meta({{start, T, 0, ratio ? block_list(nb, 0, seed) : std::vector<int32_t>()}});
    st.n_slots = 1;
    st.n_blocks = std::max(nb, 1);
    st.q = rnd_bf16(size_t(T * H * D), seed + 1);
    st.kv = rnd_bf16(size_t(T * D), seed + 2);
    st.ring = rnd_bf16(size_t(kW * D), seed + 3);
    if (ratio) st.comp = rnd_bf16(size_t(st.n_blocks * rpb * D), seed + 4);
    st.sink = random_vec(size_t(H), seed + 5, 2.0f);
    if (with_idx) {
      st.K = kK;
      st.idx.assign(size_t(int64_t(T) * kK), -1);
      std::mt19937 rng(seed + 6);
      for (int t = 0; t < T; ++t) fill_picks(st.idx.data() + int64_t(t) * kK, (start + t + 1) / ratio, -1, rng);
    }
    st.scale = 1.0f / std::sqrt(float(D));
    std::string impl;
    const auto got_all = run_gpu(st, force, &impl);
    EXPECT_EQ(impl, *force ? force : want_impl) << what;

    std::vector<int> sample = {0, 1, 63, 64, 126, 127, 128, 129, T / 2, T - 2, T - 1};
    for (int t = 200; t < T; t += 397) sample.push_back(t);
    std::sort(sample.begin(), sample.end());
    sample.erase(std::unique(sample.begin(), sample.end()), sample.end());
    const int n = int(sample.size());
    FastStep sub;
    sub.what = std::string(what) + " (" + std::to_string(n) + " tokens checked)";
    sub.H = H;
    sub.D = D;
    sub.ratio = ratio;
    sub.rpb = int(rpb);
    sub.K = st.K;
    sub.scale = st.scale;
    sub.sink = st.sink;
    sub.comp = st.comp;
    sub.n_blocks = st.n_blocks;
    sub.n_slots = n;
    std::vector<SeqSpec> seqs;
    for (int i = 0; i < n; ++i) seqs.push_back({start + sample[size_t(i)], 1, i, st.m.h_block_table});
    sub.m = make_meta(seqs);
    sub.q.resize(size_t(n * H * D));
    sub.kv.resize(size_t(n * D));
    sub.ring.assign(size_t(n * kW * D), 0);
    if (st.K) sub.idx.resize(size_t(n * st.K));
    std::vector<float> got(size_t(n * H * D));
    for (int i = 0; i < n; ++i) {
      const int t = sample[size_t(i)], p = start + t;
      std::copy_n(st.q.begin() + int64_t(t) * H * D, H * D, sub.q.begin() + int64_t(i) * H * D);
      std::copy_n(st.kv.begin() + int64_t(t) * D, D, sub.kv.begin() + int64_t(i) * D);
      std::copy_n(got_all.begin() + int64_t(t) * H * D, H * D, got.begin() + int64_t(i) * H * D);
      if (st.K) std::copy_n(st.idx.begin() + int64_t(t) * st.K, st.K, sub.idx.begin() + int64_t(i) * st.K);
      for (int j = std::max(0, p - int(kW) + 1); j < p; ++j) {  // the window rows before p
        const uint16_t* src = j >= start ? st.kv.data() + int64_t(j - start) * D : st.ring.data() + int64_t(j % kW) * D;
        std::copy_n(src, D, sub.ring.begin() + (int64_t(i) * kW + j % kW) * D);
      }
    }
    check(sub, got, run_cpu(sub), impl);
  }

  // Packed KV rows (issue 28): rows [n, D] of bf16 packed in shape `s` (core/kv_packed.h) and
  // replaced by their dequantized values (exact in bf16), so a plain cache holds the same values.
  static std::vector<uint8_t> pack_rows(std::vector<uint16_t>& rows, int64_t D, const kvpack::RowShape& s) {
    const size_t rb = kvpack::row_bytes(s), n = rows.size() / size_t(D);
    std::vector<uint8_t> out(n * rb);
    std::vector<float> x(static_cast<size_t>(D));
    for (size_t r = 0; r < n; ++r) {
      for (int64_t d = 0; d < D; ++d) x[size_t(d)] = bf16_to_f32(rows[r * size_t(D) + size_t(d)]);
      kvpack::pack_row(s, x.data(), out.data() + r * rb);
      kvpack::unpack_row(s, out.data() + r * rb, x.data());
      for (int64_t d = 0; d < D; ++d) {
        const uint16_t b = f32_to_bf16(x[size_t(d)]);
        EXPECT_EQ(bf16_to_f32(b), x[size_t(d)]) << "a packed value is not exact in bf16";
        rows[r * size_t(D) + size_t(d)] = b;
      }
    }
    return out;
  }

  // The step on the packed cache (ring in `ring_s`, compressed rows in `comp_s`) against the
  // same step on a bf16 cache of the unpacked values: the kernels dequantize packed rows into
  // the same BF16 tile values, so the outputs must be equal bit for bit (not just within the
  // bound: same operands, same arithmetic). Also checks the packed ring writer: ring_write of the
  // unpacked rows stores their values (paged_write's packed kernel, which writes the compressed
  // rows and indexer keys, is covered in the model: test_model_cuda KvPackedCuda.*).
  void run_packed(AttnCase c, uint32_t seed, FastAttn f, const kvpack::RowShape& ring_s, const kvpack::RowShape& comp_s,
                  const char* want_impl) {
    FastStep st = make_step(c, seed, f);
    PackedCaches pc{ring_s, comp_s, pack_rows(st.ring, st.D, ring_s), {}};
    if (st.ratio) pc.comp = pack_rows(st.comp, st.D, comp_s);
    const std::vector<uint8_t>& ring_p = pc.ring;
    std::string impl;
    const auto plain = run_gpu(st, f.force, &impl);
    EXPECT_EQ(impl, *f.force ? f.force : want_impl) << c.what;
    std::string impl_packed;
    const auto packed = run_gpu(st, f.force, &impl_packed, &pc);
    EXPECT_EQ(impl_packed, impl) << c.what;
    const int64_t D = st.D, rrb = int64_t(kvpack::row_bytes(ring_s));
    ASSERT_EQ(packed.size(), plain.size());
    size_t differ = 0;
    for (size_t i = 0; i < plain.size(); ++i) differ += f32_to_bits(packed[i]) != f32_to_bits(plain[i]);
    std::printf("PARITY | %-22s | %-34s | packed vs bf16 rows: %zu of %zu differ | %s\n", ("attn " + impl).c_str(),
                c.what, differ, plain.size(), differ == 0 ? "ok" : "FAIL");
    EXPECT_EQ(differ, 0u) << c.what << ": packed rows give other outputs than their bf16 values";

    // The ring writer: slot 0's first n rows, written from bf16 rows of the unpacked values by
    // one sequence of n tokens at 0, hold the packed rows' values.
    const int n = int(std::min<int64_t>(kW, 64));
    std::vector<uint16_t> rows(st.ring.begin(), st.ring.begin() + int64_t(n) * D);  // slot 0 rows 0..n-1
    StepMeta wm = make_meta({{0, n, 0, {0}}});
    upload_meta(wm);
    Tensor ring_w = dev(std::vector<uint8_t>(size_t(kW * rrb), 0xAB), DType::U8, {1, kW, rrb});
    gpu->ring_write(devb(rows, {n, D}), ring_w, wm, ring_s);
    const auto got_ring = down<uint8_t>(ring_w);
    // Values, not bytes: a block whose amax lands on exactly half a power of two re-packs with
    // the next smaller scale and twice the codes (same values).
    size_t wrong = 0;
    std::vector<float> a(static_cast<size_t>(D)), b(static_cast<size_t>(D));
    for (int r = 0; r < n; ++r) {
      kvpack::unpack_row(ring_s, ring_p.data() + int64_t(r) * rrb, a.data());
      kvpack::unpack_row(ring_s, got_ring.data() + int64_t(r) * rrb, b.data());
      for (int64_t d = 0; d < D; ++d) wrong += f32_to_bits(a[size_t(d)]) != f32_to_bits(b[size_t(d)]);
    }
    EXPECT_EQ(wrong, 0u) << c.what << ": ring_write's packed rows hold other values";
  }

  std::string forced_;  // the implementation gpu was made with ("" = the plan's)
};

TEST_F(CudaAttentionFast, TensorCoresAllKinds) {
  run({"csa m4 K512 T=19 (17@4000,1@7,1@0)", {{4000, 17, 0, {}}, {7, 1, 1, {}}, {0, 1, 2, {}}}, 4, true, 40}, 261);
  run({"hca m128 all rows T=18 (17@300,1@1M)", {{300, 17, 3, {}}, {1048575, 1, 1, {}}}, 128, false, 8200}, 262);
  run({"swa T=20 (17@0,3@126)", {{0, 17, 0, {}}, {126, 3, 2, {}}}, 0, false, 0}, 263);
  run({"v41 m2 K512 T=18 (17@2040,1@129)", {{2040, 17, 0, {}}, {129, 1, 3, {}}}, 2, true, 20}, 264);
  run({"T=1 decode csa m4 @5000", {{5000, 1, 1, {}}}, 4, true, 40}, 265);
}

TEST_F(CudaAttentionFast, NonCausalDraftBlocks) {
  // DSpark's draft blocks: one alone (decode-sized: the split path), three together.
  run({"non-causal T=5 (5@300)", {{300, 5, 0, {}}}, 0, false, 0, true}, 281);
  run({"non-causal T=15 (5@1,5@100,5@300)", {{1, 5, 0, {}}, {100, 5, 1, {}}, {300, 5, 2, {}}}, 0, false, 0, true}, 282);
}

TEST_F(CudaAttentionFast, PeakySoftmaxAndV41Heads) {
  // q 6x larger: scores spread over ~+-10, the running max moves often (rescales), few rows
  // carry the weight (the P rounding of the largest ones dominates).
  FastAttn peaky;
  peaky.q_amp = 6.0f;
  run({"peaky csa m4 K512 T=19", {{4000, 17, 0, {}}, {7, 1, 1, {}}, {0, 1, 2, {}}}, 4, true, 40}, 271, peaky);
  run({"peaky hca m128 T=18 (17@300,1@1M)", {{300, 17, 3, {}}, {1048575, 1, 1, {}}}, 128, false, 8200}, 272, peaky);
  FastAttn h32;  // 32 heads: mma_bf16, two CTAs per token along y
  h32.H = 32;
  run({"H32 v41 m2 K512 T=17@2040", {{2040, 17, 0, {}}}, 2, true, 20}, 273, h32, "mma_bf16");
  FastAttn h128;  // 128 heads: flash_bf16, two CTAs per token along y
  h128.H = 128;
  run({"H128 csa m4 K512 T=3 (2@4000,1@9)", {{4000, 2, 0, {}}, {9, 1, 1, {}}}, 4, true, 40}, 274, h128);
}

// Valid-row counts at the tile edges (1 / 127 / 128 / 129 rows; the window alone below 128
// positions), indexer selections that leave 0 or 1 compressed rows (every other tile and whole
// decode splits masked: only the sink and the window rows remain), decode tokens alone (the
// split path) and together with a chunk.
TEST_F(CudaAttentionFast, ValidRowEdges) {
  run({"swa 1/127/128 rows T=4 (1@0,1@126,1@127,1@900)", {{0, 1, 0, {}}, {126, 1, 1, {}}, {127, 1, 2, {}}, {900, 1, 3, {}}},
       0, false, 0},
      291);
  FastAttn none;
  none.idx_keep = 0;
  run({"csa K512 0 picks T=2 (1@5000,1@300)", {{5000, 1, 0, {}}, {300, 1, 1, {}}}, 4, true, 48}, 292, none);
  FastAttn one;
  one.idx_keep = 1;
  run({"csa K512 1 pick = 129 rows T=3", {{5000, 1, 0, {}}, {127, 1, 1, {}}, {3000, 1, 2, {}}}, 4, true, 80}, 293, one);
  FastAttn few;
  few.idx_keep = 7;
  run({"v41 m2 K512 7 picks T=18 (17@2040,1@6)", {{2040, 17, 0, {}}, {6, 1, 1, {}}}, 2, true, 20}, 294, few);
  run({"hca m128 all rows T=1 @131071 (1152 rows)", {{131071, 1, 0, {}}}, 128, false, 1030}, 295);
  run({"csa m4 all rows T=1 @520 (258 rows)", {{519, 1, 0, {}}}, 4, false, 8}, 296);
}

// Prefill chunks of 4,096 tokens at the V4-Flash / V4.1-Flash shapes (64 heads x 512, window
// 128): CSA (128 window + 512 picks), HCA (128 window + ~1,024 rows), SWA, V4.1 ratio 2 (512
// picks); the chunk starts past the window so its first tokens read the ring.
TEST_F(CudaAttentionFast, Prefill4096) {
  run_prefill("prefill csa m4 K512 T=4096@8192", 8192, 4096, 4, true, 301);
  run_prefill("prefill hca m128 T=4096@129024", 129024, 4096, 128, false, 302);
  run_prefill("prefill swa T=4096@1000", 1000, 4096, 0, false, 303);
  run_prefill("prefill v41 m2 K512 T=4096@8192", 8192, 4096, 2, true, 304);
}

// wgmma_bf16 forced below 128 tokens (the plan's choice from 128) on the shapes and edges above:
// chunks and decode tokens (the split path; packed rows dequantized in registers), HCA's long row
// lists, V4.1, 0 / 1 picks, the tile edges, 128 heads; and flash_bf16 at a prefill size.
TEST_F(CudaAttentionFast, WgmmaAllKinds) {
  FastAttn wg;
  wg.force = "wgmma_bf16";
  run({"wgmma csa m4 K512 T=19", {{4000, 17, 0, {}}, {7, 1, 1, {}}, {0, 1, 2, {}}}, 4, true, 40}, 331, wg);
  run({"wgmma hca m128 T=18 (17@300,1@1M)", {{300, 17, 3, {}}, {1048575, 1, 1, {}}}, 128, false, 8200}, 332, wg);
  run({"wgmma swa T=20 (17@0,3@126)", {{0, 17, 0, {}}, {126, 3, 2, {}}}, 0, false, 0}, 333, wg);
  run({"wgmma v41 m2 K512 T=18", {{2040, 17, 0, {}}, {129, 1, 3, {}}}, 2, true, 20}, 334, wg);
  run({"wgmma T=1 decode csa m4 @5000", {{5000, 1, 1, {}}}, 4, true, 40}, 335, wg);
  run({"wgmma non-causal T=5 (5@300)", {{300, 5, 0, {}}}, 0, false, 0, true}, 336, wg);
  run({"wgmma swa 1/127/128 rows T=4", {{0, 1, 0, {}}, {126, 1, 1, {}}, {127, 1, 2, {}}, {900, 1, 3, {}}}, 0, false, 0},
      337, wg);
  FastAttn none = wg;
  none.idx_keep = 0;
  run({"wgmma csa K512 0 picks T=2", {{5000, 1, 0, {}}, {300, 1, 1, {}}}, 4, true, 48}, 338, none);
  FastAttn one = wg;
  one.idx_keep = 1;
  run({"wgmma csa K512 1 pick = 129 rows T=3", {{5000, 1, 0, {}}, {127, 1, 1, {}}, {3000, 1, 2, {}}}, 4, true, 80}, 339,
      one);
  FastAttn peaky = wg;
  peaky.q_amp = 6.0f;
  run({"wgmma peaky csa m4 K512 T=19", {{4000, 17, 0, {}}, {7, 1, 1, {}}, {0, 1, 2, {}}}, 4, true, 40}, 340, peaky);
  FastAttn h128 = wg;
  h128.H = 128;
  run({"wgmma H128 csa m4 K512 T=3", {{4000, 2, 0, {}}, {9, 1, 1, {}}}, 4, true, 40}, 341, h128);
  run({"wgmma hca m128 all rows T=1 @131071", {{131071, 1, 0, {}}}, 128, false, 1030}, 342, wg);
  // A decode step whose short token leaves most of its splits without tiles (empty CTAs).
  run({"wgmma decode mixed T=2 (1@5000,1@3)", {{5000, 1, 0, {}}, {3, 1, 1, {}}}, 4, true, 48}, 346, wg);
  // flash_bf16 forced at a prefill size (the plan takes wgmma_bf16 there).
  run_prefill("flash prefill csa m4 K512 T=4096@8192", 8192, 4096, 4, true, 345, "", "flash_bf16");
}

// The previous kernels on the same cases: mma_bf16 (16 heads per CTA) and fp64 forced.
TEST_F(CudaAttentionFast, OtherImplementations) {
  FastAttn mma;
  mma.force = "mma_bf16";
  run({"mma_bf16 csa m4 K512 T=19", {{4000, 17, 0, {}}, {7, 1, 1, {}}, {0, 1, 2, {}}}, 4, true, 40}, 311, mma);
  run({"mma_bf16 swa T=20 (17@0,3@126)", {{0, 17, 0, {}}, {126, 3, 2, {}}}, 0, false, 0}, 312, mma);
  FastAttn small;  // v4-tiny heads: 4 x 128, no tensor-core kernel (head dim 512 only)
  small.H = 4;
  small.D = 128;
  run({"fp64 4x128 csa m4 K512 T=19", {{4000, 17, 0, {}}, {7, 1, 1, {}}, {0, 1, 2, {}}}, 4, true, 40}, 281, small, "fp64");
  run({"fp64 4x128 swa T=20", {{0, 17, 0, {}}, {126, 3, 2, {}}}, 0, false, 0}, 282, small, "fp64");
  FastAttn forced;
  forced.force = "fp64";
  run({"fp64 forced 64x512 hca m128 T=18", {{300, 17, 3, {}}, {1048575, 1, 1, {}}}, 128, false, 8200}, 283, forced);
  run({"fp64 forced 64x512 v41 m2 T=18", {{2040, 17, 0, {}}, {129, 1, 3, {}}}, 2, true, 20}, 284, forced);
}

// Packed KV rows (issue 28, fast numerics' cache): every fast implementation reads the official
// formats (V4 584 B rows for the window and compressed rows; V4.1 FP8 window rows and FP4 main
// KV) to the same outputs as bf16 rows of the same values.
TEST_F(CudaAttentionFast, PackedRowsEqualBf16Rows) {
  const kvpack::RowShape v4{kvpack::Format::V4Row, 512, 64}, v41_swa{kvpack::Format::Fp8B32, 512, 0},
      v41_kv{kvpack::Format::Fp4E4m3B16, 512, 0};
  FastAttn flash;
  run_packed({"packed csa m4 K512 T=19", {{4000, 17, 0, {}}, {7, 1, 1, {}}, {0, 1, 2, {}}}, 4, true, 40}, 321, flash, v4,
             v4, "flash_bf16");
  run_packed({"packed hca m128 T=18", {{300, 17, 3, {}}, {1048575, 1, 1, {}}}, 128, false, 8200}, 322, flash, v4, v4,
             "flash_bf16");
  run_packed({"packed decode csa T=1 @5000", {{5000, 1, 1, {}}}, 4, true, 40}, 323, flash, v4, v4, "flash_bf16");
  run_packed({"packed v41 m2 K512 T=18", {{2040, 17, 0, {}}, {129, 1, 3, {}}}, 2, true, 20}, 324, flash, v41_swa, v41_kv,
             "flash_bf16");
  FastAttn wg;
  wg.force = "wgmma_bf16";
  run_packed({"packed wgmma csa m4 K512 T=19", {{4000, 17, 0, {}}, {7, 1, 1, {}}, {0, 1, 2, {}}}, 4, true, 40}, 329, wg,
             v4, v4, "");
  run_packed({"packed wgmma hca m128 T=18", {{300, 17, 3, {}}, {1048575, 1, 1, {}}}, 128, false, 8200}, 343, wg, v4, v4,
             "");
  run_packed({"packed wgmma decode csa T=1 @5000", {{5000, 1, 1, {}}}, 4, true, 40}, 344, wg, v4, v4, "");
  // HCA (every visible row, no indexer) with the step reading its rows often enough to pool them.
  run_packed({"packed wgmma hca m128 pooled T=64@4000", {{4000, 64, 0, {}}}, 128, false, 40}, 347, wg, v4, v4, "");
  run_packed({"packed wgmma v41 m2 T=18", {{2040, 17, 0, {}}, {129, 1, 3, {}}}, 2, true, 20}, 330, wg, v41_swa, v41_kv,
             "");
  FastAttn mma;
  mma.force = "mma_bf16";
  run_packed({"packed mma csa m4 K512 T=19", {{4000, 17, 0, {}}, {7, 1, 1, {}}, {0, 1, 2, {}}}, 4, true, 40}, 325, mma,
             v4, v4, "");
  run_packed({"packed mma v41 m2 T=18", {{2040, 17, 0, {}}, {129, 1, 3, {}}}, 2, true, 20}, 326, mma, v41_swa, v41_kv, "");
  FastAttn small;  // v4-tiny shapes: 4 x 128 heads, fp64
  small.H = 4;
  small.D = 128;
  const kvpack::RowShape t4{kvpack::Format::V4Row, 128, 64}, t41_swa{kvpack::Format::Fp8B32, 128, 0},
      t41_kv{kvpack::Format::Fp4E4m3B16, 128, 0};
  run_packed({"packed fp64 4x128 csa T=19", {{4000, 17, 0, {}}, {7, 1, 1, {}}, {0, 1, 2, {}}}, 4, true, 40}, 327, small, t4,
             t4, "fp64");
  run_packed({"packed fp64 4x128 v41 m2 T=18", {{2040, 17, 0, {}}, {129, 1, 3, {}}}, 2, true, 20}, 328, small, t41_swa,
             t41_kv, "fp64");
}

}  // namespace
}  // namespace dil::test
