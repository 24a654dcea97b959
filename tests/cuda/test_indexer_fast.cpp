// The fast-numerics lightning indexer on CUDA (wgmma_fp8 / mma_fp8: FP8 tensor cores; fast_simt: CUDA
// cores) against the CPU's fast specification (src/kernels/cpu/indexer.cpp fast_score), and
// the few-pass radix top-k (topk_rows.cu) against a host stable sort.
//
// Tolerance: none, scores bit for bit and indices exactly. Derivation: the specification fixes
// every f32 operation and its order (block sums B_b, d = ((B_0 + B_1) + B_2) + B_3, term = w *
// relu(d), the head sum in the MMA fragment's order), leaving one quantity to the hardware: each
// 32-dim block sum B_b. On FP4-QDQ'd rows that convert exactly to e4m3 under the row's
// power-of-two scale (block exponents within 14 binades), every product of two e4m3 values is
// exact in f32 (4 x 4 significant bits), and the 32 products of one block are integer multiples
// of g = 2^(eq + ek - 2) with |sum| <= 32 * 144 g < 2^13 g, so any summation order - and any
// accumulator of >= 13 significant bits, which the tensor core's is - gives B_b exactly; the
// per-row scales are powers of two applied to w and to the final score, which changes no
// rounding in the normal range (|S| <= 60 enforced). Rows that do not convert exactly are
// recomputed by the specification on CUDA cores (double block sums in the CPU's order, the same
// f32 steps), and fast_simt is that code for every row. So the GPU must equal the CPU exactly,
// and with equal scores the exact top-k (ties to the lowest row) must select the same rows:
// no boundary gap needs a bound. Each case prints how many key rows and q heads fell outside
// e4m3 (the spread-4 inputs: none or few; spread 8 and raw bf16: many, exercising the rescoring).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "kernels/cuda/topk_rows.h"
#include "parity.h"

namespace dil::test {
namespace {

// Whether a 128-value row converts exactly to e4m3 under the kernel's scale (indexer_fp8.cu
// row_e4m3: S = exponent of max|x| minus 8, |S| <= 60).
bool fits_e4m3(const float* x, int n) {
  float m = 0.f;
  for (int i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  if (m == 0.f) return true;
  int e;
  std::frexp(m, &e);  // m = f 2^e, f in [0.5, 1): floor(log2 m) = e - 1
  const int S = e - 1 - 8;
  if (S < -60 || S > 60 || m < 0x1p-126f) return false;
  for (int i = 0; i < n; ++i) {
    const float y = std::ldexp(x[i], -S);
    if (round_e4m3(y) != y) return false;
  }
  return true;
}
size_t count_misfits(const std::vector<float>& v, int di) {
  size_t n = 0;
  for (size_t r = 0; r + size_t(di) <= v.size(); r += size_t(di)) n += !fits_e4m3(v.data() + r, di);
  return n;
}

struct FastCase {
  const char* what;
  std::vector<SeqSpec> seqs;
  int Hi, ratio, topk;
  bool ascending;
  int spread;        // FP4 block-scale spread 2^[-spread, spread]; 0: raw bf16 values (not FP4-QDQ'd)
  int dup;           // > 0: key rows repeat with this period (exact ties)
  const char* impl;  // the implementation the plan must pick (or forced when not the default)
  bool packed = false;  // keys stored packed on the GPU (Fp4B32, 68 B rows: fast numerics' cache)
};

class CudaIndexerFast : public CudaParity {
 protected:
  std::string forced_;  // the implementation force() installed for the whole test
  // A fresh backend forcing `impl` at every row count: only before the test allocated anything.
  void force(const std::string& impl) {
    ASSERT_TRUE(bufs.empty()) << "a forced implementation must be the test's first run";
    BackendOptions o = test_options();
    o.force["indexer_topk"] = impl;
    gpu = make_backend(BackendKind::CUDA, 0, o);
    forced_ = impl;
  }
  // Fast numerics on both sides, and `impl` for `site` at T tokens: the plan's own choice, or forced.
  void use_impl(const std::string& impl, const OpSite& site, int64_t T) {
    gpu->set_numerics(Numerics::Fast);
    cpu->set_numerics(Numerics::Fast);
    if (!forced_.empty() || test_options().force.count("indexer_topk")) return;
    if (gpu->impl_for(site, T).name != impl) {
      force(impl);
      gpu->set_numerics(Numerics::Fast);
    }
  }

  void run(FastCase c, uint32_t seed) {
    int64_t n_tok = 0;
    for (const auto& sq : c.seqs) n_tok += sq.len;
    use_impl(c.impl, indexer_site(c.Hi, 128, c.topk, 0, 0, 0, DType::BF16, Numerics::Fast), n_tok);
    const int di = 128, rpb = 128 / c.ratio;
    int base = 0;
    for (auto& s : c.seqs) {
      const int rows = (s.start_pos + s.len) / c.ratio;
      const int nb = std::max(1, (rows + rpb - 1) / rpb);
      s.blocks = block_list(nb, base, seed + base);
      base += nb;
    }
    StepMeta m = make_meta(c.seqs);
    const int64_t T = m.n_tokens, NB = base;
    auto q = random_vec(size_t(T * c.Hi * di), seed + 1), w = random_vec(size_t(T * c.Hi), seed + 2);
    auto keys = random_vec(size_t(NB * rpb * di), seed + 3);
    if (c.spread > 0) {
      fp4_blocks_inplace(*cpu, q, seed + 4, c.spread);
      fp4_blocks_inplace(*cpu, keys, seed + 5, c.spread);
    }
    if (c.dup) {
      for (int64_t r = 0; r < NB * rpb; ++r) std::copy_n(keys.begin() + (r % c.dup) * di, di, keys.begin() + r * di);
    }
    std::vector<uint16_t> qb = bf16_of(q), wb = bf16_of(w), kb = bf16_of(keys);
    // Packed keys: the official rows of the keys, and the plain keys replaced by their values.
    const kvpack::RowShape kps{kvpack::Format::Fp4B32, di, 0};
    const size_t krb = kvpack::row_bytes(kps);
    std::vector<uint8_t> kpk;
    if (c.packed) {
      kpk.resize(size_t(NB * rpb) * krb);
      std::vector<float> x(static_cast<size_t>(di));
      for (int64_t r = 0; r < NB * rpb; ++r) {
        for (int i = 0; i < di; ++i) x[size_t(i)] = bf16_to_f32(kb[size_t(r * di + i)]);
        kvpack::pack_row(kps, x.data(), kpk.data() + size_t(r) * krb);
        kvpack::unpack_row(kps, kpk.data() + size_t(r) * krb, x.data());
        for (int i = 0; i < di; ++i) kb[size_t(r * di + i)] = f32_to_bf16(x[size_t(i)]);  // exact: FP4 x 2^k
      }
    }
    const std::vector<float> qw = widen(qb), kw = widen(kb);  // the values the kernels see
    int n_max = 1;
    for (int32_t p : m.h_tok_pos) n_max = std::max(n_max, (p + 1) / c.ratio);
    std::printf("INFO   | indexer fast %-34s | e4m3 misfits: %zu of %lld key rows, %zu of %lld q heads\n", c.what,
                count_misfits(kw, di), (long long)(NB * rpb), count_misfits(qw, di), (long long)(T * c.Hi));

    std::vector<int32_t> ref(size_t(T * c.topk));
    std::vector<float> ref_sc(size_t(T * n_max), NAN);
    IndexerArgs ha;
    ha.q = bview(qb, {T, c.Hi, di});
    ha.w = bview(wb, {T, c.Hi});
    ha.keys = bview(kb, {NB, rpb, di});
    ha.ratio = c.ratio;
    ha.rows_per_block = rpb;
    ha.topk = c.topk;
    ha.sort_ascending = c.ascending;
    ha.out_idx = view(ref, {T, c.topk});
    ha.scores_out = view(ref_sc, {T, n_max});
    cpu->indexer_topk(ha, m);

    StepMeta gm = m;
    upload_meta(gm);
    IndexerArgs ga = ha;
    ga.q = devb(qb, {T, c.Hi, di});
    ga.w = devb(wb, {T, c.Hi});
    ga.keys = devb(kb, {NB, rpb, di});
    if (c.packed) {
      ga.keys = dev(kpk, DType::U8, {NB, rpb, int64_t(krb)});
      ga.keys_pack = kps;
    }
    ga.out_idx = poisoned(DType::I32, {T, c.topk});
    ga.scores_out = poisoned(DType::F32, {T, n_max});
    gpu->indexer_topk(ga, gm);
    EXPECT_EQ(gpu->impl_for(indexer_site(c.Hi, di, c.topk, 0, 0, 0, DType::BF16, Numerics::Fast), T).name,
              std::string(c.impl))
        << c.what;
    // Scores of the visible rows, bit for bit.
    const std::vector<float> got_sc = down<float>(ga.scores_out);
    std::vector<float> g, r;
    for (int64_t t = 0; t < T; ++t)
      for (int j = 0; j < (m.h_tok_pos[size_t(t)] + 1) / c.ratio; ++j) {
        g.push_back(got_sc[size_t(t * n_max + j)]);
        r.push_back(ref_sc[size_t(t * n_max + j)]);
      }
    compare(std::string("idx fast scores ") + c.impl, c.what, g, r, 0, 0);
    compare_exact_i32(std::string("idx fast topk ") + c.impl, c.what, down<int32_t>(ga.out_idx), ref);
  }
};

TEST_F(CudaIndexerFast, V4DecodeSixtyFourKRows) {
  // One query per sequence (the decode variant: a CTA's warps split the token's key tiles).
  run({"v4 Hi64 T=1@262139,@3000,@10,@0", {{262139, 1, 0, {}}, {3000, 1, 1, {}}, {10, 1, 2, {}}, {0, 1, 3, {}}}, 64,
       4, 512, false, 4, 0, "mma_fp8"},
      601);
}

TEST_F(CudaIndexerFast, V4PrefillChunks) {
  // 8-token groups inside one sequence, a group ending at a sequence boundary, T = 17 and 1.
  run({"v4 Hi64 T=300@20000 + T=17@3000 + T=1@77", {{20000, 300, 0, {}}, {3000, 17, 1, {}}, {77, 1, 2, {}}}, 64, 4,
       512, false, 4, 0, "wgmma_fp8"},
      602);
}

TEST_F(CudaIndexerFast, ManyTokensSmallRows) {
  // 4096 tokens from position 0: most rows have fewer visible rows than k (all selected).
  run({"v4 Hi16 T=4096@0", {{0, 4096, 0, {}}}, 16, 4, 512, false, 4, 0, "wgmma_fp8"}, 603);
}

// mma_fp8 at the sizes where the plan prefers wgmma_fp8 (forced): 8-token groups, sequence
// boundaries, many tokens.
TEST_F(CudaIndexerFast, MmaFp8ManyTokens) {
  force("mma_fp8");
  run({"mma v4 Hi64 T=300@20000 + T=17@3000 + T=1@77", {{20000, 300, 0, {}}, {3000, 17, 1, {}}, {77, 1, 2, {}}}, 64,
       4, 512, false, 4, 0, "mma_fp8"},
      641);
  run({"mma v4 Hi16 T=4096@0", {{0, 4096, 0, {}}}, 16, 4, 512, false, 4, 0, "mma_fp8"}, 642);
  run({"mma packed v4 Hi64 T=300@20000 + T=1@77", {{20000, 300, 0, {}}, {77, 1, 1, {}}}, 64, 4, 512, false, 4, 0,
       "mma_fp8", true},
      643);
}

// wgmma_fp8 at every shape class, forced below its 128-token regime too: groups of one token
// (decode), groups cut by sequence ends, more rows than one CTA's range (8,192), rescored rows
// (spread 8, raw bf16) and tokens, exact ties, 16 / 32 / 64 heads, ratio 2; bf16 and packed keys.
TEST_F(CudaIndexerFast, WgmmaFp8) {
  force("wgmma_fp8");
  run({"wg decode Hi64 T=1@262139,@3000,@10,@0", {{262139, 1, 0, {}}, {3000, 1, 1, {}}, {10, 1, 2, {}}, {0, 1, 3, {}}},
       64, 4, 512, false, 4, 0, "wgmma_fp8"},
      631);
  run({"wg v41 Hi32 m2 ascending T=17@5000 + T=1@1 + T=40@33000", {{5000, 17, 0, {}}, {1, 1, 1, {}}, {33000, 40, 2, {}}},
       32, 2, 512, true, 4, 0, "wgmma_fp8"},
      632);
  run({"wg spread 8 Hi64 T=17@3000", {{3000, 17, 0, {}}}, 64, 4, 512, false, 8, 0, "wgmma_fp8"}, 633);
  run({"wg raw bf16 Hi16 T=35@2000", {{2000, 35, 0, {}}}, 16, 4, 512, false, 0, 0, "wgmma_fp8"}, 634);
  run({"wg ties Hi16: 7 distinct keys, T=3@2000", {{2000, 3, 0, {}}}, 16, 4, 512, false, 4, 7, "wgmma_fp8"}, 635);
  run({"wg ties ascending Hi32, T=2@999", {{999, 2, 0, {}}}, 32, 4, 512, true, 4, 5, "wgmma_fp8"}, 636);
}

TEST_F(CudaIndexerFast, WgmmaFp8Packed) {
  force("wgmma_fp8");
  run({"wg packed decode Hi64 T=1@262139,@10", {{262139, 1, 0, {}}, {10, 1, 1, {}}}, 64, 4, 512, false, 4, 0,
       "wgmma_fp8", true},
      651);
  run({"wg packed spread 8 Hi64 T=17@3000", {{3000, 17, 0, {}}}, 64, 4, 512, false, 8, 0, "wgmma_fp8", true}, 652);
  run({"wg packed v41 Hi32 m2 ascending T=17@5000", {{5000, 17, 0, {}}, {40000, 23, 1, {}}}, 32, 2, 512, true, 4, 0,
       "wgmma_fp8", true},
      653);
  run({"wg packed Hi16 T=70@9000", {{9000, 70, 0, {}}}, 16, 4, 512, false, 4, 0, "wgmma_fp8", true}, 654);
}

TEST_F(CudaIndexerFast, V41AscendingRatio2) {
  run({"v41 Hi32 m2 ascending T=17@5000 + T=1@1", {{5000, 17, 0, {}}, {1, 1, 1, {}}}, 32, 2, 512, true, 4, 0,
       "mma_fp8"},
      604);
}

TEST_F(CudaIndexerFast, RowsOutsideE4m3AreRescored) {
  // Block scales over 2^[-8, 8]: many rows span more than 14 binades; raw bf16 values are not
  // e4m3 at all. Both must still equal the specification exactly.
  run({"spread 8 Hi64 T=17@3000", {{3000, 17, 0, {}}}, 64, 4, 512, false, 8, 0, "mma_fp8"}, 605);
  run({"raw bf16 Hi16 T=3@2000", {{2000, 3, 0, {}}}, 16, 4, 512, false, 0, 0, "mma_fp8"}, 606);
}

TEST_F(CudaIndexerFast, ExactTiesGoToLowestRow) {
  run({"ties Hi16: 7 distinct keys, T=3@2000", {{2000, 3, 0, {}}}, 16, 4, 512, false, 4, 7, "mma_fp8"}, 607);
  run({"ties ascending Hi32, T=2@999", {{999, 2, 0, {}}}, 32, 4, 512, true, 4, 5, "mma_fp8"}, 608);
}

TEST_F(CudaIndexerFast, FastSimt) {
  run({"simt Hi64 T=40@100 + T=17@3000", {{100, 40, 0, {}}, {3000, 17, 1, {}}}, 64, 4, 512, false, 4, 0, "fast_simt"},
      609);
  // No tensor-core shape (24 heads): the plan picks fast_simt; the spec pads the last tile.
  run({"Hi24 T=5@700", {{700, 5, 0, {}}}, 24, 4, 64, false, 4, 0, "fast_simt"}, 610);
}

// Packed keys (issue 28): the official FP4 rows read by both fast implementations give the
// specification's scores and indices exactly, as the bf16 rows of the same values do.
TEST_F(CudaIndexerFast, PackedKeys) {
  run({"packed v4 Hi64 T=300@20000 + T=1@77", {{20000, 300, 0, {}}, {77, 1, 1, {}}}, 64, 4, 512, false, 4, 0,
       "wgmma_fp8", true},
      611);
  run({"packed decode Hi64 T=1@262139,@10", {{262139, 1, 0, {}}, {10, 1, 1, {}}}, 64, 4, 512, false, 4, 0, "mma_fp8",
       true},
      612);
  run({"packed spread 8 Hi64 T=17@3000", {{3000, 17, 0, {}}}, 64, 4, 512, false, 8, 0, "mma_fp8", true}, 613);
  run({"packed v41 Hi32 m2 ascending T=17@5000", {{5000, 17, 0, {}}}, 32, 2, 512, true, 4, 0, "mma_fp8", true}, 614);
  run({"packed simt Hi24 T=5@700", {{700, 5, 0, {}}}, 24, 4, 64, false, 4, 0, "fast_simt", true}, 615);
}

// V4.1: the candidate source (cand_out + its own top-k, scores compared) and a Reindex call
// restricted to the CPU's candidates (compact candidate scores on the device).
struct CandCase {
  const char* what;
  std::vector<SeqSpec> seqs;
  int cand_block, cand_topk, topk;
  int dup;
};

class CudaIndexerFastV41 : public CudaIndexerFast {
 protected:
  // impl: the source layer's implementation (the Reindex layer runs the plan's choice for it).
  void run_cand(CandCase c, uint32_t seed, const char* impl = "mma_fp8") {
    int64_t n_tok = 0;
    for (const auto& sq : c.seqs) n_tok += sq.len;
    use_impl(impl, indexer_site(32, 128, c.topk, 1, c.cand_block, c.cand_topk, DType::BF16, Numerics::Fast), n_tok);
    const int Hi = 32, di = 128, ratio = 4, rpb = 128 / ratio;
    int base = 0;
    for (auto& s : c.seqs) {
      const int rows = (s.start_pos + s.len) / ratio;
      const int nb = std::max(1, (rows + rpb - 1) / rpb);
      s.blocks = block_list(nb, base, seed + base);
      base += nb;
    }
    StepMeta m = make_meta(c.seqs);
    const int64_t T = m.n_tokens, NB = base, CT = c.cand_topk, K = c.topk;
    auto keys = random_vec(size_t(NB * rpb * di), seed + 3);
    fp4_blocks_inplace(*cpu, keys, seed + 5, 4);
    if (c.dup) {
      for (int64_t r = 0; r < NB * rpb; ++r) std::copy_n(keys.begin() + (r % c.dup) * di, di, keys.begin() + r * di);
    }
    std::vector<uint16_t> kb = bf16_of(keys);
    StepMeta gm = m;
    upload_meta(gm);
    Tensor gkeys = devb(kb, {NB, rpb, di});
    int n_max = 1;
    for (int32_t p : m.h_tok_pos) n_max = std::max(n_max, (p + 1) / ratio);
    std::vector<int32_t> cand(size_t(T * CT));
    for (int layer = 0; layer < 2; ++layer) {  // 0: candidate source, 1: Reindex
      auto q = random_vec(size_t(T * Hi * di), seed + 10 * layer + 1);
      auto w = random_vec(size_t(T * Hi), seed + 10 * layer + 2);
      fp4_blocks_inplace(*cpu, q, seed + 10 * layer + 4, 4);
      std::vector<uint16_t> qb = bf16_of(q), wb = bf16_of(w);
      std::vector<int32_t> ref(size_t(T * K));
      std::vector<float> ref_sc(size_t(T * n_max), NAN);
      IndexerArgs ha;
      ha.q = bview(qb, {T, Hi, di});
      ha.w = bview(wb, {T, Hi});
      ha.keys = bview(kb, {NB, rpb, di});
      ha.ratio = ratio;
      ha.rows_per_block = rpb;
      ha.topk = int(K);
      ha.sort_ascending = true;
      ha.cand_block = c.cand_block;
      ha.cand_topk = c.cand_topk;
      if (layer == 0) {
        ha.cand_out = view(cand, {T, CT});
        ha.scores_out = view(ref_sc, {T, n_max});
      } else {
        ha.cand_in = view(cand, {T, CT});
      }
      ha.out_idx = view(ref, {T, K});
      cpu->indexer_topk(ha, m);
      IndexerArgs ga = ha;
      ga.q = devb(qb, {T, Hi, di});
      ga.w = devb(wb, {T, Hi});
      ga.keys = gkeys;
      if (layer == 0) {
        ga.cand_out = poisoned(DType::I32, {T, CT});
        ga.scores_out = poisoned(DType::F32, {T, n_max});
      } else {
        ga.cand_in = devi(cand, {T, CT});
      }
      ga.out_idx = poisoned(DType::I32, {T, K});
      gpu->indexer_topk(ga, gm);
      const std::string what = std::string(layer == 0 ? "source " : "reindex ") + c.what;
      if (layer == 0) {
        compare_exact_i32("idx fast cand_out", what, down<int32_t>(ga.cand_out), cand);
        const std::vector<float> got_sc = down<float>(ga.scores_out);
        std::vector<float> g, r;
        for (int64_t t = 0; t < T; ++t)
          for (int j = 0; j < (m.h_tok_pos[size_t(t)] + 1) / ratio; ++j) {
            g.push_back(got_sc[size_t(t * n_max + j)]);
            r.push_back(ref_sc[size_t(t * n_max + j)]);
          }
        compare(std::string("idx fast scores ") + impl, what, g, r, 0, 0);
      }
      compare_exact_i32(std::string("idx fast topk cand ") + impl, what, down<int32_t>(ga.out_idx), ref);
    }
  }
};

TEST_F(CudaIndexerFastV41, FlashShapes) {
  // 65535 rows (8192 blocks, 2048 kept), 17 tokens with fewer rows than candidates, a token with
  // no visible row, one with 2 rows.
  run_cand({"64K rows + T=17@3000 + T=1@0,@10", {{262140, 1, 0, {}}, {3000, 17, 1, {}}, {0, 1, 2, {}}, {10, 1, 3, {}}},
            8, 2048, 512, 0},
           621);
  // Visible rows across 2048 blocks x 8 rows; the newest (always kept) block's boundary.
  run_cand({"T=17 across 16384 rows, T=17@255", {{65527, 17, 0, {}}, {255, 17, 1, {}}}, 8, 2048, 512, 0}, 622);
}

TEST_F(CudaIndexerFastV41, FewCandidatesAndTies) {
  run_cand({"3 blocks x 8 for top-32, T=5@2000", {{2000, 5, 0, {}}}, 8, 3, 32, 0}, 623);
  run_cand({"ties: 9 distinct keys, T=4@4000", {{4000, 4, 0, {}}}, 8, 64, 128, 9}, 624);
}

// From 128 tokens the candidate source runs wgmma_fp8, its Reindex layer mma_fp8.
TEST_F(CudaIndexerFastV41, WgmmaSourceManyTokens) {
  run_cand({"T=130@20000 + T=1@5", {{20000, 130, 0, {}}, {5, 1, 1, {}}}, 8, 512, 512, 0}, 626, "wgmma_fp8");
}

TEST_F(CudaIndexerFastV41, FastSimt) {
  run_cand({"simt T=17@3000", {{3000, 17, 0, {}}}, 8, 256, 512, 0}, 625, "fast_simt");
}

// ---- topk_rows alone ----

struct TopkCase {
  const char* what;
  int Q, n, ld_pad, k;
  bool ascending;
  int dist;  // 0 uniform, 1 narrow (one fp16 bucket), 2 all equal, 3 integers 0..99, 4 signed zeros and
             // negatives, 5 every third NaN, 6 the sampled lines' first float4s large (the sampled
             // fast path keeps fewer than k and falls back), 7 sampled lines small (it keeps too many)
};

class CudaTopkRows : public CudaParity {
 protected:
  void run(TopkCase c, uint32_t seed) {
    const int64_t ld = c.n + c.ld_pad;
    std::vector<float> x(size_t(c.Q * ld), 0.f);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (int q = 0; q < c.Q; ++q)
      for (int j = 0; j < c.n; ++j) {
        float v = u(rng);
        switch (c.dist) {
          case 1: v = 1.0f + std::ldexp(float(rng() % 4096), -23); break;  // 1 + [0, 2^-11): one bucket
          case 2: v = 0.5f; break;
          case 3: v = float(rng() % 100); break;
          case 4: v = (rng() % 3 == 0) ? ((rng() & 1) ? 0.f : -0.f) : -std::fabs(v); break;
          case 5: v = (j % 3 == 0) ? v : NAN; break;
          case 6: v = (j % 32 < 4 && j < 32 * 40) ? 5.f + v : v; break;
          case 7: v = (j % 32 < 4) ? v - 4.f : v; break;
          default: break;
        }
        x[size_t(q * ld + j)] = v;
      }
    // Host reference: stable order on (score desc, row asc), NaN excluded, -0 == +0.
    std::vector<int32_t> ref(size_t(c.Q * c.k), -1);
    for (int q = 0; q < c.Q; ++q) {
      const float* s = x.data() + q * ld;
      std::vector<int32_t> idx;
      for (int j = 0; j < c.n; ++j)
        if (!std::isnan(s[j])) idx.push_back(j);
      const int kk = std::min<int>(c.k, int(idx.size()));
      std::partial_sort(idx.begin(), idx.begin() + kk, idx.end(),
                        [&](int32_t a, int32_t b) { return s[a] != s[b] ? s[a] > s[b] : a < b; });
      if (c.ascending) std::sort(idx.begin(), idx.begin() + kk);
      std::copy_n(idx.begin(), kk, ref.begin() + q * c.k);
    }
    Tensor dx = devf(x, {int64_t(c.Q), ld});
    Tensor out = poisoned(DType::I32, {int64_t(c.Q), int64_t(c.k)});
    cuda::TopkRows p;
    p.scores = dx.ptr<float>();
    p.ld = ld;
    p.n_queries = c.Q;
    p.n_fixed = c.n;
    p.k = c.k;
    p.ascending = c.ascending;
    p.out = out.ptr<int32_t>();
    cuda::topk_rows(p, gpu->native_stream());
    gpu->synchronize();
    compare_exact_i32("topk_rows", c.what, down<int32_t>(out), ref);
  }
};

TEST_F(CudaTopkRows, AgainstStableSort) {
  run({"uniform 3 x 100000 k512", 3, 100000, 0, 512, false, 0}, 701);
  run({"uniform ascending ld+3 (unaligned) 3 x 70001 k2048", 3, 70001, 3, 2048, true, 0}, 702);
  run({"narrow: one bucket, 2 x 50000 k512", 2, 50000, 0, 512, false, 1}, 703);
  run({"all equal 2 x 40000 k512", 2, 40000, 0, 512, false, 2}, 704);
  run({"integers 0..99, 2 x 65536 k512", 2, 65536, 0, 512, false, 3}, 705);
  run({"signed zeros, negatives 3 x 3000 k2048", 3, 3000, 0, 2048, false, 4}, 706);
  run({"NaN = not selectable, 3 x 1200 k512", 3, 1200, 0, 512, true, 5}, 707);
  run({"n < k: 2 x 100 k512", 2, 100, 0, 512, false, 0}, 708);
  run({"n = 0: 2 x 0 k16", 2, 0, 4, 16, false, 0}, 709);
  run({"k = 1, 4 x 262144", 4, 262144, 0, 1, false, 0}, 710);
  // topk_rows' sampled fast path (rows >= 32 k): exact also when its sample misleads it.
  run({"sample above the rest: 2 x 32768 k512", 2, 32768, 0, 512, false, 6}, 711);
  run({"sample below the rest: 2 x 32768 k512", 2, 32768, 0, 512, true, 7}, 712);
  run({"fast path, unaligned rows fall back: 2 x 40000 ld+1 k512", 2, 40000, 1, 512, false, 0}, 713);
}

// ---- benchmarks (scripts/gpu-check runs the DISABLED_ tests) ----

class CudaIndexerFastBench : public CudaParity {
 protected:
  // Median of `reps` timings by events on `be`'s stream (the fixture's backend by default).
  double time_ms(const std::function<void()>& fn, int reps = 10, Backend* be = nullptr) {
    Backend& b = be ? *be : *gpu;
    fn();
    fn();
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) {
      const int e0 = b.record_event();
      fn();
      const int e1 = b.record_event();
      ms.push_back(b.elapsed_ms(e0, e1));
    }
    b.clear_events();
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }
  void report(const std::string& op, const std::string& shape, double ms, double flops, double bytes,
              const std::string& note = "") {
    std::printf("BENCH | %-26s | %-34s | %9.3f ms | %8.2f TFLOP/s | %8.1f GB/s | %s\n", op.c_str(), shape.c_str(), ms,
                flops / ms * 1e-9, bytes / ms * 1e-6, note.c_str());
    std::fflush(stdout);
  }
  // topk_rows over [Q, n] uniform(-1, 1) scores (generated on the device), k = 512.
  double bench_topk(int64_t Q, int64_t n, const std::string& note) {
    Tensor x(nullptr, DType::F32, {Q, n}, Device::CUDA);
    bufs.push_back(gpu->alloc(x.nbytes()));
    x.data = bufs.back().data();
    Tensor out = poisoned(DType::I32, {Q, 512});
    cuda::fill_uniform_f32(x.ptr<float>(), Q * n, 7, gpu->native_stream());
    cuda::TopkRows p;
    p.scores = x.ptr<float>();
    p.ld = n;
    p.n_queries = Q;
    p.n_fixed = n;
    p.k = 512;
    p.out = out.ptr<int32_t>();
    const double ms = time_ms([&] { cuda::topk_rows(p, gpu->native_stream()); });
    report("topk_rows k512", std::to_string(Q) + " x " + std::to_string(n), ms, 0, 4.0 * Q * n, note);
    bufs.pop_back();
    bufs.pop_back();
    return ms;
  }
};

// Top-k alone at the shapes; bench/topk_peer.py times torch.topk on the same ones.
// Target: >= 5x torch.topk fp32 (1.63 / 3.06 / 11.8 ms on H200 when the issue was filed; the
// gpu-check table has the same run's torch figures): <= 0.33 / 0.61 / 2.36 ms.
TEST_F(CudaIndexerFastBench, DISABLED_TopkRows) {
  bench_topk(4096, 32768, "target <= 0.33 ms");
  bench_topk(4096, 65536, "target <= 0.61 ms");
  bench_topk(4096, 262144, "target <= 2.36 ms");
}

// The whole fast indexer op at the roadmap prefill shape (V4-Flash: 64 heads x 128, 4,096
// queries at the end of 131,072 tokens: ~32K compressed rows each), the V4.1 shapes (32
// heads; candidate source over 32K rows, Reindex over 2048 x 8 candidate rows) and decode
// (64 sequences x 1 query over 32K rows). The scoring alone is the op minus the top-k line.
TEST_F(CudaIndexerFastBench, DISABLED_IndexerFast) {
  gpu->set_numerics(Numerics::Fast);
  const int64_t di = 128, rpb = 32, ratio = 4, ctx = 131072, NB = ctx / ratio / rpb;
  auto keys = random_vec(size_t(NB * rpb * di), 971);
  fp4_blocks_inplace(*cpu, keys, 972, 4);
  std::vector<uint16_t> kb = bf16_of(keys);
  Tensor gkeys = devb(kb, {NB, rpb, di});
  const std::vector<int32_t> blocks = block_list(int(NB), 0, 973);
  for (int64_t Hi : {64, 32}) {
    for (int mode = 0; mode < 3; ++mode) {  // 0 prefill, 1 decode, 2 Reindex prefill (V4.1)
      if (mode == 2 && Hi != 32) continue;
      const int64_t T = mode == 1 ? 64 : 4096;
      std::vector<SeqSpec> seqs;
      if (mode == 1) {
        for (int s = 0; s < 64; ++s) seqs.push_back({int(ctx) - 1, 1, s, blocks});  // shared blocks
      } else {
        seqs.push_back({int(ctx - T), int(T), 0, blocks});
      }
      StepMeta m = make_meta(seqs);
      upload_meta(m);
      auto q = random_vec(size_t(T * Hi * di), 974 + int(Hi));
      fp4_blocks_inplace(*cpu, q, 975, 4);
      auto w = random_vec(size_t(T * Hi), 976);
      std::vector<uint16_t> qb = bf16_of(q), wb = bf16_of(w);
      std::printf("INFO   | indexer fast bench Hi%lld T=%lld: e4m3 misfits %zu of %lld key rows, %zu of %lld q heads\n",
                  (long long)Hi, (long long)T, count_misfits(keys, int(di)), (long long)(NB * rpb),
                  count_misfits(q, int(di)), (long long)(T * Hi));
      IndexerArgs a;
      a.q = devb(qb, {T, Hi, di});
      a.w = devb(wb, {T, Hi});
      a.keys = gkeys;
      a.ratio = int(ratio);
      a.rows_per_block = int(rpb);
      a.topk = 512;
      a.sort_ascending = Hi == 32;
      a.out_idx = poisoned(DType::I32, {T, 512});
      double rows = 0;
      for (int32_t p : m.h_tok_pos) rows += double((p + 1) / ratio);
      std::vector<int32_t> cand;
      if (mode == 2) {  // every other block of 8 rows, from a token-dependent offset
        a.cand_block = 8;
        a.cand_topk = 2048;
        cand.resize(size_t(T * 2048));
        for (int64_t t = 0; t < T; ++t)
          for (int j = 0; j < 2048; ++j) cand[size_t(t * 2048 + j)] = int32_t(2 * j + (t & 1));
        a.cand_in = devi(cand, {T, 2048});
        rows = double(T) * 2048 * 8;
      }
      const std::string shape = std::string(mode == 0 ? "prefill" : mode == 1 ? "decode" : "reindex") + " Hi" +
                                std::to_string(Hi) + " T=" + std::to_string(T) + " rows~" +
                                std::to_string(int64_t(rows / double(T)));
      const OpSite site = indexer_site(int(Hi), int(di), 512, mode == 2 ? 2 : 0, a.cand_block, a.cand_topk,
                                       DType::BF16, Numerics::Fast);
      const std::string chosen = gpu->impl_for(site, T).name;
      const double ms = time_ms([&] { gpu->indexer_topk(a, m); }, 5);
      report("indexer_topk fast (op)", shape, ms, 2.0 * rows * double(Hi * di), 0, chosen);
      // The same-run baseline: the other tensor-core scorer where the plan's choice is wgmma_fp8,
      // on a second backend over the same device tensors.
      if (chosen == "wgmma_fp8") {
        BackendOptions o = test_options();
        o.force["indexer_topk"] = "mma_fp8";
        auto alt = make_backend(BackendKind::CUDA, 0, o);
        alt->set_numerics(Numerics::Fast);
        const double ms_alt = time_ms([&] { alt->indexer_topk(a, m); }, 5, alt.get());
        report("indexer_topk fast (op)", shape, ms_alt, 2.0 * rows * double(Hi * di), 0, "mma_fp8 (same run)");
      }
      if (mode != 1) bench_topk(T, int64_t(rows / double(T)), "top-k share of the line above");
    }
  }
}

}  // namespace
}  // namespace dil::test
