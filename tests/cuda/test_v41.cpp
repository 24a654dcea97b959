// Parity of the V4.1-only ops: the indexer's two-level candidate selection (candidate source
// cand_out, Reindex restriction cand_in; exact indices), MoE routing of image-span tokens
// with bias_vl (exact indices) and the Engram gate/update (within one f32 ulp: the gate's
// exp on the device may differ from the host libm's by an ulp of double).
#include <algorithm>

#include "parity.h"

namespace dil::test {
namespace {

struct CandCase {
  const char* what;
  std::vector<SeqSpec> seqs;
  int cand_block, cand_topk, topk;
  int dup;  // > 0: key rows repeat with this period (exact row and block score ties)
};

class CudaV41Indexer : public CudaParity {
 protected:
  // Candidate-source call (cand_out + its own unrestricted top-k), then a Reindex call with
  // other queries restricted to the CPU's candidates; every index compared.
  // fp4: official-numerics inputs (FP4-QDQ'd per 32, fp4_blocks set: the tensor-core path).
  // bf16 (with fp4): fast numerics, q, w and keys bf16 tensors on both sides (the fast plan:
  // mma_fp8 against the CPU fast specification, exact; test_indexer_fast.cpp derives why).
  void run(CandCase c, uint32_t seed, bool fp4 = false, bool bf16 = false) {
    const int Hi = 32, di = 128, ratio = 4, rpb = 128 / ratio;  // V4.1-Flash index heads
    int base = 0;
    for (auto& s : c.seqs) {
      int rows = (s.start_pos + s.len) / ratio;
      int nb = std::max(1, (rows + rpb - 1) / rpb);
      s.blocks = block_list(nb, base, seed + base);
      base += nb;
    }
    StepMeta m = make_meta(c.seqs);
    const int64_t T = m.n_tokens, NB = base, CT = c.cand_topk, K = c.topk;
    auto keys = random_vec(size_t(NB * rpb * di), seed + 3);
    if (fp4) fp4_blocks_inplace(*cpu, keys, seed + 5);  // before the copies: duplicates stay equal
    if (c.dup) {
      for (int64_t r = 0; r < NB * rpb; ++r) std::copy_n(keys.begin() + (r % c.dup) * di, di, keys.begin() + r * di);
    }
    StepMeta gm = m;
    upload_meta(gm);
    std::vector<uint16_t> kb = bf16_of(keys);
    Tensor gkeys = bf16 ? devb(kb, {NB, rpb, di}) : devf(keys, {NB, rpb, di});
    std::vector<int32_t> cand(size_t(T * CT));
    for (int layer = 0; layer < 2; ++layer) {  // 0: candidate source, 1: Reindex
      auto q = random_vec(size_t(T * Hi * di), seed + 10 * layer + 1), w = random_vec(size_t(T * Hi), seed + 10 * layer + 2);
      if (fp4) fp4_blocks_inplace(*cpu, q, seed + 10 * layer + 4);
      std::vector<int32_t> ref(size_t(T * K));
      std::vector<uint16_t> qb = bf16_of(q), wb = bf16_of(w);
      IndexerArgs ha;
      ha.q = bf16 ? bview(qb, {T, Hi, di}) : view(q, {T, Hi, di});
      ha.w = bf16 ? bview(wb, {T, Hi}) : view(w, {T, Hi});
      ha.keys = bf16 ? bview(kb, {NB, rpb, di}) : view(keys, {NB, rpb, di});
      ha.ratio = ratio;
      ha.rows_per_block = rpb;
      ha.topk = int(K);
      ha.sort_ascending = true;
      // The plan picks the path.
      gpu->set_numerics(bf16 ? Numerics::Fast : fp4 ? Numerics::Official : Numerics::Reference);
      cpu->set_numerics(bf16 ? Numerics::Fast : Numerics::Reference);
      ha.cand_block = c.cand_block;
      ha.cand_topk = c.cand_topk;
      if (layer == 0) ha.cand_out = view(cand, {T, CT});
      if (layer == 1) ha.cand_in = view(cand, {T, CT});
      ha.out_idx = view(ref, {T, K});
      cpu->indexer_topk(ha, m);
      IndexerArgs ga = ha;
      ga.q = bf16 ? devb(qb, {T, Hi, di}) : devf(q, {T, Hi, di});
      ga.w = bf16 ? devb(wb, {T, Hi}) : devf(w, {T, Hi});
      ga.keys = gkeys;
      if (layer == 0) ga.cand_out = poisoned(DType::I32, {T, CT});
      if (layer == 1) ga.cand_in = devi(cand, {T, CT});
      ga.out_idx = poisoned(DType::I32, {T, K});
      gpu->indexer_topk(ga, gm);
      std::string what = std::string(layer == 0 ? "source " : "reindex ") + (fp4 ? "fp4 " : "") + (bf16 ? "bf16 " : "") +
                         c.what;
      if (layer == 0) compare_exact_i32("indexer cand_out", what, down<int32_t>(ga.cand_out), cand);
      compare_exact_i32("indexer_topk cand", what, down<int32_t>(ga.out_idx), ref);
    }
  }
};

TEST_F(CudaV41Indexer, FlashShapesSixtyFourKRows) {
  // 65535 rows (8192 blocks, 2048 kept), 17 tokens with fewer rows than candidates, 1 token
  // with no visible row, 1 token with 2 rows (one partial block).
  run({"64K rows + T=17@3000 + T=1@0,@10", {{262140, 1, 0, {}}, {3000, 17, 1, {}}, {0, 1, 2, {}}, {10, 1, 3, {}}},
       8, 2048, 512, 0},
      501);
}

TEST_F(CudaV41Indexer, BlockBoundaries) {
  // Visible rows 16382..16386 cross 2048 blocks x 8 rows (= cand_topk * cand_block), and
  // a block boundary of the newest (always kept) block; T=17 at 255..271 crosses 64 rows.
  run({"T=17 across 16384 rows, T=17@255", {{65527, 17, 0, {}}, {255, 17, 1, {}}}, 8, 2048, 512, 0}, 511);
}

TEST_F(CudaV41Indexer, FewerSelectableRowsThanTopk) {
  // 3 candidate blocks of 8 rows (<= 24 selectable rows) for a top-32: -1 padded, and the
  // excluded rows must never be picked.
  run({"cand 3x8 topk 32, T=17@400 + T=1@40", {{400, 17, 0, {}}, {40, 1, 1, {}}}, 8, 3, 32, 0}, 521);
}

TEST_F(CudaV41Indexer, ExactTiesGoToLowestBlockAndRow) {
  // 7 distinct keys: every block holds the same maximum, so all block scores tie.
  run({"ties: 7 keys, 20000 rows T=3", {{80000, 3, 0, {}}}, 8, 2048, 512, 7}, 531);
  run({"ties: 5 keys, cand 4x8 topk 16 T=2", {{999, 2, 0, {}}}, 8, 4, 16, 5}, 532);
}

TEST_F(CudaV41Indexer, Fp4TensorCores) {
  run({"64K rows + T=17@3000 + T=1@0,@10", {{262140, 1, 0, {}}, {3000, 17, 1, {}}, {0, 1, 2, {}}, {10, 1, 3, {}}},
       8, 2048, 512, 0},
      541, true);
  run({"ties: 7 keys, 20000 rows T=3", {{80000, 3, 0, {}}}, 8, 2048, 512, 7}, 542, true);
}

TEST_F(CudaV41Indexer, Bf16TensorCores) {
  run({"64K rows + T=17@3000 + T=1@0,@10", {{262140, 1, 0, {}}, {3000, 17, 1, {}}, {0, 1, 2, {}}, {10, 1, 3, {}}},
       8, 2048, 512, 0},
      543, true, true);
  run({"T=17 across 16384 rows, T=17@255", {{65527, 17, 0, {}}, {255, 17, 1, {}}}, 8, 2048, 512, 0}, 544, true, true);
  run({"ties: 5 keys, cand 4x8 topk 16 T=2", {{999, 2, 0, {}}}, 8, 4, 16, 5}, 545, true, true);
}

TEST_F(CudaParity, MoeRouteImageSpan) {
  struct Case {
    const char* what;
    int64_t T, E;
    int k;
  };
  for (Case c : {Case{"v41 E384 top6 T=17 mixed", 17, 384, 6}, Case{"v41 E384 top6 T=1 image", 1, 384, 6}}) {
    auto logits = random_vec(size_t(c.T * c.E), 601, 3.0f), bias = random_vec(size_t(c.E), 602, 0.5f);
    auto bias_vl = random_vec(size_t(c.E), 603, 2.0f);  // large enough to change the selection
    auto mask = rnd_int(size_t(c.T), 604, 0, 2);  // 0: text, 1 and 2: image span
    if (c.T == 1) mask[0] = 1;
    std::vector<float> w(size_t(c.T * c.k));
    std::vector<int32_t> idx(size_t(c.T * c.k));
    MoeRouteArgs ha;
    ha.logits = view(logits, {c.T, c.E});
    ha.bias = view(bias, {c.E});
    ha.bias_vl = view(bias_vl, {c.E});
    ha.image_mask = view(mask, {c.T});
    ha.topk = c.k;
    ha.norm_eps = 1e-20f;
    ha.out_w = view(w, {c.T, c.k});
    ha.out_idx = view(idx, {c.T, c.k});
    cpu->moe_route(ha);
    MoeRouteArgs ga = ha;
    ga.logits = devf(logits, {c.T, c.E});
    ga.bias = devf(bias, {c.E});
    ga.bias_vl = devf(bias_vl, {c.E});
    ga.image_mask = devi(mask, {c.T});
    ga.out_w = poisoned(DType::F32, {c.T, c.k});
    ga.out_idx = poisoned(DType::I32, {c.T, c.k});
    gpu->moe_route(ga);
    compare_exact_i32("moe_route vl idx", c.what, down<int32_t>(ga.out_idx), idx);
    compare("moe_route vl w", c.what, down<float>(ga.out_w), w, 1e-7, 3e-7);
  }
}

TEST_F(CudaParity, EngramMix) {
  struct Case {
    const char* what;
    int64_t T, n, D;
    bool mask;
  };
  for (Case c : {Case{"v41 T=17 n4 D5120 mask", 17, 4, 5120, true}, Case{"v41 T=1 n4 D5120", 1, 4, 5120, false},
                 Case{"T=3 n2 D7 mask", 3, 2, 7, true}}) {
    auto X = random_vec(size_t(c.T * c.n * c.D), 701, 2.0f), kv = random_vec(size_t(c.T * (c.n + 1) * c.D), 702);
    auto qk = random_vec(size_t(c.n * c.D), 703);
    auto mask = rnd_int(size_t(c.T), 704, 0, 1);
    std::vector<float> ref(X.size());
    Tensor hm = c.mask ? view(mask, {c.T}) : Tensor();
    cpu->engram_mix(view(X, {c.T, c.n, c.D}), view(kv, {c.T, (c.n + 1) * c.D}), view(qk, {c.n, c.D}),
                    hm, 1e-6f, view(ref, {c.T, c.n, c.D}));
    Tensor out = poisoned(DType::F32, {c.T, c.n, c.D});
    Tensor gmask = c.mask ? devi(mask, {c.T}) : Tensor();
    gpu->engram_mix(devf(X, {c.T, c.n, c.D}), devf(kv, {c.T, (c.n + 1) * c.D}), devf(qk, {c.n, c.D}), gmask, 1e-6f,
                    out);
    // One f32 ulp (2^-23 relative) of the largest output, at most.
    compare("engram_mix", c.what, down<float>(out), ref, 1.2e-7, 1.2e-7);
  }
}

// Fast numerics: the streams X, the Engram rows kv and the output bf16 (qk f32): the f32 bound
// plus one bf16 ulp; also in place (out = X), and bf16 streams with f32 rows.
TEST_F(CudaParity, EngramMixBf16) {
  struct Case {
    const char* what;
    int64_t T, n, D;
    bool mask;
    bool kv_bf16;
  };
  for (Case c : {Case{"bf16 v41 T=17 n4 D5120 mask", 17, 4, 5120, true, true},
                 Case{"bf16 v41 T=1 n4 D5120", 1, 4, 5120, false, true},
                 Case{"bf16 X, f32 kv T=3 n2 D7 mask", 3, 2, 7, true, false}}) {
    auto X = bf16_of(random_vec(size_t(c.T * c.n * c.D), 711, 2.0f));
    auto kvf = random_vec(size_t(c.T * (c.n + 1) * c.D), 712);
    auto kvb = bf16_of(kvf);
    auto qk = random_vec(size_t(c.n * c.D), 713);
    auto mask = rnd_int(size_t(c.T), 714, 0, 1);
    std::vector<uint16_t> ref(X.size());
    Tensor hm = c.mask ? view(mask, {c.T}) : Tensor();
    Tensor hkv = c.kv_bf16 ? bview(kvb, {c.T, (c.n + 1) * c.D}) : view(kvf, {c.T, (c.n + 1) * c.D});
    cpu->engram_mix(bview(X, {c.T, c.n, c.D}), hkv, view(qk, {c.n, c.D}), hm, 1e-6f, bview(ref, {c.T, c.n, c.D}));
    Tensor gmask = c.mask ? devi(mask, {c.T}) : Tensor();
    Tensor gkv = c.kv_bf16 ? devb(kvb, {c.T, (c.n + 1) * c.D}) : devf(kvf, {c.T, (c.n + 1) * c.D});
    Tensor out = poisoned(DType::BF16, {c.T, c.n, c.D});
    Tensor gX = devb(X, {c.T, c.n, c.D});
    gpu->engram_mix(gX, gkv, devf(qk, {c.n, c.D}), gmask, 1e-6f, out);
    compare_bf16("engram_mix", c.what, downb(out), widen(ref), 1.2e-7, 1.2e-7);
    gpu->engram_mix(gX, gkv, devf(qk, {c.n, c.D}), gmask, 1e-6f, gX);
    compare_bf16("engram_mix in place", c.what, downb(gX), widen(ref), 1.2e-7, 1.2e-7);
  }
}

}  // namespace
}  // namespace dil::test
