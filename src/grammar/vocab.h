// The vocabulary as the grammar sees it: each token id's output bytes, and a byte trie of them
// laid out in preorder so that a walk can skip a whole subtree (every token with a prefix the
// grammar rejects) by jumping to its end. Built once per tokenizer; immutable.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dil::grammar {

class Vocabulary {
 public:
  // token_bytes[id]: the bytes the token adds to the output. Empty: never allowed (special
  // tokens whose text the output parser does not see, ids the tokenizer does not use).
  explicit Vocabulary(std::vector<std::string> token_bytes);

  int32_t size() const { return int32_t(bytes_.size()); }          // ids (mask bits)
  int32_t words() const { return (size() + 63) / 64; }              // uint64 words of a mask
  const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
  // Every id with non-empty bytes, as a mask.
  std::span<const uint64_t> all() const { return all_; }
  int32_t n_usable() const { return n_usable_; }

  // Trie nodes in preorder (the root is implicit). Node i: its last byte, its depth (bytes
  // from the root), the node after its subtree, the ids whose bytes end here.
  struct Node {  // one record per node: a walk reads them in order
    int32_t end;        // the node after its subtree
    int32_t ids_begin;  // into ids_; the node's ids end where the next node's begin
    uint16_t depth;
    uint8_t byte;
  };
  int32_t n_nodes() const { return int32_t(nodes_.size()) - 1; }
  const Node& node(int32_t i) const { return nodes_[size_t(i)]; }
  uint8_t byte(int32_t i) const { return nodes_[size_t(i)].byte; }
  int32_t depth(int32_t i) const { return nodes_[size_t(i)].depth; }
  int32_t subtree_end(int32_t i) const { return nodes_[size_t(i)].end; }
  std::span<const int32_t> ids_at(int32_t i) const {
    const int32_t b = nodes_[size_t(i)].ids_begin;
    return {ids_.data() + b, size_t(nodes_[size_t(i) + 1].ids_begin - b)};
  }
  int32_t max_depth() const { return max_depth_; }

 private:
  std::vector<std::string> bytes_;
  std::vector<uint64_t> all_;
  int32_t n_usable_ = 0;
  std::vector<Node> nodes_;  // [n_nodes + 1]: a sentinel closes the last node's ids
  std::vector<int32_t> ids_;
  int32_t max_depth_ = 0;
};

}  // namespace dil::grammar
