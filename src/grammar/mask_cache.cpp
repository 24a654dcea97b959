#include "grammar/mask_cache.h"

#include <algorithm>

namespace dil::grammar {

void NodeMask::apply(std::span<uint64_t> mask, std::span<const uint64_t> all, std::span<uint64_t> scratch) const {
  switch (form) {
    case Form::Bits:
      for (size_t w = 0; w < mask.size(); ++w) mask[w] |= bits[w];
      break;
    case Form::Accept:
      for (int32_t id : ids) set_bit(mask, id);
      break;
    case Form::Reject:
      std::copy(all.begin(), all.end(), scratch.begin());
      for (int32_t id : ids) scratch[size_t(id) / 64] &= ~(uint64_t(1) << (id % 64));
      for (size_t w = 0; w < mask.size(); ++w) mask[w] |= scratch[w];
      break;
  }
}

NodeMask build_node_mask(const Automaton& a, const Vocabulary& v, int32_t node) {
  Stepper st(a);
  const int32_t depth = v.max_depth();
  std::vector<StackSet> level(size_t(depth) + 1);
  // ended[d]: n's rule can end right after d bytes; dep[d]: the tokens below may continue in
  // the caller (an earlier end whose next byte can follow the rule).
  std::vector<uint8_t> ended(size_t(depth) + 1, 0), dep(size_t(depth) + 1, 0);
  const int32_t start[1] = {node};
  level[0].add(start);
  const std::bitset<256>& follow = a.follow[size_t(a.node_rule[size_t(node)])];
  std::vector<uint64_t> accepted(size_t(v.words()), 0);
  NodeMask m;
  int64_t n_accepted = 0;
  for (int32_t i = 0; i < v.n_nodes();) {
    const int32_t d = v.depth(i);
    const uint8_t b = v.byte(i);
    const bool dependent = dep[size_t(d - 1)] || (ended[size_t(d - 1)] && follow.test(b));
    const bool end_here = st.step(level[size_t(d - 1)], b, level[size_t(d)]);
    if (level[size_t(d)].empty() && !end_here) {
      if (dependent)
        for (int32_t j = i; j < v.subtree_end(i); ++j)
          for (int32_t id : v.ids_at(j)) m.dependent.push_back(id);
      i = v.subtree_end(i);
      continue;
    }
    ended[size_t(d)] = end_here;
    dep[size_t(d)] = dependent;
    std::span<const int32_t> ids = v.ids_at(i);
    if (!ids.empty()) {
      // The rule may end right here (nothing left in this frame) or go on locally.
      const int64_t after = end_here ? 0 : st.distance(level[size_t(d)]);
      m.max_after = std::max(m.max_after, after);
      for (int32_t id : ids) {
        set_bit(accepted, id);
        ++n_accepted;
      }
    }
    ++i;
  }
  std::sort(m.dependent.begin(), m.dependent.end());
  // The smallest of: accepted ids, usable ids not accepted, a bitset.
  const int64_t n_rejected = v.n_usable() - n_accepted;
  const int64_t words = v.words() * 2;  // a uint64 word is two int32 ids
  if (n_accepted <= n_rejected && n_accepted <= words) {
    m.form = NodeMask::Form::Accept;
    for (int32_t id = 0; id < v.size(); ++id)
      if (test_bit(accepted, id)) m.ids.push_back(id);
  } else if (n_rejected <= words) {
    m.form = NodeMask::Form::Reject;
    for (int32_t id = 0; id < v.size(); ++id)
      if (test_bit(v.all(), id) && !test_bit(accepted, id)) m.ids.push_back(id);
  } else {
    m.form = NodeMask::Form::Bits;
    m.bits = std::move(accepted);
  }
  return m;
}

void walk_with_limit(const Automaton& a, const Vocabulary& v, std::span<const int32_t> stack, int64_t limit,
                     std::span<uint64_t> mask) {
  Stepper st(a);
  const int32_t depth = v.max_depth();
  std::vector<StackSet> level(size_t(depth) + 1);
  level[0].add(stack);
  for (int32_t i = 0; i < v.n_nodes();) {
    const int32_t d = v.depth(i);
    const bool done = st.step(level[size_t(d - 1)], v.byte(i), level[size_t(d)]);
    if (level[size_t(d)].empty() && !done) {
      i = v.subtree_end(i);
      continue;
    }
    std::span<const int32_t> ids = v.ids_at(i);
    if (!ids.empty() && (done ? 0 : st.distance(level[size_t(d)])) <= limit)
      for (int32_t id : ids) set_bit(mask, id);
    ++i;
  }
}

}  // namespace dil::grammar
