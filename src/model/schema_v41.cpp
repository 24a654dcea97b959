// The V4.1 tensor inventory (model-spec §2.3), from the config alone.
#include "model/schema.h"

#include "core/check.h"

namespace dil {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

class Lister {
 public:
  Lister(const ModelConfig& c, std::vector<TensorSpec>* out) : c_(c), out_(out) {}

  void add(const std::string& name, DType t, std::vector<int64_t> shape) {
    out_->push_back({name, t, std::move(shape)});
  }
  // Dense FP8 linear: e4m3 [out, in] + ue8m0 scale per weight_block x weight_block.
  void fp8(const std::string& p, int64_t out, int64_t in) {
    const int64_t b = c_.weight_block;
    add(p + ".weight", DType::F8E4M3, {out, in});
    add(p + ".scale", DType::E8M0, {ceil_div(out, b), ceil_div(in, b)});
  }
  // Routed expert: e2m1 packed two per byte in I8 [out, in/2] + ue8m0 per 1x32.
  void fp4(const std::string& p, int64_t out, int64_t in) {
    add(p + ".weight", DType::I8, {out, in / 2});
    add(p + ".scale", DType::E8M0, {out, ceil_div(in, 32)});
  }
  void bf16(const std::string& name, std::vector<int64_t> shape) { add(name, DType::BF16, std::move(shape)); }
  void f32(const std::string& name, std::vector<int64_t> shape) { add(name, DType::F32, std::move(shape)); }

  // Attention projections every layer and every DSpark stage has (model-spec §2.3).
  void attention_common(const std::string& p) {
    const int64_t D = c_.dim, H = c_.n_heads, hd = c_.head_dim;
    fp8(p + ".attn.wq_a", c_.q_lora_rank, D);
    bf16(p + ".attn.q_norm.weight", {c_.q_lora_rank});
    fp8(p + ".attn.wq_b", H * hd, c_.q_lora_rank);
    fp8(p + ".attn.wkv", hd, D);
    bf16(p + ".attn.kv_norm.weight", {hd});
    fp8(p + ".attn.wo_a", c_.o_groups * c_.o_lora_rank, H * hd / c_.o_groups);
    fp8(p + ".attn.wo_b", D, c_.o_groups * c_.o_lora_rank);
    f32(p + ".attn.attn_sink", {H});
  }
  void norms_and_hc(const std::string& p) {
    const int64_t D = c_.dim, n = c_.hc_mult, mix = (2 + n) * n;
    bf16(p + ".attn_norm.weight", {D});
    bf16(p + ".ffn_norm.weight", {D});
    for (const char* s : {"attn", "ffn"}) {
      f32(p + ".hc_" + s + "_fn", {mix, n * D});
      f32(p + ".hc_" + s + "_base", {mix});
      f32(p + ".hc_" + s + "_scale", {3});
    }
  }
  void moe(const std::string& p, int n_routed, bool bias_vl) {
    const int64_t D = c_.dim, I = c_.moe_inter;
    bf16(p + ".ffn.gate.weight", {n_routed, D});
    f32(p + ".ffn.gate.bias", {n_routed});
    if (bias_vl) f32(p + ".ffn.gate.bias_vl", {n_routed});
    for (int e = 0; e < n_routed; ++e) {
      const std::string q = p + ".ffn.experts." + std::to_string(e);
      fp4(q + ".w1", I, D);
      fp4(q + ".w2", D, I);
      fp4(q + ".w3", I, D);
    }
    const int64_t Is = I * c_.n_shared;
    fp8(p + ".ffn.shared_experts.w1", Is, D);
    fp8(p + ".ffn.shared_experts.w2", D, Is);
    fp8(p + ".ffn.shared_experts.w3", Is, D);
  }

 private:
  const ModelConfig& c_;
  std::vector<TensorSpec>* out_;
};

bool contains(const std::vector<int>& v, int x) {
  for (int y : v)
    if (y == x) return true;
  return false;
}

}  // namespace

// Order: backbone, then DSpark stages `mtp.0..n_mtp-1` (when `with_mtp`), then the vision tower
// and aligner (when the config has a vision_config).
std::vector<TensorSpec> expected_tensors_v41(const ModelConfig& c, bool with_mtp) {
  DIL_CHECK(c.arch == Arch::V41, "expected_tensors_v41 needs a V4.1 config");
  std::vector<TensorSpec> out;
  Lister l(c, &out);
  const int64_t D = c.dim;
  l.bf16("embed.weight", {c.vocab_size, D});
  l.bf16("head.weight", {c.vocab_size, D});
  l.bf16("norm.weight", {D});
  if (c.has_vision) {
    // Image delimiter embeddings (model-spec §4.8); dtype BF16 per SP41's "bf16 or f32" group.
    l.bf16("image_start", {D});
    l.bf16("image_end", {D});
    l.bf16("image_newline", {D});
  }
  for (int L = 0; L < c.n_layers; ++L) {
    const std::string p = "layers." + std::to_string(L);
    l.attention_common(p);
    // Only kv sources own a compressor and the indexer keys' projection; only index sources
    // own an indexer query; Reuse layers have neither (model-spec §2.3, §4.1).
    if (contains(c.kv_source_layers, L)) {
      l.bf16(p + ".attn.compressor.wkv.weight", {c.head_dim, D});
      if (c.ratio(L) > 1) l.bf16(p + ".attn.compressor.wgate.weight", {c.head_dim, D});
      l.bf16(p + ".attn.compressor.norm.weight", {c.head_dim});
      l.bf16(p + ".attn.indexer.wk.weight", {c.index_head_dim, c.head_dim});
      l.bf16(p + ".attn.indexer.k_norm.weight", {c.index_head_dim});
    }
    if (contains(c.index_source_layers, L)) {
      l.fp8(p + ".attn.indexer.wq_b", int64_t(c.index_heads) * c.index_head_dim, c.q_lora_rank);
      l.bf16(p + ".attn.indexer.weights_proj.weight", {c.index_heads, D});
    }
    l.norms_and_hc(p);
    // bias_vl is in every backbone layer, also in text-only checkpoints (the fixture has it).
    l.moe(p, c.n_routed, /*bias_vl=*/true);
    for (size_t e = 0; e < c.engram_layers.size(); ++e) {
      if (c.engram_layers[e] != L) continue;
      const int64_t rows = c.engram_num_embeddings[e], hd = c.engram_head_dim;
      l.add(p + ".engram.embed.weight", DType::F8E4M3, {rows, hd});
      l.add(p + ".engram.embed.scale", DType::E8M0, {rows, ceil_div(hd, 32)});
      const int64_t cols = int64_t(c.engram_max_ngram - 1) * c.engram_heads;
      l.fp8(p + ".engram.wkv", D * (c.hc_mult + 1), cols * hd);
      l.bf16(p + ".engram.q_weight", {c.hc_mult, D});
      l.bf16(p + ".engram.k_weight", {c.hc_mult, D});
    }
  }
  if (with_mtp) {
    // DSpark stages (model-spec §2.3, §4.7): SWA-only blocks with their own MoE size.
    for (int s = 0; s < c.n_mtp; ++s) {
      const std::string p = "mtp." + std::to_string(s);
      l.attention_common(p);
      l.norms_and_hc(p);
      l.moe(p, c.dspark_n_routed, /*bias_vl=*/false);  // SP41 lists no bias_vl for mtp.*
      if (s == 0) {
        l.fp8(p + ".main_proj", D, D * int64_t(c.dspark_target_layers.size()));
        l.bf16(p + ".main_norm.weight", {D});
      }
      if (s + 1 == c.n_mtp) {
        l.bf16(p + ".norm.weight", {D});
        l.bf16(p + ".markov_head.embed.weight", {c.vocab_size, c.dspark_markov_rank});
        l.bf16(p + ".markov_head.head.weight", {c.vocab_size, c.dspark_markov_rank});
        l.bf16(p + ".confidence_head.proj.weight", {1, D + c.dspark_markov_rank});
      }
    }
  }
  if (c.has_vision) {
    // DeepSeek-ViT + aligner (model-spec §2.3, §4.8), all BF16.
    const int64_t vd = c.vision_dim, vi = c.vision_inter, ps = c.vision_patch, ds = c.vision_downsample;
    l.bf16("vision.patch_embed.weight", {vd, ps * ps * 3});
    l.bf16("vision.patch_embed.bias", {vd});
    for (int b = 0; b < c.vision_layers; ++b) {
      const std::string p = "vision.blocks." + std::to_string(b);
      l.bf16(p + ".norm1.weight", {vd});
      l.bf16(p + ".norm2.weight", {vd});
      l.bf16(p + ".attn.wqkv.weight", {3 * vd, vd});
      l.bf16(p + ".attn.wqkv.bias", {3 * vd});
      l.bf16(p + ".attn.wo.weight", {vd, vd});
      l.bf16(p + ".attn.wo.bias", {vd});
      l.bf16(p + ".mlp.w1.weight", {2 * vi, vd});  // fused [gate; up]
      l.bf16(p + ".mlp.w2.weight", {vd, vi});
    }
    l.bf16("vision.norm.weight", {vd});
    l.bf16("aligner.w1.weight", {D, ds * ds * vd});
    l.bf16("aligner.w1.bias", {D});
    l.bf16("aligner.w2.weight", {D, D});
    l.bf16("aligner.w2.bias", {D});
  }
  return out;
}

}  // namespace dil
