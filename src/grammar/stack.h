// Run-time positions in an Automaton: stacks of nodes (bottom first, top last) and the one
// step every walk shares: consume a byte, then close (expand calls, pop ended rules).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "grammar/automaton.h"

namespace dil::grammar {

// A small set of stacks in one flat buffer (no allocation once warm).
class StackSet {
 public:
  void clear() {
    data_.clear();
    off_.resize(1);  // off_[0] is always 0
  }
  int32_t size() const { return int32_t(off_.size()) - 1; }
  bool empty() const { return size() == 0; }
  std::span<const int32_t> operator[](int32_t i) const {
    return {data_.data() + off_[size_t(i)], size_t(off_[size_t(i) + 1] - off_[size_t(i)])};
  }
  void add(std::span<const int32_t> s) {
    data_.insert(data_.end(), s.begin(), s.end());
    off_.push_back(int32_t(data_.size()));
  }
  bool contains(std::span<const int32_t> s) const;
  void pop_back() {
    off_.pop_back();
    data_.resize(size_t(off_.back()));
  }

 private:
  std::vector<int32_t> data_;
  std::vector<int32_t> off_{0};
};

class Stepper {
 public:
  explicit Stepper(const Automaton& a) : a_(a) {}
  // Adds to `out` (deduplicated) every stack `stack` can be in without consuming a byte whose
  // top consumes bytes: calls pushed (up to max_depth frames), ended rules popped. Returns
  // true when the bottom frame itself can end (the whole stack is done).
  bool close(std::span<const int32_t> stack, StackSet& out);
  // Every stack of `in` advanced by `byte` and closed, into `out` (cleared first). Returns
  // true when some stack ended completely right after the byte.
  bool step(const StackSet& in, uint8_t byte, StackSet& out);
  // Fewest bytes until the stack is done: the distances of its frames to their rules' ends.
  int64_t distance(std::span<const int32_t> s) const {
    int64_t d = 0;
    for (int32_t n : s) d += a_.dist[size_t(n)];
    return d;
  }
  int64_t distance(const StackSet& s) const;  // the smallest of its stacks (kInf if empty)
  const Automaton& automaton() const { return a_; }

 private:
  const Automaton& a_;
  StackSet work_, seen_;
  std::vector<int32_t> tmp_, mod_, cur_;  // close() uses tmp_/mod_, step() cur_
};

}  // namespace dil::grammar
