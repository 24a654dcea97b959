// KV byte accounting (model/kv_layout.h) against the model's own cache and the published figures.
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "model/kv_layout.h"
#include "model/model.h"

namespace dil {
namespace {

const std::string kRoot = DIL_SOURCE_DIR;

// The f32 layout is what the V4 CPU model allocates: both must agree byte for byte.
TEST(KvLayout, F32MatchesTheV4ModelsCacheSpec) {
  auto be = make_backend(BackendKind::CPU);
  ModelOptions mo;
  mo.numerics = Numerics::Reference;
  auto model = load_model(kRoot + "/tests/data/v4-tiny", *be, mo);
  for (int bt : {128, 256, 512}) {
    const CacheSpec want = model->cache_spec(bt);
    const KvLayout got = kv_layout(model->config(), bt, KvFormat::F32);
    EXPECT_EQ(got.spec.bytes_per_block, want.bytes_per_block) << bt;
    EXPECT_EQ(got.spec.bytes_per_slot, want.bytes_per_slot) << bt;
  }
}

TEST(KvLayout, F32MatchesTheV41ModelsCacheSpec) {
  auto be = make_backend(BackendKind::CPU);
  ModelOptions mo;
  mo.numerics = Numerics::Reference;
  auto model = load_model(kRoot + "/tests/data/v41-tiny", *be, mo);
  for (int bt : {128, 256}) {
    const CacheSpec want = model->cache_spec(bt);
    const KvLayout got = kv_layout(model->config(), bt, KvFormat::F32);
    EXPECT_EQ(got.spec.bytes_per_block, want.bytes_per_block) << bt;
    EXPECT_EQ(got.spec.bytes_per_slot, want.bytes_per_slot) << bt;
  }
}

// V4-Flash (model-spec §3.9, vLLM fp8_ds_mla): rows of 448 e4m3 + 64 bf16 + 7 ue8m0 + 1 pad =
// 584 B; indexer keys 64 B e2m1 + 4 ue8m0 = 68 B. 21 CSA layers (ratio 4: row + key per 4
// tokens), 20 HCA layers (ratio 128: row per 128 tokens), 43 + 1 MTP window rings of 128 rows,
// fp32 compressor state [8, 2*512] / [8, 2*128] (CSA) and [128, 512] (HCA), kv + score.
TEST(KvLayout, V4FlashOfficialBytes) {
  const ModelConfig cfg = load_config(kRoot + "/configs/deepseek-v4-flash.json");
  const KvLayout k = kv_layout(cfg, 128, KvFormat::Official);
  EXPECT_DOUBLE_EQ(k.global_bytes_per_token, 21 * (584.0 + 68.0) / 4 + 20 * 584.0 / 128);
  EXPECT_EQ(k.swa_bytes_per_slot, size_t(44) * 128 * 584);
  EXPECT_EQ(k.compressor_bytes_per_slot, size_t(21) * (2 * 8 * 1024 * 4 + 2 * 8 * 256 * 4) + size_t(20) * 2 * 128 * 512 * 4);
  EXPECT_EQ(k.spec.bytes_per_block, size_t(128) * 3514 + 32);  // 3514.25 B/token
}

// V4.1-Flash (model-spec §1.1, §4.9), built from the spec table: global KV on the KV-source
// layers 2, 8, 14 (ratio 2) and 20 (ratio 1), 288 B FP4 rows + 68 B indexer keys each:
// (3/2 + 1) * 356 = 890 B/token, the paper's figure.
TEST(KvLayout, V41FlashOfficialIs890BytesPerToken) {
  ModelConfig c;
  c.arch = Arch::V41;
  c.n_layers = 40;
  c.n_mtp = 3;
  c.head_dim = 512;
  c.rope_dims = 64;
  c.index_head_dim = 128;
  c.window = 128;
  c.compress_ratios = {0, 0};
  for (int i = 0; i < 18; ++i) c.compress_ratios.push_back(2);
  for (int i = 0; i < 20; ++i) c.compress_ratios.push_back(1);
  c.compress_ratios.insert(c.compress_ratios.end(), {0, 0, 0});
  c.kv_source_layers = {2, 8, 14, 20};
  c.index_source_layers = {2, 8, 14, 20, 24, 28, 32, 36};
  c.engram_layers = {1, 14};
  c.engram_max_ngram = 4;
  const KvLayout k = kv_layout(c, 128, KvFormat::Official);
  EXPECT_DOUBLE_EQ(k.global_bytes_per_token, 890.0);
  EXPECT_EQ(k.kv_layers, 4);
  EXPECT_EQ(k.swa_bytes_per_slot, size_t(43) * 128 * 528);     // 40 layers + 3 DSpark rings, 528 B rows
  EXPECT_EQ(k.compressor_bytes_per_slot, size_t(3) * 2 * 512 * 4);  // a, g of one pending token
  EXPECT_EQ(k.history_bytes_per_slot, 15u);                    // 3 token ids + 3 image flags
}

}  // namespace
}  // namespace dil
