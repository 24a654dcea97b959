// Model configuration read from the official config.json (model-spec §1). V4 keys are at the
// top level; V4.1 keeps them under `text_config` with `quantization_config` at the top.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dil {

enum class Arch { V4, V41 };

// V4.1 attention roles (model-spec §4.1); V4 layers are SWA/CSA/HCA by ratio.
enum class LayerRole { Swa, Full, Reuse, Reindex };

struct ModelConfig {
  Arch arch = Arch::V4;
  std::string model_type;
  int64_t vocab_size = 0;
  int64_t dim = 0;             // hidden_size
  int n_layers = 0;            // num_hidden_layers (backbone)
  int n_heads = 0;
  int head_dim = 0;
  int rope_dims = 0;           // qk_rope_head_dim
  int64_t q_lora_rank = 0;
  int o_groups = 0;
  int64_t o_lora_rank = 0;
  int64_t moe_inter = 0;
  int n_routed = 0;
  int n_shared = 0;
  int topk = 0;
  int n_hash_layers = 0;
  float route_scale = 1.0f;
  float swiglu_limit = 0.0f;
  float norm_eps = 1e-6f;
  float gate_temp = 1.0f;
  int hc_mult = 4;
  int hc_iters = 20;
  float hc_eps = 1e-6f;
  int window = 128;
  int index_heads = 0;
  int index_head_dim = 0;
  int index_topk = 0;
  double rope_theta = 10000.0;
  double compress_rope_theta = 160000.0;
  double rope_factor = 1.0;
  int64_t original_seq_len = 0;
  double beta_fast = 32.0, beta_slow = 1.0;
  bool yarn = false;
  int64_t max_position = 0;
  int n_mtp = 0;               // num_nextn_predict_layers
  std::vector<int> compress_ratios;  // backbone + mtp entries as in the file
  int weight_block = 128;      // FP8 weight block (square)
  int act_block = 128;         // FP8 activation-quant block for FP8/FP4 GEMMs
  int32_t bos_id = 0, eos_id = 1, pad_id = -1;
  // V4.1
  std::vector<int> kv_source_layers, index_source_layers;
  int candidate_source_layer = -1, candidate_topk_blocks = 0, candidate_block_size = 0;
  std::vector<int> engram_layers;
  std::vector<int64_t> engram_num_embeddings;
  int engram_max_ngram = 0, engram_heads = 0, engram_head_dim = 0;
  int64_t engram_vocab_size = 0;
  int32_t engram_pad_id = 0;
  int64_t engram_compressed_vocab = 0;
  int dspark_block_size = 0, dspark_noise_token = 0, dspark_markov_rank = 0;
  std::vector<int> dspark_target_layers;
  int dspark_n_routed = 0, dspark_topk = 0;
  int32_t image_token_id = -1;
  bool has_vision = false;
  // V4.1 vision_config (only used to list the vision tower's tensors, model-spec §2.3).
  int64_t vision_dim = 0, vision_inter = 0;
  int vision_layers = 0, vision_patch = 0, vision_downsample = 0;

  int ratio(int layer) const { return layer < int(compress_ratios.size()) ? compress_ratios[layer] : 0; }
  bool is_hash_layer(int layer) const { return layer < n_hash_layers; }
  // V4.1 roles and sharing.
  LayerRole role(int layer) const;
  int kv_source_of(int layer) const;     // closest kv-source <= layer, -1 if none
  int index_source_of(int layer) const;  // latest index-source <= layer, -1 if none
  bool is_engram_layer(int layer) const;
};

// Reads `path` (a config.json). Throws dil::Error naming the key on a missing/ill-typed value.
ModelConfig load_config(const std::string& path);

}  // namespace dil
