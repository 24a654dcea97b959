// V4 / V4-Pro tensor inventory (model-spec §2.2). Shapes are [out, in]; FP8 weights carry an
// E8M0 `.scale` of [ceil(out/B), ceil(in/B)]; FP4 experts are I8 [out, in/2] with E8M0 [out, in/32].
#include "model/schema.h"

namespace dil {

namespace {

struct Builder {
  std::vector<TensorSpec>& out;
  int block;
  void add(const std::string& n, DType t, std::vector<int64_t> s) { out.push_back({n, t, std::move(s)}); }
  void fp8(const std::string& n, int64_t o, int64_t i) {
    add(n + ".weight", DType::F8E4M3, {o, i});
    add(n + ".scale", DType::E8M0, {(o + block - 1) / block, (i + block - 1) / block});
  }
  void fp4(const std::string& n, int64_t o, int64_t i) {
    add(n + ".weight", DType::I8, {o, i / 2});
    add(n + ".scale", DType::E8M0, {o, i / 32});
  }
  void bf16(const std::string& n, std::vector<int64_t> s) { add(n, DType::BF16, std::move(s)); }
  void f32(const std::string& n, std::vector<int64_t> s) { add(n, DType::F32, std::move(s)); }
};

// One block (a backbone layer or an MTP block): attention, norms, mHC, MoE.
void add_block(Builder& b, const ModelConfig& c, const std::string& p, int ratio, bool hash) {
  const int64_t D = c.dim, hd = c.head_dim, H = c.n_heads, n = c.hc_mult, mix = (2 + n) * n;
  b.bf16(p + "attn_norm.weight", {D});
  b.bf16(p + "ffn_norm.weight", {D});
  for (const char* s : {"attn", "ffn"}) {
    b.f32(p + "hc_" + s + "_fn", {mix, n * D});
    b.f32(p + "hc_" + s + "_base", {mix});
    b.f32(p + "hc_" + s + "_scale", {3});
  }
  b.fp8(p + "attn.wq_a", c.q_lora_rank, D);
  b.bf16(p + "attn.q_norm.weight", {c.q_lora_rank});
  b.fp8(p + "attn.wq_b", H * hd, c.q_lora_rank);
  b.fp8(p + "attn.wkv", hd, D);
  b.bf16(p + "attn.kv_norm.weight", {hd});
  b.fp8(p + "attn.wo_a", c.o_groups * c.o_lora_rank, H * hd / c.o_groups);
  b.fp8(p + "attn.wo_b", D, c.o_groups * c.o_lora_rank);
  b.f32(p + "attn.attn_sink", {H});
  if (ratio > 0) {
    const int64_t coff = ratio == 4 ? 2 : 1;
    b.bf16(p + "attn.compressor.wkv.weight", {coff * hd, D});
    b.bf16(p + "attn.compressor.wgate.weight", {coff * hd, D});
    b.f32(p + "attn.compressor.ape", {ratio, coff * hd});
    b.bf16(p + "attn.compressor.norm.weight", {hd});
    if (ratio == 4) {
      const int64_t di = c.index_head_dim, Hi = c.index_heads;
      b.fp8(p + "attn.indexer.wq_b", Hi * di, c.q_lora_rank);
      b.bf16(p + "attn.indexer.weights_proj.weight", {Hi, D});
      b.bf16(p + "attn.indexer.compressor.wkv.weight", {2 * di, D});
      b.bf16(p + "attn.indexer.compressor.wgate.weight", {2 * di, D});
      b.f32(p + "attn.indexer.compressor.ape", {ratio, 2 * di});
      b.bf16(p + "attn.indexer.compressor.norm.weight", {di});
    }
  }
  b.bf16(p + "ffn.gate.weight", {c.n_routed, D});
  if (hash) b.add(p + "ffn.gate.tid2eid", DType::I64, {c.vocab_size, c.topk});
  else b.f32(p + "ffn.gate.bias", {c.n_routed});
  for (int e = 0; e < c.n_routed; ++e) {
    std::string ep = p + "ffn.experts." + std::to_string(e) + ".";
    b.fp4(ep + "w1", c.moe_inter, D);
    b.fp4(ep + "w2", D, c.moe_inter);
    b.fp4(ep + "w3", c.moe_inter, D);
  }
  b.fp8(p + "ffn.shared_experts.w1", c.moe_inter, D);
  b.fp8(p + "ffn.shared_experts.w2", D, c.moe_inter);
  b.fp8(p + "ffn.shared_experts.w3", c.moe_inter, D);
}

}  // namespace

std::vector<TensorSpec> expected_tensors_v4(const ModelConfig& c, bool with_mtp) {
  std::vector<TensorSpec> out;
  Builder b{out, c.weight_block};
  const int64_t D = c.dim, n = c.hc_mult;
  b.bf16("embed.weight", {c.vocab_size, D});
  b.bf16("head.weight", {c.vocab_size, D});
  b.bf16("norm.weight", {D});
  b.f32("hc_head_fn", {n, n * D});
  b.f32("hc_head_base", {n});
  b.f32("hc_head_scale", {1});
  for (int L = 0; L < c.n_layers; ++L)
    add_block(b, c, "layers." + std::to_string(L) + ".", c.ratio(L), c.is_hash_layer(L));
  if (with_mtp) {
    for (int m = 0; m < c.n_mtp; ++m) {
      std::string p = "mtp." + std::to_string(m) + ".";
      add_block(b, c, p, c.ratio(c.n_layers + m), false);
      b.fp8(p + "e_proj", D, D);
      b.fp8(p + "h_proj", D, D);
      b.bf16(p + "enorm.weight", {D});
      b.bf16(p + "hnorm.weight", {D});
      b.bf16(p + "norm.weight", {D});
      b.f32(p + "hc_head_fn", {n, n * D});
      b.f32(p + "hc_head_base", {n});
      b.f32(p + "hc_head_scale", {1});
    }
  }
  return out;
}

}  // namespace dil
