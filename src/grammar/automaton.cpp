// NFA -> per-rule DFA (subset construction over byte classes), then the two static analyses
// the matcher relies on: distances to the end of each rule (budget steering; nodes that cannot
// finish are cut away) and the bytes that may follow each rule (mask cache pruning).
#include <algorithm>
#include <map>
#include <queue>
#include <unordered_map>

#include "grammar/automaton.h"
#include "grammar/nfa.h"

namespace dil::grammar {
namespace {

struct VecHash {
  size_t operator()(const std::vector<int32_t>& v) const {
    uint64_t h = 1469598103934665603ull;
    for (int32_t x : v) h = (h ^ uint64_t(uint32_t(x))) * 1099511628211ull;
    return size_t(h);
  }
};

// Coarsest partition of the bytes that no edge of any rule tells apart.
void byte_classes(const std::vector<RuleNfa>& nfas, Automaton& a) {
  std::vector<uint16_t> ranges;  // lo << 8 | hi, distinct
  for (const RuleNfa& r : nfas)
    for (const NfaState& s : r.states)
      for (const auto& [br, t] : s.edges) ranges.push_back(uint16_t(br.lo << 8 | br.hi));
  std::sort(ranges.begin(), ranges.end());
  ranges.erase(std::unique(ranges.begin(), ranges.end()), ranges.end());
  std::array<int32_t, 256> cls{};
  int32_t n = 1;
  for (uint16_t rg : ranges) {
    const int lo = rg >> 8, hi = rg & 0xff;
    std::map<std::pair<int32_t, bool>, int32_t> renum;
    for (int b = 0; b < 256; ++b) {
      auto key = std::make_pair(cls[size_t(b)], b >= lo && b <= hi);
      auto it = renum.find(key);
      if (it == renum.end()) it = renum.emplace(key, int32_t(renum.size())).first;
      cls[size_t(b)] = it->second;
    }
    n = int32_t(renum.size());
  }
  a.n_classes = n;
  for (int b = 0; b < 256; ++b) a.byte_class[size_t(b)] = uint8_t(cls[size_t(b)]);
}

class Determinizer {
 public:
  Determinizer(const std::vector<RuleNfa>& nfas, Automaton& a, const GrammarOptions& o) : nfas_(nfas), a_(a), o_(o) {}

  void run() {
    // Classes each distinct range covers.
    for (int32_t r = 0; r < int32_t(nfas_.size()); ++r) {
      a_.rule_start.push_back(-1);
      a_.rule_name.push_back(nfas_[size_t(r)].name);
    }
    std::vector<std::vector<Call>> node_calls;
    for (int32_t r = 0; r < int32_t(nfas_.size()); ++r) determinize(r, node_calls);
    a_.call_begin.assign(size_t(a_.n_nodes()) + 1, 0);
    for (int32_t n = 0; n < a_.n_nodes(); ++n) {
      a_.call_begin[size_t(n)] = int32_t(a_.calls.size());
      for (const Call& c : node_calls[size_t(n)]) a_.calls.push_back(c);
    }
    a_.call_begin[size_t(a_.n_nodes())] = int32_t(a_.calls.size());
  }

 private:
  const std::vector<uint8_t>& classes_of(ByteRange r) {
    const uint16_t key = uint16_t(r.lo << 8 | r.hi);
    auto it = cover_.find(key);
    if (it != cover_.end()) return it->second;
    std::vector<uint8_t> c;
    for (int b = r.lo; b <= r.hi; ++b) c.push_back(a_.byte_class[size_t(b)]);
    std::sort(c.begin(), c.end());
    c.erase(std::unique(c.begin(), c.end()), c.end());
    return cover_.emplace(key, std::move(c)).first->second;
  }

  void close(const RuleNfa& nfa, std::vector<int32_t>& set) {
    ++stamp_;
    std::vector<int32_t> work;
    for (int32_t s : set)
      if (mark_[size_t(s)] != stamp_) {
        mark_[size_t(s)] = stamp_;
        work.push_back(s);
      }
    set.clear();
    while (!work.empty()) {
      const int32_t s = work.back();
      work.pop_back();
      set.push_back(s);
      for (int32_t t : nfa.states[size_t(s)].eps)
        if (mark_[size_t(t)] != stamp_) {
          mark_[size_t(t)] = stamp_;
          work.push_back(t);
        }
    }
    std::sort(set.begin(), set.end());
  }

  void determinize(int32_t r, std::vector<std::vector<Call>>& node_calls) {
    const RuleNfa& nfa = nfas_[size_t(r)];
    mark_.assign(nfa.states.size(), 0);
    stamp_ = 0;
    std::unordered_map<std::vector<int32_t>, int32_t, VecHash> ids;
    std::vector<std::vector<int32_t>> sets;
    auto id_of = [&](std::vector<int32_t> set) {
      close(nfa, set);
      auto it = ids.find(set);
      if (it != ids.end()) return it->second;
      if (a_.n_nodes() >= o_.max_dfa_states)
        throw GrammarError(str_cat("the grammar is too large (more than ", o_.max_dfa_states, " automaton states)"));
      const int32_t id = a_.n_nodes();
      a_.flags.push_back(0);
      a_.node_rule.push_back(r);
      a_.trans.resize(a_.trans.size() + size_t(a_.n_classes), -1);
      node_calls.emplace_back();
      ids.emplace(set, id);
      sets.push_back(std::move(set));
      return id;
    };
    const int32_t first = a_.n_nodes();
    a_.rule_start[size_t(r)] = id_of({nfa.start});
    std::vector<std::vector<int32_t>> tgt(size_t(a_.n_classes));
    for (int32_t k = 0; k < int32_t(sets.size()); ++k) {
      const int32_t node = first + k;
      for (auto& t : tgt) t.clear();
      std::map<int32_t, std::vector<int32_t>> call_tgt;
      bool fin = false;
      for (int32_t s : sets[size_t(k)]) {
        fin = fin || s == nfa.end;
        for (const auto& [br, t] : nfa.states[size_t(s)].edges)
          for (uint8_t c : classes_of(br)) tgt[c].push_back(t);
        for (const NfaCall& c : nfa.states[size_t(s)].calls) call_tgt[c.rule].push_back(c.target);
      }
      uint8_t fl = fin ? Automaton::kFinal : 0;
      for (int32_t c = 0; c < a_.n_classes; ++c) {
        if (tgt[size_t(c)].empty()) continue;
        const int32_t t = id_of(tgt[size_t(c)]);
        a_.trans[size_t(node) * size_t(a_.n_classes) + size_t(c)] = t;
      }
      for (auto& [callee, targets] : call_tgt) {
        const int32_t ret = id_of(targets);  // may grow node_calls: no reference into it across
        node_calls[size_t(node)].push_back({callee, ret});
      }
      a_.flags[size_t(node)] = fl;
    }
  }

  const std::vector<RuleNfa>& nfas_;
  Automaton& a_;
  const GrammarOptions& o_;
  std::unordered_map<uint16_t, std::vector<uint8_t>> cover_;
  std::vector<uint32_t> mark_;
  uint32_t stamp_ = 0;
};

// dist[n] = fewest bytes from n to the end of its rule, callees taken at their shortest
// (minlen). Per rule a reverse Dijkstra with the current minlen of the callees; repeated until
// no minlen changes (each round can only lower them).
void distances(Automaton& a) {
  const int32_t nn = a.n_nodes(), nr = int32_t(a.rule_start.size());
  a.dist.assign(size_t(nn), Automaton::kInf);
  std::vector<int32_t> minlen(size_t(nr), Automaton::kInf);
  // Reverse edges: (pred, callee or -1 for one byte).
  std::vector<std::vector<std::pair<int32_t, int32_t>>> rev(static_cast<size_t>(nn));
  for (int32_t n = 0; n < nn; ++n) {
    std::vector<int32_t> seen;
    for (int32_t c = 0; c < a.n_classes; ++c) {
      const int32_t t = a.trans[size_t(n) * size_t(a.n_classes) + size_t(c)];
      if (t >= 0 && std::find(seen.begin(), seen.end(), t) == seen.end()) {
        seen.push_back(t);
        rev[size_t(t)].push_back({n, -1});
      }
    }
    for (const Call* c = a.calls_begin(n); c != a.calls_end(n); ++c) rev[size_t(c->ret)].push_back({n, c->rule});
  }
  std::vector<std::vector<int32_t>> rule_nodes(static_cast<size_t>(nr));
  for (int32_t n = 0; n < nn; ++n) rule_nodes[size_t(a.node_rule[size_t(n)])].push_back(n);
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t r = 0; r < nr; ++r) {
      using Item = std::pair<int32_t, int32_t>;  // (dist, node)
      std::priority_queue<Item, std::vector<Item>, std::greater<Item>> pq;
      for (int32_t n : rule_nodes[size_t(r)]) {
        a.dist[size_t(n)] = a.is_final(n) ? 0 : Automaton::kInf;
        if (a.is_final(n)) pq.push({0, n});
      }
      while (!pq.empty()) {
        auto [d, n] = pq.top();
        pq.pop();
        if (d != a.dist[size_t(n)]) continue;
        for (auto [p, callee] : rev[size_t(n)]) {
          const int32_t w = callee < 0 ? 1 : minlen[size_t(callee)];
          if (w >= Automaton::kInf) continue;
          const int32_t nd = std::min(Automaton::kInf, d + w);
          if (nd < a.dist[size_t(p)]) {
            a.dist[size_t(p)] = nd;
            pq.push({nd, p});
          }
        }
      }
      const int32_t m = a.dist[size_t(a.rule_start[size_t(r)])];
      if (m != minlen[size_t(r)]) {
        minlen[size_t(r)] = m;
        changed = true;
      }
    }
  }
}

// Nodes that cannot reach the end of their rule are never worth entering: their edges go.
void trim(Automaton& a) {
  const int32_t nn = a.n_nodes();
  auto dead = [&](int32_t n) { return a.dist[size_t(n)] >= Automaton::kInf; };
  std::vector<Call> calls;
  std::vector<int32_t> begin(size_t(nn) + 1, 0);
  for (int32_t n = 0; n < nn; ++n) {
    uint8_t fl = a.flags[size_t(n)] & Automaton::kFinal;
    for (int32_t c = 0; c < a.n_classes; ++c) {
      int32_t& t = a.trans[size_t(n) * size_t(a.n_classes) + size_t(c)];
      if (t >= 0 && dead(t)) t = -1;
      if (t >= 0) fl |= Automaton::kBytes;
    }
    begin[size_t(n)] = int32_t(calls.size());
    for (const Call* c = a.calls_begin(n); c != a.calls_end(n); ++c)
      if (!dead(c->ret) && !dead(a.rule_start[size_t(c->rule)])) {
        calls.push_back(*c);
        fl |= Automaton::kCalls;
      }
    a.flags[size_t(n)] = fl;
  }
  begin[size_t(nn)] = int32_t(calls.size());
  a.calls = std::move(calls);
  a.call_begin = std::move(begin);
}

void follow_sets(Automaton& a) {
  const int32_t nn = a.n_nodes(), nr = int32_t(a.rule_start.size());
  std::vector<std::bitset<256>> class_bytes(size_t(a.n_classes));
  for (int b = 0; b < 256; ++b) class_bytes[a.byte_class[size_t(b)]].set(size_t(b));
  std::vector<std::bitset<256>> first(static_cast<size_t>(nn));
  std::vector<uint8_t> can_end(static_cast<size_t>(nn));
  for (int32_t n = 0; n < nn; ++n) {
    for (int32_t c = 0; c < a.n_classes; ++c)
      if (a.trans[size_t(n) * size_t(a.n_classes) + size_t(c)] >= 0) first[size_t(n)] |= class_bytes[size_t(c)];
    can_end[size_t(n)] = a.is_final(n);
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t n = 0; n < nn; ++n)
      for (const Call* c = a.calls_begin(n); c != a.calls_end(n); ++c) {
        const int32_t s = a.rule_start[size_t(c->rule)];
        std::bitset<256> f = first[size_t(n)] | first[size_t(s)];
        bool e = can_end[size_t(n)];
        if (can_end[size_t(s)]) {
          f |= first[size_t(c->ret)];
          e = e || can_end[size_t(c->ret)];
        }
        if (f != first[size_t(n)] || e != bool(can_end[size_t(n)])) {
          first[size_t(n)] = f;
          can_end[size_t(n)] = e;
          changed = true;
        }
      }
  }
  a.follow.assign(size_t(nr), {});
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t n = 0; n < nn; ++n)
      for (const Call* c = a.calls_begin(n); c != a.calls_end(n); ++c) {
        std::bitset<256> f = a.follow[size_t(c->rule)] | first[size_t(c->ret)];
        if (can_end[size_t(c->ret)]) f |= a.follow[size_t(a.node_rule[size_t(n)])];
        if (f != a.follow[size_t(c->rule)]) {
          a.follow[size_t(c->rule)] = f;
          changed = true;
        }
      }
  }
}

}  // namespace

Automaton compile(const Builder& b, int32_t root, const GrammarOptions& o) {
  DIL_CHECK(root >= 0 && root < b.n_rules(), "compile: unknown root rule ", root);
  const std::vector<RuleNfa> nfas = build_nfas(b, o);
  Automaton a;
  a.root = root;
  a.max_depth = o.max_depth;
  byte_classes(nfas, a);
  Determinizer(nfas, a, o).run();
  distances(a);
  if (a.dist[size_t(a.rule_start[size_t(root)])] >= Automaton::kInf)
    throw GrammarError("the grammar admits no finite output (every alternative recurses forever or is empty)");
  trim(a);
  follow_sets(a);
  return a;
}

}  // namespace dil::grammar
