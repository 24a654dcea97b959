#include "grammar/stack.h"

#include <algorithm>

namespace dil::grammar {

bool StackSet::contains(std::span<const int32_t> s) const {
  for (int32_t i = 0; i < size(); ++i) {
    std::span<const int32_t> t = (*this)[i];
    if (t.size() == s.size() && std::equal(t.begin(), t.end(), s.begin())) return true;
  }
  return false;
}

bool Stepper::close(std::span<const int32_t> stack, StackSet& out) {
  work_.clear();
  seen_.clear();
  work_.add(stack);
  bool ended = false;
  while (!work_.empty()) {
    std::span<const int32_t> w = work_[work_.size() - 1];
    tmp_.assign(w.begin(), w.end());
    work_.pop_back();
    if (seen_.contains(tmp_)) continue;  // left recursion, nullable loops
    seen_.add(tmp_);
    const int32_t top = tmp_.back();
    if (a_.has_bytes(top) && !out.contains(tmp_)) out.add(tmp_);
    if (a_.flags[size_t(top)] & Automaton::kCalls) {
      if (int32_t(tmp_.size()) < a_.max_depth) {
        for (const Call* c = a_.calls_begin(top); c != a_.calls_end(top); ++c) {
          mod_.assign(tmp_.begin(), tmp_.end());
          mod_.back() = c->ret;
          mod_.push_back(a_.rule_start[size_t(c->rule)]);
          work_.add(mod_);
        }
      }
    }
    if (a_.is_final(top)) {
      if (tmp_.size() == 1) ended = true;
      else work_.add(std::span<const int32_t>(tmp_.data(), tmp_.size() - 1));
    }
  }
  return ended;
}

bool Stepper::step(const StackSet& in, uint8_t byte, StackSet& out) {
  out.clear();
  bool ended = false;
  for (int32_t i = 0; i < in.size(); ++i) {
    std::span<const int32_t> s = in[i];
    const int32_t t = a_.next(s.back(), byte);
    if (t < 0) continue;
    cur_.assign(s.begin(), s.end());
    cur_.back() = t;
    if (a_.simple(t)) {
      if (out.empty() || !out.contains(cur_)) out.add(cur_);
    } else {
      ended = close(cur_, out) || ended;
    }
  }
  return ended;
}

int64_t Stepper::distance(const StackSet& s) const {
  int64_t d = Automaton::kInf;
  for (int32_t i = 0; i < s.size(); ++i) d = std::min(d, distance(s[i]));
  return d;
}

}  // namespace dil::grammar
