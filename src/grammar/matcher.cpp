#include <algorithm>

#include "grammar/grammar.h"

namespace dil::grammar {

CompiledGrammar::CompiledGrammar(Automaton a, std::shared_ptr<const Vocabulary> v)
    : a_(std::move(a)), v_(std::move(v)), slots_(new std::atomic<const NodeMask*>[size_t(a_.n_nodes())]) {
  DIL_CHECK(v_ != nullptr, "CompiledGrammar without a vocabulary");
  for (int32_t n = 0; n < a_.n_nodes(); ++n) slots_[size_t(n)].store(nullptr, std::memory_order_relaxed);
}

const NodeMask& CompiledGrammar::node_mask(int32_t node) const {
  if (const NodeMask* m = slots_[size_t(node)].load(std::memory_order_acquire)) return *m;
  // Built outside the lock (it walks the vocabulary); a concurrent duplicate is dropped.
  auto built = std::make_unique<NodeMask>(build_node_mask(a_, *v_, node));
  std::lock_guard<std::mutex> lk(mu_);
  if (const NodeMask* m = slots_[size_t(node)].load(std::memory_order_acquire)) return *m;
  const NodeMask* p = built.get();
  owned_.push_back(std::move(built));
  slots_[size_t(node)].store(p, std::memory_order_release);
  return *p;
}

int64_t CompiledGrammar::cached_nodes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return int64_t(owned_.size());
}

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> g) : g_(std::move(g)), step_(g_->automaton()) {
  const Automaton& a = g_->automaton();
  const int32_t start[1] = {a.rule_start[size_t(a.root)]};
  accepting_ = step_.close(start, stacks_);
  scratch_.assign(size_t(g_->vocab().words()), 0);
}

bool Matcher::step_bytes(std::string_view bytes, StackSet& from, StackSet& to, bool* ended) {
  *ended = false;
  for (size_t k = 0; k < bytes.size(); ++k) {
    if (from.empty()) return false;  // something ended, but bytes are left
    *ended = step_.step(from, uint8_t(bytes[k]), to);
    std::swap(from, to);
    if (from.empty() && !*ended) return false;
  }
  return true;
}

bool Matcher::advance_bytes(std::string_view bytes) {
  if (bytes.empty()) return true;
  a_ = stacks_;
  bool ended = false;
  if (!step_bytes(bytes, a_, b_, &ended)) return false;
  std::swap(stacks_, a_);
  accepting_ = ended;
  return true;
}

bool Matcher::advance(int32_t token) {
  if (token < 0 || token >= g_->vocab().size()) return false;
  const std::string& b = g_->vocab().bytes(token);
  return !b.empty() && advance_bytes(b);
}

int64_t Matcher::distance() const { return accepting_ ? 0 : step_.distance(stacks_); }

void Matcher::fill(std::span<uint64_t> mask, int64_t limit) {
  const Automaton& a = g_->automaton();
  const Vocabulary& v = g_->vocab();
  for (int32_t i = 0; i < stacks_.size(); ++i) {
    std::span<const int32_t> s = stacks_[i];
    const NodeMask& nm = g_->node_mask(s.back());
    const int64_t below = step_.distance(s.first(s.size() - 1));
    if (below + nm.max_after > limit) {
      // Some accepted token could leave too much to write: decide each one on this stack.
      walk_with_limit(a, v, s, limit, mask);
      continue;
    }
    nm.apply(mask, v.all(), scratch_);
    for (int32_t id : nm.dependent) {
      if (test_bit(mask, id)) continue;
      a_.clear();
      a_.add(s);
      bool ended = false;
      if (step_bytes(v.bytes(id), a_, b_, &ended) && (ended ? 0 : step_.distance(a_)) <= limit) set_bit(mask, id);
    }
  }
}

void Matcher::fill_mask(std::span<uint64_t> mask, int64_t remaining) {
  DIL_CHECK(int64_t(mask.size()) == g_->vocab().words(), "mask of ", mask.size(), " words for a vocabulary of ",
            g_->vocab().words());
  std::fill(mask.begin(), mask.end(), 0);
  if (stacks_.empty()) return;
  const int64_t unlimited = Automaton::kInf;
  if (remaining >= 0 && remaining < distance() - 1) {
    // Over budget (the bytes left exceed the tokens left; a token may hold several bytes):
    // only the tokens that bring the end closest.
    std::vector<std::pair<int32_t, int64_t>> cand;
    int64_t best = unlimited;
    for (int32_t i = 0; i < stacks_.size(); ++i)
      walk_distances(g_->automaton(), g_->vocab(), stacks_[i], [&](int32_t id, int64_t d) {
        cand.push_back({id, d});
        best = std::min(best, d);
      });
    for (auto [id, d] : cand)
      if (d <= best) set_bit(mask, id);
    return;
  }
  // Within budget: a token may leave at most `remaining` bytes. The next byte of a shortest
  // completion is always a token, so the budget stays met once it is.
  const int64_t limit = remaining < 0 ? unlimited : remaining;
  fill(mask, limit);
  if (limit < unlimited && std::all_of(mask.begin(), mask.end(), [](uint64_t w) { return w == 0; }))
    fill(mask, unlimited);  // a shortest path beyond max_depth: rather any token than none
}

}  // namespace dil::grammar
