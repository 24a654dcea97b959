#include "grammar/nfa.h"

#include <algorithm>
#include <array>
#include <map>
#include <unordered_map>

namespace dil::grammar {
namespace {

using Kind = Builder::Kind;
using Id = Builder::Id;

// A repetition whose copies would add more states than this calls its child as a rule instead.
constexpr int64_t kOutlineStates = 192;

class Compiler {
 public:
  Compiler(const Builder& b, const GrammarOptions& o) : b_(b), o_(o) {
    for (int32_t r = 0; r < b.n_rules(); ++r) {
      DIL_CHECK(b.rule_body(r) >= 0, "rule '", b.rule_name(r), "' has no body");
      bodies_.push_back({b.rule_body(r), b.rule_name(r)});
    }
  }

  std::vector<RuleNfa> run() {
    std::vector<RuleNfa> out;
    for (size_t r = 0; r < bodies_.size(); ++r) {  // outlining appends to bodies_
      cur_ = RuleNfa{};
      cur_.name = bodies_[r].second;
      cur_.start = add();
      cur_.end = compile(bodies_[r].first, cur_.start);
      out.push_back(std::move(cur_));
    }
    return out;
  }

 private:
  int32_t add() {
    if (++total_ > o_.max_nfa_states)
      throw GrammarError(str_cat("the grammar is too large (more than ", o_.max_nfa_states, " automaton states)"));
    cur_.states.emplace_back();
    return int32_t(cur_.states.size() - 1);
  }
  void eps(int32_t a, int32_t b) { cur_.states[size_t(a)].eps.push_back(b); }
  void edge(int32_t a, ByteRange r, int32_t b) { cur_.states[size_t(a)].edges.push_back({r, b}); }

  // States the expression adds when compiled once (an estimate for outlining).
  int64_t size(Id e) {
    auto it = size_memo_.find(e);
    if (it != size_memo_.end()) return it->second;
    const Builder::Node& n = b_.node(e);
    int64_t s = 1;
    switch (n.kind) {
      case Kind::Empty: case Kind::Nothing: case Kind::Bytes: case Kind::Call: s = 1; break;
      case Kind::Literal: s = int64_t(n.bytes.size()); break;
      case Kind::Seq: s = 0; for (Id k : n.kids) s += size(k); break;
      case Kind::Alt: s = 1; for (Id k : n.kids) s += size(k) + 1; break;
      case Kind::Repeat: s = 2 + size(n.kids[0]) * copies(n); break;
      case Kind::Members:
        s = 2;
        for (size_t i = 0; i + 2 < n.kids.size(); ++i) s += size(n.kids[i]) + size(n.kids[n.kids.size() - 2]) + 3;
        break;
      case Kind::TextWithout: s = 2; for (const auto& f : n.forbidden) s += int64_t(f.size()); break;
    }
    s = std::min<int64_t>(s, int64_t(1) << 40);
    size_memo_[e] = s;
    return s;
  }
  static int64_t copies(const Builder::Node& n) { return std::max(n.min, 1) + (n.max < 0 ? 1 : n.max - n.min); }

  // The rule that `e` becomes when outlined (one per expression).
  int32_t outline(Id e) {
    auto it = outlined_.find(e);
    if (it != outlined_.end()) return it->second;
    const int32_t r = int32_t(bodies_.size());
    bodies_.push_back({e, str_cat(bodies_[0].second, "#item", r)});
    outlined_[e] = r;
    return r;
  }

  // Compiles `e` starting in state `from`; returns the state where it ends.
  int32_t compile(Id e, int32_t from) {
    const Builder::Node& n = b_.node(e);
    switch (n.kind) {
      case Kind::Empty: return from;
      case Kind::Nothing: return add();  // an end nothing reaches
      case Kind::Literal: {
        int32_t s = from;
        for (char c : n.bytes) {
          const int32_t t = add();
          edge(s, {uint8_t(c), uint8_t(c)}, t);
          s = t;
        }
        return s;
      }
      case Kind::Bytes: {
        const int32_t t = add();
        for (const ByteRange& r : n.ranges) edge(from, r, t);
        return t;
      }
      case Kind::Seq: {
        int32_t s = from;
        for (Id k : n.kids) s = compile(k, s);
        return s;
      }
      case Kind::Alt: {
        const int32_t end = add();
        for (Id k : n.kids) {
          const int32_t s = add();
          eps(from, s);
          eps(compile(k, s), end);
        }
        return end;
      }
      case Kind::Call: {
        const int32_t t = add();
        cur_.states[size_t(from)].calls.push_back({n.rule, t});
        return t;
      }
      case Kind::Repeat: return compile_repeat(n, from);
      case Kind::Members: return compile_members(n, from);
      case Kind::TextWithout: return compile_text_without(n, from);
    }
    DIL_CHECK(false, "unknown expression kind");
    return from;
  }

  int32_t compile_repeat(const Builder::Node& n, int32_t from) {
    Id child = n.kids[0];
    // A large child repeated many times is called (one state per copy) rather than copied.
    if (!n.inline_copies && b_.node(child).kind != Kind::Call && copies(n) > 1 && size(child) * copies(n) > kOutlineStates) {
      const int32_t r = outline(child);
      return compile_repeat_of(n, from, [&](int32_t s) {
        const int32_t t = add();
        cur_.states[size_t(s)].calls.push_back({r, t});
        return t;
      });
    }
    return compile_repeat_of(n, from, [&](int32_t s) { return compile(child, s); });
  }

  template <typename F>
  int32_t compile_repeat_of(const Builder::Node& n, int32_t from, F one) {
    int32_t s = from;
    for (int i = 0; i < n.min; ++i) s = one(s);
    if (n.max < 0) {
      // s -> body -> s, exit at s. A fresh loop head keeps earlier edges of `s` out of the loop.
      const int32_t head = add();
      eps(s, head);
      const int32_t body = add();
      eps(head, body);
      eps(one(body), head);
      return head;
    }
    // (x (x (x)?)?)?: each optional copy may only follow the previous one.
    const int32_t end = add();
    for (int i = n.min; i < n.max; ++i) {
      eps(s, end);
      const int32_t body = add();
      eps(s, body);
      s = one(body);
    }
    eps(s, end);
    return end;
  }

  int32_t compile_members(const Builder::Node& n, int32_t from) {
    const size_t m = n.kids.size() - 2;
    const Id sep = n.kids[m], extra = n.kids[m + 1];
    // Track 0: nothing written yet; track 1: something written (a separator comes first).
    int32_t none = from, some = add();
    for (size_t i = 0; i < m; ++i) {
      const int32_t start = add();
      eps(none, start);
      const int32_t sep_start = add();
      eps(some, sep_start);
      eps(compile(sep, sep_start), start);
      const int32_t done = compile(n.kids[i], start);
      int32_t next_none = add(), next_some = add();
      eps(done, next_some);
      if (!n.required[i]) {
        eps(none, next_none);
        eps(some, next_some);
      }
      none = next_none;
      some = next_some;
    }
    if (extra >= 0) {
      DIL_CHECK(n.max < 0, "members: only an unbounded number of extra members is supported");
      const int32_t start = add();
      eps(none, start);
      const int32_t sep_start = add();
      eps(some, sep_start);
      eps(compile(sep, sep_start), start);
      eps(compile(extra, start), some);
    }
    const int32_t end = add();
    eps(none, end);
    eps(some, end);
    return end;
  }

  // Aho-Corasick automaton of the forbidden strings; every state that has not completed one of
  // them may end the text.
  int32_t compile_text_without(const Builder::Node& n, int32_t from) {
    struct Ac {
      std::map<uint8_t, int32_t> next;
      int32_t fail = 0;
      bool out = false;
    };
    std::vector<Ac> ac(1);
    for (const std::string& f : n.forbidden) {
      int32_t s = 0;
      for (char c : f) {
        auto it = ac[size_t(s)].next.find(uint8_t(c));
        if (it == ac[size_t(s)].next.end()) {
          ac.emplace_back();
          const int32_t t = int32_t(ac.size() - 1);
          ac[size_t(s)].next[uint8_t(c)] = t;
          s = t;
        } else {
          s = it->second;
        }
      }
      ac[size_t(s)].out = true;
    }
    // Full transition table by BFS (delta(s, b) = goto or delta(fail(s), b)).
    std::vector<std::array<int32_t, 256>> delta(ac.size());
    std::vector<int32_t> order = {0};
    for (int b = 0; b < 256; ++b) {
      auto it = ac[0].next.find(uint8_t(b));
      delta[0][size_t(b)] = it == ac[0].next.end() ? 0 : it->second;
    }
    for (size_t q = 0; q < order.size(); ++q) {
      const int32_t s = order[q];
      for (auto [c, t] : ac[size_t(s)].next) {
        ac[size_t(t)].fail = s == 0 ? 0 : delta[size_t(ac[size_t(s)].fail)][c];
        ac[size_t(t)].out = ac[size_t(t)].out || ac[size_t(ac[size_t(t)].fail)].out;
        for (int b = 0; b < 256; ++b) {
          auto it = ac[size_t(t)].next.find(uint8_t(b));
          delta[size_t(t)][size_t(b)] = it == ac[size_t(t)].next.end() ? delta[size_t(ac[size_t(t)].fail)][size_t(b)] : it->second;
        }
        order.push_back(t);
      }
    }
    std::vector<int32_t> st(ac.size(), -1);
    for (size_t s = 0; s < ac.size(); ++s)
      if (!ac[s].out) st[s] = add();
    const int32_t end = add();
    eps(from, st[0]);
    for (size_t s = 0; s < ac.size(); ++s) {
      if (ac[s].out) continue;
      eps(st[s], end);
      for (int b = 0; b < 256;) {
        const int32_t t = delta[s][size_t(b)];
        int e = b;
        while (e + 1 < 256 && delta[s][size_t(e + 1)] == t) ++e;
        if (!ac[size_t(t)].out) edge(st[s], {uint8_t(b), uint8_t(e)}, st[size_t(t)]);
        b = e + 1;
      }
    }
    return end;
  }

  const Builder& b_;
  const GrammarOptions& o_;
  std::vector<std::pair<Id, std::string>> bodies_;  // rules of the builder, then outlined ones
  std::unordered_map<Id, int32_t> outlined_;
  std::unordered_map<Id, int64_t> size_memo_;
  RuleNfa cur_;
  int64_t total_ = 0;
};

}  // namespace

std::vector<RuleNfa> build_nfas(const Builder& b, const GrammarOptions& o) { return Compiler(b, o).run(); }

}  // namespace dil::grammar
