// The op sites of the V4 and V4.1 forwards (model.h model_op_sites), layer kind by layer kind,
// for the kernel plan. Each entry mirrors one backend call of v4_model.cpp / v41_model.cpp /
// block.cpp / expert_parallel.cpp with the same dtypes; the backends check every call against
// the installed plan, so a forward that calls something not listed here fails its first step
// (CI runs the fixture forwards on the CPU backend, which checks too).
#include <algorithm>
#include <map>
#include <set>

#include "model/model.h"
#include "model/schema.h"
#include "model/weights.h"

namespace dil {
namespace {

class SiteList {
 public:
  SiteList(const ModelConfig& cfg, Numerics n, bool mtp = false) : cfg_(cfg), n_(n), act_(activation_dtype(n)) {
    for (TensorSpec& t : expected_tensors(cfg, mtp)) specs_.emplace(t.name, std::move(t));
  }
  DType act() const { return act_; }
  int ab() const { return quantizes(n_) ? cfg_.act_block : 0; }

  Weight w(const std::string& name) const {
    auto it = specs_.find(name + ".weight");
    DIL_CHECK(it != specs_.end(), "op sites: the schema has no tensor ", name, ".weight");
    return matrix_format(name, it->second.dtype, it->second.shape, cfg_.weight_block);
  }
  void linear(const std::string& where, const std::string& name, int act_block, DType x, DType out) {
    add(where, linear_site(w(name), act_block, x, out, n_));
  }
  void grouped(const std::string& where, const std::string& name, int groups) {
    add(where, grouped_linear_site(w(name), groups, act_, act_, n_));
  }
  void attention(const std::string& where, int ratio, int topk, bool non_causal = false) {
    add(where, attention_site(cfg_.n_heads, cfg_.head_dim, ratio, topk, act_, n_, non_causal));
  }
  // A linear over a weight of the given format (a view of a schema tensor).
  void linear_w(const std::string& where, const Weight& w, int act_block, DType x, DType out) {
    add(where, linear_site(w, act_block, x, out, n_));
  }
  void indexer(const std::string& where, int cand) {
    add(where, indexer_site(cfg_.index_heads, cfg_.index_head_dim, cfg_.index_topk, cand, cfg_.candidate_block_size,
                            cfg_.candidate_topk_blocks, act_, n_));
  }
  void experts(const std::string& where, const std::string& w1) {
    add(where, moe_experts_site(w(w1), ab(), act_, DType::F32, n_));
  }
  void simple(const std::string& where, const std::string& op) { add(where, simple_site(op, act_, n_)); }

  // What every block of both models calls besides its attention inputs: the attention output
  // path (model/block.cpp), the MoE (gate, routed experts, shared expert), the mHC and norms
  // (V4: the fused hc_pre of both sublayers and of the head; V4.1 adds its own below).
  void block_common(const std::string& kind, const std::string& p, int first_expert) {
    for (const char* op : {"hc_pre", "hc_post", "rms_norm", "rope", "ring_write", "add", "moe_route", "swiglu"})
      simple(kind, op);
    if (quantizes(n_)) simple(kind, "fp8_qdq");
    grouped(kind + " attn.wo_a", p + "attn.wo_a", cfg_.o_groups);
    linear(kind + " attn.wo_b", p + "attn.wo_b", ab(), act_, act_);
    linear(kind + " ffn.gate", p + "ffn.gate", 0, act_, DType::F32);
    experts(kind + " ffn.experts", p + "ffn.experts." + std::to_string(first_expert) + ".w1");
    for (const char* e : {"w1", "w3", "w2"})
      linear(kind + " ffn.shared_experts." + e, p + "ffn.shared_experts." + e, ab(), act_, act_);
  }

  std::vector<OpSite> take() { return std::move(sites_); }

 private:
  void add(const std::string& where, OpSite s) {
    s.where = where;
    const std::string k = s.key() + "#" + where;
    if (seen_.insert(k).second) sites_.push_back(std::move(s));
  }
  const ModelConfig& cfg_;
  Numerics n_;
  DType act_;
  std::map<std::string, TensorSpec> specs_;
  std::vector<OpSite> sites_;
  std::set<std::string> seen_;
};

std::vector<int> layer_list(const ModelConfig& cfg, const std::vector<int>& layers) {
  if (!layers.empty()) return layers;
  std::vector<int> all;
  for (int L = 0; L < cfg.n_layers; ++L) all.push_back(L);
  return all;
}

std::vector<OpSite> v4_sites(const ModelConfig& cfg, Numerics n, const std::vector<int>& layers, bool mtp) {
  SiteList s(cfg, n, mtp);
  const DType act = s.act();
  const int ab = s.ab();
  s.simple("embed", "embed");
  s.simple("embed", "hc_expand");
  for (int L : layer_list(cfg, layers)) {
    const int ratio = cfg.ratio(L);
    const std::string kind = ratio == 0 ? "SWA" : ratio == 4 ? "CSA" : "HCA";
    const std::string p = "layers." + std::to_string(L) + ".";
    s.linear(kind + " attn.wq_a", p + "attn.wq_a", ab, act, act);
    s.linear(kind + " attn.wq_b", p + "attn.wq_b", ab, act, act);
    s.linear(kind + " attn.wkv", p + "attn.wkv", ab, act, act);
    if (ratio > 0) {
      s.linear(kind + " compressor.wkv", p + "attn.compressor.wkv", 0, act, DType::F32);
      s.linear(kind + " compressor.wgate", p + "attn.compressor.wgate", 0, act, DType::F32);
      s.simple(kind, "compressor");
      s.simple(kind, "paged_write");
    }
    if (ratio == 4) {
      s.linear(kind + " indexer.compressor.wkv", p + "attn.indexer.compressor.wkv", 0, act, DType::F32);
      s.linear(kind + " indexer.compressor.wgate", p + "attn.indexer.compressor.wgate", 0, act, DType::F32);
      s.linear(kind + " indexer.wq_b", p + "attn.indexer.wq_b", ab, act, act);
      s.linear(kind + " indexer.weights_proj", p + "attn.indexer.weights_proj", 0, act, act);
      if (quantizes(n)) {
        s.simple(kind, "hadamard");
        s.simple(kind, "fp4_qdq");
      }
      s.indexer(kind + " indexer", 0);
    }
    s.attention(kind + " attention", ratio, ratio == 4 ? cfg.index_topk : 0);
    s.block_common(kind, p, 0);
  }
  s.simple("head", "hc_pre");  // the hc head's mix, collapse and final norm
  s.linear("head", "head", 0, act, DType::F32);
  if (mtp) {
    // The MTP block (model/v4_mtp.cpp): embed + enorm, hnorm per stream, e_proj / h_proj, the
    // broadcast of e_proj over the streams (hc_expand) and the sum, a ratio-0 block, its own hc
    // head and norm before the shared head.
    const std::string p = "mtp.0.";
    s.simple("MTP", "embed");
    s.simple("MTP", "hc_expand");
    s.linear("MTP e_proj", p + "e_proj", ab, act, act);
    s.linear("MTP h_proj", p + "h_proj", ab, act, act);
    s.linear("MTP attn.wq_a", p + "attn.wq_a", ab, act, act);
    s.linear("MTP attn.wq_b", p + "attn.wq_b", ab, act, act);
    s.linear("MTP attn.wkv", p + "attn.wkv", ab, act, act);
    s.attention("MTP attention", 0, 0);
    s.block_common("MTP", p, 0);
    s.linear("MTP head", "head", 0, act, DType::F32);
  }
  return s.take();
}

std::vector<OpSite> v41_sites(const ModelConfig& cfg, Numerics n, const std::vector<int>& layers, bool mtp) {
  SiteList s(cfg, n, mtp);
  const DType act = s.act();
  const int ab = s.ab();
  s.simple("embed", "embed");
  s.simple("embed", "hc_expand");
  for (int L : layer_list(cfg, layers)) {
    const int ratio = cfg.ratio(L);
    const LayerRole role = cfg.role(L);
    // Same derivations as V41Model::bind_layer.
    auto in = [](const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); };
    const bool kv_source = in(cfg.kv_source_layers, L);
    const bool index_source = in(cfg.index_source_layers, L);
    const bool cand_source = index_source && L == cfg.candidate_source_layer;
    const bool uses_cand = index_source && cfg.candidate_source_layer >= 0 && cfg.candidate_source_layer < L;
    const std::string kind = role == LayerRole::Swa     ? "SWA"
                             : role == LayerRole::Full  ? "Full-r" + std::to_string(ratio)
                             : role == LayerRole::Reuse ? "Reuse-r" + std::to_string(ratio)
                                                        : "Reindex-r" + std::to_string(ratio);
    const std::string p = "layers." + std::to_string(L) + ".";
    if (cfg.is_engram_layer(L)) {
      s.linear("Engram wkv", p + "engram.wkv", ab, act, act);
      s.simple("Engram", "engram_mix");
    }
    s.linear(kind + " attn.wq_a", p + "attn.wq_a", ab, act, act);
    s.linear(kind + " attn.wq_b", p + "attn.wq_b", ab, act, act);
    s.linear(kind + " attn.wkv", p + "attn.wkv", ab, act, act);
    if (kv_source) {
      s.linear(kind + " compressor.wkv", p + "attn.compressor.wkv", 0, act, DType::F32);
      if (ratio > 1) {
        s.linear(kind + " compressor.wgate", p + "attn.compressor.wgate", 0, act, DType::F32);
        s.simple(kind, "compressor");
      }
      s.linear(kind + " indexer.wk", p + "attn.indexer.wk", 0, act, act);
      s.simple(kind, "paged_write");
      if (quantizes(n)) s.simple(kind, "fp4_qdq");
    }
    if (index_source) {
      s.linear(kind + " indexer.wq_b", p + "attn.indexer.wq_b", ab, act, act);
      s.linear(kind + " indexer.weights_proj", p + "attn.indexer.weights_proj", 0, act, act);
      s.indexer(kind + " indexer", cand_source ? 1 : uses_cand ? 2 : 0);
    }
    s.attention(kind + " attention", ratio, ratio > 0 ? std::max(cfg.index_topk, 1) : 0);
    // Single-pass mHC: the attention's collapse (previous pre) and mix are one hc_pre, or, in a
    // layer whose rows replay trims in between, hc_collapse + rms_norm and hc_mix; the ffn's is
    // one hc_pre; the head collapses with the last pre.
    s.simple(kind, "hc_mix");
    s.simple(kind, "hc_collapse");
    s.block_common(kind, p, 0);
  }
  s.linear("head", "head", 0, act, DType::F32);
  if (mtp) {
    // DSpark (model/v41_dspark.cpp). Context rows in every forward: the stream means
    // (hc_collapse), their interleaving (embed as a row gather), main_proj + main_norm, each
    // block's wkv + kv_norm, RoPE, FP8 QDQ and ring write.
    s.simple("DSpark context", "hc_collapse");
    s.simple("DSpark context", "embed");
    s.linear("DSpark main_proj", "mtp.0.main_proj", ab, act, act);
    // The draft: embed + hc_expand, three window-only blocks with non-causal attention (each
    // block's own MoE size), the head (collapse, position-major rows, norm, the shared head),
    // the Markov head (embed, its head, add) and the confidence head's two column ranges.
    s.simple("DSpark", "embed");
    s.simple("DSpark", "hc_expand");
    for (int st = 0; st < cfg.n_mtp; ++st) {
      const std::string p = "mtp." + std::to_string(st) + ".";
      s.linear("DSpark attn.wq_a", p + "attn.wq_a", ab, act, act);
      s.linear("DSpark attn.wq_b", p + "attn.wq_b", ab, act, act);
      s.linear("DSpark attn.wkv", p + "attn.wkv", ab, act, act);
      s.attention("DSpark attention", 0, 0, true);
      s.block_common("DSpark", p, 0);
    }
    const std::string last = "mtp." + std::to_string(cfg.n_mtp - 1) + ".";
    s.simple("DSpark", "hc_collapse");
    s.linear("DSpark head", "head", 0, act, DType::F32);
    s.linear("DSpark markov_head", last + "markov_head.head", 0, act, DType::F32);
    const int64_t D = cfg.dim, R = cfg.dspark_markov_rank;
    s.linear_w("DSpark confidence_head", matrix_format("conf x", DType::BF16, {1, D}, cfg.weight_block), 0, act,
               DType::F32);
    s.linear_w("DSpark confidence_head", matrix_format("conf me", DType::BF16, {1, R}, cfg.weight_block), 0, act,
               DType::F32);
  }
  return s.take();
}

}  // namespace

std::vector<OpSite> model_op_sites(const ModelConfig& cfg, Numerics n, const std::vector<int>& layers, bool mtp) {
  return cfg.arch == Arch::V4 ? v4_sites(cfg, n, layers, mtp && cfg.n_mtp > 0)
                              : v41_sites(cfg, n, layers, mtp && cfg.n_mtp > 0);
}

}  // namespace dil
