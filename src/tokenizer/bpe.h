// Byte-level BPE model read from a HF tokenizer.json: vocabulary, merges, added tokens and the
// pre-tokenizer's Split regexes (run with PCRE2, UTF + Unicode properties, JIT).
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dil::tok {

class Regex;  // PCRE2 wrapper (regex.h)

// Open-addressing map (left id, right id) -> (rank, merged id): the BPE inner loop's only lookup.
class MergeTable {
 public:
  static constexpr uint64_t kNone = UINT64_MAX;
  void reserve(size_t n);
  void insert(uint64_t key, uint64_t value);  // keeps the first value for a key
  uint64_t find(uint64_t key) const {
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return values_[i];
      if (keys_[i] == kNone) return kNone;
    }
  }

 private:
  size_t slot(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_); }
  std::vector<uint64_t> keys_, values_;
  size_t mask_ = 0;
  int shift_ = 64;
};


struct AddedToken {
  std::string content;
  int32_t id;
  bool special;
  bool normalized;
};

// Byte trie of added tokens for leftmost-longest matching.
class AddedTrie {
 public:
  void add(const AddedToken* t);
  // Longest allowed token starting at text[i], or nullptr.
  const AddedToken* match(std::string_view text, size_t i, bool parse_special) const;
  bool empty() const { return nodes_.size() <= 1; }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> next;  // (byte, child node)
    const AddedToken* token = nullptr;
  };
  std::vector<Node> nodes_{Node{}};
};

class BpeModel {
 public:
  explicit BpeModel(const std::string& path);  // throws dil::Error
  ~BpeModel();

  // Appends the ids of `text` (valid UTF-8) to `out`.
  void encode(std::string_view text, bool parse_special, std::vector<int32_t>& out) const;
  int32_t token_to_id(std::string_view tok) const;
  const std::string& id_to_token(int32_t id) const;  // "" if unknown
  const std::string& token_bytes(int32_t id) const;  // byte-level decoded bytes
  bool is_special(int32_t id) const { return id >= 0 && id < (int32_t)special_.size() && special_[id]; }
  bool is_added(int32_t id) const { return id >= 0 && id < (int32_t)added_flag_.size() && added_flag_[id]; }
  int64_t vocab_size() const { return static_cast<int64_t>(tokens_.size()); }

 private:
  // Finds added tokens (leftmost-longest) in [text] and splits around them.
  struct Piece {
    size_t begin, end;
    int32_t added_id;  // -1: plain text
  };
  void split_added(std::string_view text, const AddedTrie& trie, bool parse_special, std::vector<Piece>& pieces) const;
  void pretokenize(std::string_view text, std::vector<std::string_view>& words) const;
  void bpe_word(std::string_view word, std::vector<int32_t>& out) const;

  std::unordered_map<std::string, int32_t> vocab_;  // token string -> id (incl. added)
  std::vector<std::string> tokens_;                 // id -> token string
  std::vector<std::string> bytes_;                  // id -> bytes after ByteLevel decoding
  std::vector<uint8_t> special_;                    // id -> is special
  std::vector<uint8_t> added_flag_;                 // id -> is an added token (matched before BPE)
  int32_t byte_id_[256];                            // byte -> id of its single-char token
  // (left id << 32 | right id) -> (rank << 32 | merged id)
  MergeTable merges_;
  std::vector<AddedToken> added_;
  AddedTrie added_raw_, added_norm_;  // by `normalized`
  bool added_first_byte_[256] = {};
  std::vector<std::unique_ptr<Regex>> splits_;  // applied in order, behavior Isolated

  // Word -> ids cache, direct-mapped by hash (a slot is overwritten on collision): bounded
  // memory, no rehashing, cheap misses on text with many unique words. encode() is const and
  // may run on several threads, hence the mutex.
  struct CacheSlot {
    std::string word;
    std::vector<int32_t> ids;
  };
  mutable std::mutex cache_mu_;
  mutable std::vector<CacheSlot> cache_;
};

}  // namespace dil::tok
