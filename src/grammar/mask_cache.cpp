#include "grammar/mask_cache.h"

#include <algorithm>

namespace dil::grammar {
namespace {

// Walks the vocabulary trie from one stack. A level (the positions after the bytes of one
// trie node) is kept as just its top node while it is the start stack with only the top
// changed and that top is simple (the common case: inside a string, a number, a literal):
// one table lookup per trie node. Otherwise it is a full StackSet.
//
// visit(i, alive, ended, dist) is called for every trie node i whose parent level is alive:
// alive = some stack consumed the node's bytes, ended = the bottom frame ended right after
// them, dist() = the smallest distance of the level (alive only). It returns whether to walk
// the node's subtree (below a dead level every node is dead again, but still visited).
class TrieWalker {
 public:
  TrieWalker(const Automaton& a, const Vocabulary& v, std::span<const int32_t> start)
      : a_(a), v_(v), st_(a), prefix_(start.first(start.size() - 1)), levels_(size_t(v.max_depth()) + 1) {
    prefix_dist_ = st_.distance(prefix_);
    levels_[0].top = start.back();
  }

  template <typename Visit>
  void run(Visit&& visit) {
    const int32_t n = v_.n_nodes();
    for (int32_t i = 0; i < n;) {
      const Vocabulary::Node& node = v_.node(i);
      const int32_t d = node.depth;
      Level& cur = levels_[size_t(d)];
      const Level& from = levels_[size_t(d - 1)];
      bool ended = false;
      // The fast path inline: one lookup, the top stays simple.
      const int32_t t = from.top >= 0 ? a_.next(from.top, node.byte) : -1;
      if (t >= 0 && a_.simple(t)) {
        cur.top = t;
        if (!cur.set.empty()) cur.set.clear();
      } else {
        ended = step(from, node.byte, cur);
      }
      const bool alive = cur.top >= 0 || !cur.set.empty();
      auto dist = [&] { return cur.top >= 0 ? prefix_dist_ + a_.dist[size_t(cur.top)] : st_.distance(cur.set); };
      if (!visit(i, alive, ended, dist)) {
        i = node.end;
        continue;
      }
      ++i;
    }
  }

 private:
  struct Level {
    int32_t top = -1;  // >= 0: the start stack with this (simple) top; else `set`
    StackSet set;
  };

  bool step(const Level& from, uint8_t b, Level& to) {
    to.top = -1;
    if (!to.set.empty()) to.set.clear();
    if (from.top >= 0) {
      const int32_t t = a_.next(from.top, b);
      if (t < 0) return false;
      if (a_.simple(t)) {
        to.top = t;
        return false;
      }
      tmp_.assign(prefix_.begin(), prefix_.end());
      tmp_.push_back(t);
      return st_.close(tmp_, to.set);
    }
    if (from.set.empty()) return false;
    return st_.step(from.set, b, to.set);
  }

  const Automaton& a_;
  const Vocabulary& v_;
  Stepper st_;
  std::span<const int32_t> prefix_;
  int64_t prefix_dist_ = 0;
  std::vector<Level> levels_;
  std::vector<int32_t> tmp_;
};

}  // namespace

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
  // ended[d]: n's rule can end right after d bytes; dep[d]: the tokens below may continue in
  // the caller (an earlier end whose next byte can follow the rule).
  const size_t depth = size_t(v.max_depth()) + 1;
  std::vector<uint8_t> ended(depth, 0), dep(depth, 0);
  const std::bitset<256>& follow = a.follow[size_t(a.node_rule[size_t(node)])];
  std::vector<uint64_t> accepted(size_t(v.words()), 0);
  NodeMask m;
  int64_t n_accepted = 0;
  const int32_t start[1] = {node};
  TrieWalker(a, v, start).run([&](int32_t i, bool alive, bool end_here, auto dist) {
    const size_t d = size_t(v.depth(i));
    const bool dependent = dep[d - 1] || (ended[d - 1] && follow.test(v.byte(i)));
    if (!alive && !end_here) {
      if (dependent)
        for (int32_t j = i; j < v.subtree_end(i); ++j)
          for (int32_t id : v.ids_at(j)) m.dependent.push_back(id);
      return false;
    }
    ended[d] = end_here;
    dep[d] = dependent;
    std::span<const int32_t> ids = v.ids_at(i);
    if (!ids.empty()) {
      // The rule may end right here (nothing left in this frame) or go on locally.
      m.max_after = std::max<int64_t>(m.max_after, end_here ? 0 : dist());
      for (int32_t id : ids) {
        set_bit(accepted, id);
        ++n_accepted;
      }
    }
    // A dead level that ended: its subtree can only continue in the caller (dependent).
    return true;
  });
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
  TrieWalker(a, v, stack).run([&](int32_t i, bool alive, bool done, auto dist) {
    if (!alive && !done) return false;
    std::span<const int32_t> ids = v.ids_at(i);
    if (!ids.empty() && (done ? 0 : dist()) <= limit)
      for (int32_t id : ids) set_bit(mask, id);
    return true;
  });
}

}  // namespace dil::grammar

namespace dil::grammar {

void walk_distances(const Automaton& a, const Vocabulary& v, std::span<const int32_t> stack,
                    const std::function<void(int32_t, int64_t)>& on) {
  TrieWalker(a, v, stack).run([&](int32_t i, bool alive, bool done, auto dist) {
    if (!alive && !done) return false;
    std::span<const int32_t> ids = v.ids_at(i);
    if (!ids.empty()) {
      const int64_t d = done ? 0 : dist();
      for (int32_t id : ids) on(id, d);
    }
    return true;
  });
}

}  // namespace dil::grammar
