// V4.1 Engram hashing (model-spec §4.5): the compressed-token map derived from the model's
// tokenizer.json, the prime bucket layout, the hash multipliers, and the per-position hash
// -> table rows. All of it must reproduce training bit for bit (HF41
// `build_compressed_token_map`, `EngramLayout`, `compute_hash_multipliers`,
// `DeepseekV41NgramHashState`), or the pretrained tables are addressed wrongly.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace dil {

// Per token id (0 .. tokenizer size-1): its class. Each id is decoded alone with the byte-level
// decoder; partial UTF-8 (or U+FFFD) keys by the raw token string; otherwise the text is
// normalized NFKC -> NFD -> strip marks -> lowercase -> whitespace runs to one space -> strip
// (a lone space survives), empty -> the raw text. Classes are numbered in first-seen order.
struct CompressedTokenMap {
  std::vector<int32_t> cls;  // [tokenizer size]
  int32_t n_classes = 0;
};
CompressedTokenMap build_compressed_token_map(const std::string& tokenizer_json_path);

// The normalization above, on one UTF-8 string (exposed for tests).
std::string engram_normalize(const std::string& text);

// The hashing tables of one model.
struct EngramHash {
  int max_ngram = 0;  // n-grams 2..max_ngram
  int n_heads = 0;    // hash heads per n-gram size
  int32_t pad_class = 0;
  std::vector<int32_t> token_class;                 // [tokenizer size]
  std::vector<std::vector<int64_t>> primes;         // [engram layers][(max_ngram-1)*n_heads]
  std::vector<std::vector<int64_t>> offsets;        // same shape: exclusive prefix sums per layer
  std::vector<std::vector<int64_t>> multipliers;    // [engram layers][max_ngram], odd
  int cols() const { return (max_ngram - 1) * n_heads; }
};

// Primes in HF41 `EngramLayout` order: per layer, per n-gram size, n_heads primes, each the
// next prime above the previous (restarting at engram_vocab_size-1 for every n-gram size),
// never reusing one.
std::vector<std::vector<int64_t>> engram_primes(const ModelConfig& cfg);
// numpy default_rng(10007*layer).integers(0, ((2^63-1)//n_classes)//2, max_ngram)*2+1.
std::vector<int64_t> engram_multipliers(int layer_id, int max_ngram, int64_t n_classes);

// Builds everything and checks it against the config: class count == engram_compressed_vocab_size
// and each layer's prime sum == engram_num_embeddings (throws dil::Error naming the mismatch).
EngramHash make_engram_hash(const ModelConfig& cfg, const CompressedTokenMap& map);

// Table rows (offsets included) for queries at positions [p0, p0+n) of one sequence.
// `ids` holds token ids of positions [p0-h, p0+n), h = min(p0, max_ngram-1): the look-back
// history first. `dead` (same length, may be null) marks image-span tokens: an n-gram never
// reaches back across one. Output: rows [n, cols()] for engram layer index `li`.
void engram_rows(const EngramHash& e, int li, const int32_t* ids, const uint8_t* dead, int64_t p0, int64_t n,
                 int64_t* rows);

}  // namespace dil
