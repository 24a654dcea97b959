#include "grammar/vocab.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"

namespace dil::grammar {

Vocabulary::Vocabulary(std::vector<std::string> token_bytes) : bytes_(std::move(token_bytes)) {
  all_.assign(size_t(words()), 0);
  std::vector<int32_t> order;
  for (int32_t id = 0; id < size(); ++id)
    if (!bytes_[size_t(id)].empty()) {
      order.push_back(id);
      all_[size_t(id) / 64] |= uint64_t(1) << (id % 64);
    }
  n_usable_ = int32_t(order.size());
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return bytes_[size_t(a)] != bytes_[size_t(b)] ? bytes_[size_t(a)] < bytes_[size_t(b)] : a < b;
  });
  // Sorted strings give the preorder directly: each string adds the nodes past its common
  // prefix with the current path; a node's subtree ends where the path first leaves it.
  std::vector<int32_t> path;  // node per depth - 1
  const std::string* prev = nullptr;
  auto close_to = [&](size_t keep) {
    while (path.size() > keep) {
      nodes_[size_t(path.back())].end = int32_t(nodes_.size());
      path.pop_back();
    }
  };
  for (int32_t id : order) {
    const std::string& s = bytes_[size_t(id)];
    size_t common = 0;
    if (prev) {
      while (common < s.size() && common < prev->size() && (*prev)[common] == s[common]) ++common;
      common = std::min(common, path.size());
    }
    close_to(common);
    if (s.size() > UINT16_MAX) DIL_FAIL("vocabulary: a token of ", s.size(), " bytes");
    for (size_t k = path.size(); k < s.size(); ++k) {
      nodes_.push_back({-1, int32_t(ids_.size()), uint16_t(k + 1), uint8_t(s[k])});
      path.push_back(int32_t(nodes_.size() - 1));
    }
    // The node of `s` is the last on the path; its ids are the ones pushed since it was made
    // (equal strings are adjacent, and longer strings add nodes after it).
    ids_.push_back(id);
    max_depth_ = std::max<int32_t>(max_depth_, int32_t(s.size()));
    prev = &s;
  }
  close_to(0);
  nodes_.push_back({int32_t(nodes_.size()) + 1, int32_t(ids_.size()), 0, 0});  // sentinel
}

}  // namespace dil::grammar
