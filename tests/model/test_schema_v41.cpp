// V4.1 tensor inventory (model-spec §2.3) against the v41-tiny checkpoint (exact: every name,
// dtype and shape, nothing extra) and sized for the released V4.1-Flash config.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "core/safetensors.h"
#include "model/config.h"
#include "model/schema.h"

using namespace dil;

TEST(SchemaV41, FixtureCheckpointMatchesExactly) {
  ModelConfig cfg = load_config("tests/data/v41-tiny/config.json");
  ASSERT_EQ(cfg.arch, Arch::V41);
  std::vector<TensorSpec> specs = expected_tensors(cfg);
  SafeTensors st = SafeTensors::open("tests/data/v41-tiny/model.safetensors");
  EXPECT_EQ(specs.size(), 657u);
  EXPECT_EQ(st.entries().size(), 657u);
  std::set<std::string> names;
  size_t bytes = 0;
  for (const TensorSpec& s : specs) {
    EXPECT_TRUE(names.insert(s.name).second) << "duplicate " << s.name;
    bytes += s.nbytes();
  }
  ValidationReport r = validate_checkpoint(st, specs);
  for (const std::string& e : r.errors) ADD_FAILURE() << e;
  EXPECT_EQ(r.n_tensors, 657u);
  EXPECT_EQ(bytes, st.total_bytes());
}

TEST(SchemaV41, ReleasedFlashInventory) {
  ModelConfig cfg = load_config("configs/deepseek-v4.1-flash.json");
  ASSERT_EQ(cfg.arch, Arch::V41);
  ASSERT_TRUE(cfg.has_vision);
  ASSERT_EQ(cfg.n_mtp, 3);
  std::vector<TensorSpec> all = expected_tensors(cfg);
  std::map<std::string, const TensorSpec*> by;
  for (const TensorSpec& s : all) by[s.name] = &s;
  ASSERT_EQ(by.size(), all.size()) << "duplicate names";
  auto shape = [&](const std::string& n) {
    auto it = by.find(n);
    return it == by.end() ? std::vector<int64_t>{} : it->second->shape;
  };
  // Shapes model-spec §2.3 states (from the released headers via SP41).
  EXPECT_EQ(shape("layers.6.attn.wq_a.scale"), (std::vector<int64_t>{40, 160}));
  EXPECT_EQ(shape("layers.6.attn.wq_b.scale"), (std::vector<int64_t>{1024, 40}));
  EXPECT_EQ(shape("layers.6.attn.wo_a.weight"), (std::vector<int64_t>{8192, 4096}));
  EXPECT_EQ(shape("layers.6.attn.wo_a.scale"), (std::vector<int64_t>{256, 128}));
  EXPECT_EQ(shape("layers.6.ffn.experts.383.w1.weight"), (std::vector<int64_t>{2304, 2560}));
  EXPECT_EQ(shape("layers.6.ffn.experts.0.w2.scale"), (std::vector<int64_t>{5120, 72}));
  EXPECT_EQ(shape("layers.6.ffn.shared_experts.w1.scale"), (std::vector<int64_t>{72, 160}));
  EXPECT_EQ(shape("layers.1.engram.embed.weight"), (std::vector<int64_t>{384006168, 256}));
  EXPECT_EQ(shape("layers.14.engram.embed.scale"), (std::vector<int64_t>{384016682, 8}));
  EXPECT_EQ(shape("layers.1.engram.wkv.scale"), (std::vector<int64_t>{800, 192}));
  EXPECT_EQ(shape("layers.2.attn.indexer.wq_b.scale"), (std::vector<int64_t>{128, 40}));
  EXPECT_EQ(shape("layers.2.attn.indexer.wk.weight"), (std::vector<int64_t>{128, 512}));
  EXPECT_EQ(shape("layers.6.hc_attn_fn"), (std::vector<int64_t>{24, 20480}));
  EXPECT_EQ(shape("mtp.0.main_proj.scale"), (std::vector<int64_t>{160, 480}));
  EXPECT_EQ(shape("mtp.2.confidence_head.proj.weight"), (std::vector<int64_t>{1, 5376}));
  EXPECT_EQ(shape("aligner.w1.weight"), (std::vector<int64_t>{5120, 9216}));
  // Roles: only kv sources own compressors, ratio-1 has no gate, Reuse layers nothing.
  EXPECT_TRUE(by.count("layers.20.attn.compressor.wkv.weight"));
  EXPECT_FALSE(by.count("layers.20.attn.compressor.wgate.weight"));
  EXPECT_TRUE(by.count("layers.14.attn.compressor.wgate.weight"));
  EXPECT_FALSE(by.count("layers.3.attn.compressor.wkv.weight"));
  EXPECT_FALSE(by.count("layers.21.attn.indexer.wq_b.weight"));
  EXPECT_TRUE(by.count("layers.24.attn.indexer.wq_b.weight"));
  EXPECT_FALSE(by.count("layers.24.attn.indexer.wk.weight"));
  EXPECT_FALSE(by.count("hc_head_fn"));
  EXPECT_FALSE(by.count("mtp.0.ffn.experts.128.w1.weight"));

  // Counts per part, from the per-layer composition of model-spec §2.3.
  size_t n_backbone = 0, n_mtp = 0, n_vision = 0, n_top = 0;
  size_t b_backbone = 0, b_mtp = 0, b_vision = 0, b_top = 0, b_engram = 0;
  for (const TensorSpec& s : all) {
    if (s.name.rfind("layers.", 0) == 0) {
      ++n_backbone; b_backbone += s.nbytes();
      if (s.name.find(".engram.embed.") != std::string::npos) b_engram += s.nbytes();
    } else if (s.name.rfind("mtp.", 0) == 0) { ++n_mtp; b_mtp += s.nbytes(); }
    else if (s.name.rfind("vision.", 0) == 0 || s.name.rfind("aligner.", 0) == 0) { ++n_vision; b_vision += s.nbytes(); }
    else { ++n_top; b_top += s.nbytes(); }
  }
  // Every layer: 5 FP8 linears with scales + q_norm + kv_norm + attn_sink = 13; norms 2; hc 6;
  // gate 3 (weight, bias, bias_vl); 384 experts x 6; shared expert 6. Ratio-2 kv source +5
  // (compressor wkv/wgate/norm, indexer wk/k_norm), ratio-1 +4, index source +3, Engram +6.
  const size_t common = 13 + 2 + 6 + 3 + 384 * 6 + 6;
  const size_t kv2 = 5, kv1 = 4, idx = 3, engram = 6;
  const size_t expect_backbone = 40 * common + 3 * kv2 + 1 * kv1 + 8 * idx + 2 * engram;
  EXPECT_EQ(n_backbone, expect_backbone);
  // DSpark stage: no bias_vl; mtp.0 adds main_proj (+scale) and main_norm, mtp.2 adds norm,
  // the Markov head's two tables and the confidence head.
  const size_t mtp_block = 13 + 2 + 6 + 2 + 128 * 6 + 6;
  EXPECT_EQ(n_mtp, 3 * mtp_block + 3 + 4);
  EXPECT_EQ(n_vision, 2 + 32 * 8 + 1 + 4);
  EXPECT_EQ(n_top, 6u);
  std::printf("V4.1-Flash inventory: %zu tensors, %zu bytes (%.2f GiB): backbone %zu / %zu B (Engram tables %zu B), "
              "DSpark %zu / %zu B, vision+aligner %zu / %zu B, top level %zu / %zu B\n",
              all.size(), b_backbone + b_mtp + b_vision + b_top,
              double(b_backbone + b_mtp + b_vision + b_top) / double(1ull << 30), n_backbone, b_backbone, b_engram,
              n_mtp, b_mtp, n_vision, b_vision, n_top, b_top);
}
