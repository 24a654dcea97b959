// The cache ops of the CPU backend on packed rows (backend.h AttnArgs: U8 caches with a
// kvpack::RowShape) against the same ops on plain f32 caches holding the dequantized rows.
// Writers quantize each row once (kvpack::pack_row); readers dequantize on load, so a packed
// cache must read back exactly the values of a plain cache of QDQ'd rows, and attention and the
// indexer must compute the same bits from it (no tolerance: the values are equal, and the ops'
// arithmetic does not depend on the storage).
#include <gtest/gtest.h>

#include "core/kv_packed.h"
#include "kernels/cpu/cpu_backend.h"
#include "test_util.h"

namespace dil {
namespace {

using kvpack::Format;
using kvpack::RowShape;
using test::view;

Tensor bytes_view(std::vector<uint8_t>& v, std::initializer_list<int64_t> dims) {
  return Tensor(v.data(), DType::U8, dims);
}

// Row-wise unpack(pack(x)): the values a packed cache holds for rows x [R, s.d].
std::vector<float> qdq_rows(const RowShape& s, const std::vector<float>& x) {
  const size_t R = x.size() / size_t(s.d);
  std::vector<uint8_t> row(kvpack::row_bytes(s));
  std::vector<float> y(x.size());
  for (size_t r = 0; r < R; ++r) {
    kvpack::pack_row(s, x.data() + r * size_t(s.d), row.data());
    kvpack::unpack_row(s, row.data(), y.data() + r * size_t(s.d));
  }
  return y;
}

// Every row of a packed cache [R, row_bytes] dequantized.
std::vector<float> unpack_all(const RowShape& s, const std::vector<uint8_t>& b) {
  const size_t nb = kvpack::row_bytes(s), R = b.size() / nb;
  std::vector<float> y(R * size_t(s.d));
  for (size_t r = 0; r < R; ++r) kvpack::unpack_row(s, b.data() + r * nb, y.data() + r * size_t(s.d));
  return y;
}

// V4 rows (448 e4m3 + 64 bf16 at d 512; here 64 + 64 at d 128) and V4.1's two row formats:
// ring and paged writes land the same values as plain writes of the QDQ'd rows, and attention
// over the packed ring and compressed rows returns the plain caches' output bit for bit.
TEST(KvPackedOps, WritesAndAttentionEqualPlainCachesOfQdqRows) {
  const RowShape shapes[][2] = {{{Format::V4Row, 128, 64}, {Format::V4Row, 128, 64}},
                                {{Format::Fp8B32, 128, 0}, {Format::Fp4E4m3B16, 128, 0}}};
  for (const auto& sh : shapes) {
    const RowShape& swa = sh[0];
    const RowShape& glob = sh[1];
    CpuBackend be;
    const int d = 128, H = 2, W = 4, rpb = 2, T0 = 6, T1 = 2;
    const size_t rs = kvpack::row_bytes(swa), rg = kvpack::row_bytes(glob);
    // Step 0: one sequence at positions 0..5 (slot 1 of 2; blocks [2, 0]) writes its window
    // rows and compressed rows 0..2 (ratio 2).
    StepMeta m0 = test::make_meta({{0, T0, 1, {2, 0}}});
    std::vector<float> kv0 = test::random_vec(T0 * d, 41, 3.0f), rows = test::random_vec(3 * d, 42, 2.0f);
    std::vector<float> ring(2 * W * d, 0.0f), comp(3 * rpb * d, 0.0f);
    std::vector<uint8_t> pring(2 * W * rs, 0), pcomp(3 * rpb * rg, 0);
    std::vector<float> kv0q = qdq_rows(swa, kv0), rowsq = qdq_rows(glob, rows);
    be.ring_write(view(kv0q, {T0, d}), view(ring, {2, W, d}), m0);
    be.ring_write(view(kv0, {T0, d}), bytes_view(pring, {2, W, int64_t(rs)}), m0, swa);  // quantized by the write
    EmitPlan plan;
    plan.n = 3;
    plan.h_seq = {0, 0, 0};
    plan.h_row = {0, 1, 2};
    plan.h_pos = {0, 2, 4};
    be.paged_write(view(rowsq, {3, d}), view(comp, {3, rpb, d}), rpb, plan, m0);
    be.paged_write(view(rows, {3, d}), bytes_view(pcomp, {3, rpb, int64_t(rg)}), rpb, plan, m0, glob);
    EXPECT_TRUE(test::same_bits(unpack_all(swa, pring), ring));
    EXPECT_TRUE(test::same_bits(unpack_all(glob, pcomp), comp));

    // Step 1: positions 6, 7 attend to the ring (3..5) and compressed rows 0..2 (all, then a
    // top-k list).
    StepMeta m1 = test::make_meta({{T0, T1, 1, {2, 0}}});
    std::vector<float> q = test::random_vec(T1 * H * d, 43, 2.0f), sink = {0.4f, -0.9f};
    std::vector<float> kv1 = qdq_rows(swa, test::random_vec(T1 * d, 44, 3.0f));
    std::vector<int32_t> cidx = {2, -1, 0, /**/ 1, 3, 0};  // [T1, 3]
    for (bool use_idx : {false, true}) {
      std::vector<float> out_plain(T1 * H * d), out_packed(T1 * H * d, 7.0f);
      for (bool packed : {false, true}) {
        AttnArgs a;
        a.q = view(q, {T1, H, d});
        a.kv_new = view(kv1, {T1, d});
        a.ring = packed ? bytes_view(pring, {2, W, int64_t(rs)}) : view(ring, {2, W, d});
        a.comp = packed ? bytes_view(pcomp, {3, rpb, int64_t(rg)}) : view(comp, {3, rpb, d});
        if (packed) {
          a.ring_pack = swa;
          a.comp_pack = glob;
        }
        a.comp_ratio = 2;
        a.rows_per_block = rpb;
        if (use_idx) a.comp_idx = view(cidx, {T1, 3});
        a.sink = view(sink, {H});
        a.scale = 0.09f;
        a.window = W;
        a.out = view(packed ? out_packed : out_plain, {T1, H, d});
        be.sparse_attention(a, m1);
      }
      EXPECT_TRUE(test::same_bits(out_packed, out_plain)) << "format " << int(swa.format) << " idx " << use_idx;
    }
  }
}

// Indexer keys in FP4 with ue8m0 scales per 32 (68 B at 128 dims): the scores and the top-k
// from the packed keys equal those from plain keys holding the FP4-QDQ'd values, in the exact
// (reference) and the fast scoring.
TEST(KvPackedOps, IndexerOnPackedKeysEqualsPlainQdqKeys) {
  const RowShape ks{Format::Fp4B32, 128, 0};
  const int di = 128, Hi = 4, rpb = 4, nblk = 3, T = 2, topk = 5;
  const size_t rb = kvpack::row_bytes(ks);
  std::vector<float> keys = test::random_vec(nblk * rpb * di, 51, 2.0f);
  std::vector<uint8_t> pkeys(nblk * rpb * rb);
  for (int r = 0; r < nblk * rpb; ++r) kvpack::pack_row(ks, keys.data() + r * di, pkeys.data() + r * rb);
  const std::vector<float> keysq = qdq_rows(ks, keys);
  // Two tokens at positions 40, 47 (ratio 4: 10 and 12 visible rows) of one sequence, blocks [1, 2, 0].
  StepMeta m = test::make_meta({{40, 1, 0, {1, 2, 0}}, {47, 1, 0, {1, 2, 0}}});
  std::vector<float> q = test::random_vec(T * Hi * di, 52), w = test::random_vec(T * Hi, 53);
  for (Numerics n : {Numerics::Reference, Numerics::Fast}) {
    CpuBackend be;
    be.set_numerics(n);
    std::vector<int32_t> idx_plain(T * topk), idx_packed(T * topk, 99);
    std::vector<float> sc_plain(T * 12, -5.0f), sc_packed(T * 12, -5.0f);
    for (bool packed : {false, true}) {
      IndexerArgs a;
      a.q = view(q, {T, Hi, di});
      a.w = view(w, {T, Hi});
      std::vector<float> kq = keysq;
      a.keys = packed ? bytes_view(pkeys, {nblk, rpb, int64_t(rb)}) : view(kq, {nblk, rpb, di});
      if (packed) a.keys_pack = ks;
      a.ratio = 4;
      a.rows_per_block = rpb;
      a.topk = topk;
      a.out_idx = view(packed ? idx_packed : idx_plain, {T, topk});
      a.scores_out = view(packed ? sc_packed : sc_plain, {T, 12});
      be.indexer_topk(a, m);
    }
    EXPECT_EQ(idx_packed, idx_plain) << numerics_name(n);
    EXPECT_TRUE(test::same_bits(sc_packed, sc_plain)) << numerics_name(n);
  }
}

// A packed cache of the wrong row size is a broken invariant: it aborts naming the op.
TEST(KvPackedOps, WrongRowBytesAreRejected) {
  CpuBackend be;
  const RowShape swa{Format::V4Row, 128, 64};
  std::vector<float> kv = test::random_vec(2 * 128, 61);
  std::vector<uint8_t> ring(2 * 4 * 100);
  StepMeta m = test::make_meta({{0, 2, 0, {}}});
  EXPECT_DEATH(be.ring_write(view(kv, {2, 128}), bytes_view(ring, {2, 4, 100}), m, swa),
               "ring_write ring: expected packed rows U8 \\[n, rows, 200\\]");
}

}  // namespace
}  // namespace dil
