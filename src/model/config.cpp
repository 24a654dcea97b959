#include "model/config.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"

namespace dil {

using json = nlohmann::json;

namespace {

template <typename T>
T req(const json& j, const char* key, const std::string& file) {
  if (!j.contains(key)) DIL_FAIL(file, ": missing key '", key, "'");
  try {
    return j.at(key).get<T>();
  } catch (const std::exception&) {
    DIL_FAIL(file, ": key '", key, "' has the wrong type: ", j.at(key).dump());
  }
}

template <typename T>
T opt(const json& j, const char* key, T def) {
  if (!j.contains(key) || j.at(key).is_null()) return def;
  try {
    return j.at(key).get<T>();
  } catch (const std::exception&) {
    DIL_FAIL("config key '", key, "' has the wrong type: ", j.at(key).dump());
  }
}

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

}  // namespace

LayerRole ModelConfig::role(int layer) const {
  if (ratio(layer) == 0) return LayerRole::Swa;
  if (arch == Arch::V4) return LayerRole::Full;
  if (contains(kv_source_layers, layer)) return LayerRole::Full;
  if (contains(index_source_layers, layer)) return LayerRole::Reindex;
  return LayerRole::Reuse;
}

int ModelConfig::kv_source_of(int layer) const {
  int best = -1;
  for (int s : kv_source_layers)
    if (s <= layer && s > best) best = s;
  return best;
}

int ModelConfig::index_source_of(int layer) const {
  int best = -1;
  for (int s : index_source_layers)
    if (s <= layer && s > best) best = s;
  return best;
}

bool ModelConfig::is_engram_layer(int layer) const { return contains(engram_layers, layer); }

ModelConfig load_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) DIL_FAIL("cannot read ", path);
  json root;
  try {
    root = json::parse(in);
  } catch (const std::exception& e) {
    DIL_FAIL(path, ": invalid JSON: ", e.what());
  }
  ModelConfig c;
  c.model_type = opt<std::string>(root, "model_type", "");
  const bool v41 = root.contains("text_config") || c.model_type == "deepseek_v41";
  c.arch = v41 ? Arch::V41 : Arch::V4;
  const json& t = v41 ? root.at("text_config") : root;
  const json qc = root.contains("quantization_config") ? root["quantization_config"]
                                                        : opt<json>(t, "quantization_config", json::object());
  c.vocab_size = req<int64_t>(t, "vocab_size", path);
  c.dim = req<int64_t>(t, "hidden_size", path);
  c.n_layers = req<int>(t, "num_hidden_layers", path);
  c.n_heads = req<int>(t, "num_attention_heads", path);
  c.head_dim = req<int>(t, "head_dim", path);
  c.rope_dims = req<int>(t, "qk_rope_head_dim", path);
  c.q_lora_rank = req<int64_t>(t, "q_lora_rank", path);
  c.o_groups = req<int>(t, "o_groups", path);
  c.o_lora_rank = req<int64_t>(t, "o_lora_rank", path);
  c.moe_inter = req<int64_t>(t, "moe_intermediate_size", path);
  c.n_routed = req<int>(t, "n_routed_experts", path);
  c.n_shared = opt<int>(t, "n_shared_experts", 1);
  c.topk = req<int>(t, "num_experts_per_tok", path);
  c.n_hash_layers = opt<int>(t, "num_hash_layers", 0);
  c.route_scale = opt<float>(t, "routed_scaling_factor", 1.0f);
  c.swiglu_limit = opt<float>(t, "swiglu_limit", 0.0f);
  c.norm_eps = req<float>(t, "rms_norm_eps", path);
  c.gate_temp = opt<float>(t, "gate_temp", 1.0f);
  c.hc_mult = opt<int>(t, "hc_mult", 4);
  c.hc_iters = opt<int>(t, "hc_sinkhorn_iters", 20);
  c.hc_eps = opt<float>(t, "hc_eps", 1e-6f);
  c.window = req<int>(t, "sliding_window", path);
  c.index_heads = opt<int>(t, "index_n_heads", 0);
  c.index_head_dim = opt<int>(t, "index_head_dim", 0);
  c.index_topk = opt<int>(t, "index_topk", 0);
  c.rope_theta = opt<double>(t, "rope_theta", 10000.0);
  c.compress_rope_theta = opt<double>(t, "compress_rope_theta", 160000.0);
  json rs = opt<json>(t, "rope_scaling", json());
  if (rs.is_object()) {
    std::string type = opt<std::string>(rs, "type", opt<std::string>(rs, "rope_type", ""));
    c.yarn = type == "yarn";
    c.rope_factor = opt<double>(rs, "factor", 1.0);
    c.original_seq_len = opt<int64_t>(rs, "original_max_position_embeddings", 0);
    c.beta_fast = opt<double>(rs, "beta_fast", 32.0);
    c.beta_slow = opt<double>(rs, "beta_slow", 1.0);
  }
  c.max_position = opt<int64_t>(t, "max_position_embeddings", 0);
  c.n_mtp = opt<int>(t, "num_nextn_predict_layers", 0);
  c.compress_ratios = req<std::vector<int>>(t, "compress_ratios", path);
  if (int(c.compress_ratios.size()) < c.n_layers)
    DIL_FAIL(path, ": compress_ratios has ", c.compress_ratios.size(), " entries for ", c.n_layers, " layers");
  if (qc.is_object() && qc.contains("weight_block_size")) {
    auto wb = qc["weight_block_size"].get<std::vector<int>>();
    if (wb.size() != 2 || wb[0] != wb[1]) DIL_FAIL(path, ": weight_block_size must be square");
    c.weight_block = wb[0];
  }
  c.act_block = c.weight_block;  // V4: 128, V4.1: 32 (model-spec §4.3)
  c.bos_id = opt<int32_t>(root, "bos_token_id", opt<int32_t>(t, "bos_token_id", 0));
  c.eos_id = opt<int32_t>(root, "eos_token_id", opt<int32_t>(t, "eos_token_id", 1));
  c.pad_id = opt<int32_t>(root, "pad_token_id", opt<int32_t>(t, "pad_token_id", -1));
  if (v41) {
    c.kv_source_layers = req<std::vector<int>>(t, "kv_source_layer_ids", path);
    c.index_source_layers = req<std::vector<int>>(t, "index_source_layer_ids", path);
    c.candidate_source_layer = opt<int>(t, "candidate_source_layer_id", -1);
    c.candidate_topk_blocks = opt<int>(t, "candidate_topk_blocks", 0);
    c.candidate_block_size = opt<int>(t, "candidate_block_size", 0);
    c.engram_layers = opt<std::vector<int>>(t, "engram_layer_ids", {});
    c.engram_num_embeddings = opt<std::vector<int64_t>>(t, "engram_num_embeddings", {});
    c.engram_max_ngram = opt<int>(t, "engram_max_ngram_size", 0);
    c.engram_heads = opt<int>(t, "engram_n_heads", 0);
    c.engram_head_dim = opt<int>(t, "engram_head_dim", 0);
    c.engram_vocab_size = opt<int64_t>(t, "engram_vocab_size", 0);
    c.engram_pad_id = opt<int32_t>(t, "engram_pad_token_id", opt<int32_t>(t, "engram_pad_id", 2));
    c.engram_compressed_vocab = opt<int64_t>(t, "engram_compressed_vocab_size", 0);
    c.dspark_block_size = opt<int>(t, "dspark_block_size", 0);
    c.dspark_noise_token = opt<int>(t, "dspark_noise_token_id", 0);
    c.dspark_markov_rank = opt<int>(t, "dspark_markov_rank", 0);
    c.dspark_target_layers = opt<std::vector<int>>(t, "dspark_target_layer_ids", {});
    c.dspark_n_routed = opt<int>(t, "dspark_n_routed_experts", 0);
    c.dspark_topk = opt<int>(t, "dspark_num_experts_per_tok", 0);
    c.image_token_id = opt<int32_t>(root, "image_token_id", -1);
    c.has_vision = root.contains("vision_config");
    if (c.has_vision) {
      const json& v = root.at("vision_config");
      c.vision_dim = req<int64_t>(v, "hidden_size", path);
      c.vision_inter = req<int64_t>(v, "intermediate_size", path);
      c.vision_layers = req<int>(v, "num_hidden_layers", path);
      c.vision_patch = req<int>(v, "patch_size", path);
      c.vision_downsample = opt<int>(v, "downsample_ratio", 1);
    }
    if (c.engram_layers.size() != c.engram_num_embeddings.size())
      DIL_FAIL(path, ": engram_layer_ids and engram_num_embeddings differ in length");
  }
  if (c.n_heads % c.o_groups != 0) DIL_FAIL(path, ": num_attention_heads not divisible by o_groups");
  return c;
}

}  // namespace dil
