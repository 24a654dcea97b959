// Thompson construction: each rule of a Builder becomes a byte NFA with epsilon edges and call
// edges (callee rule, return state). Internal to src/grammar (automaton.cpp determinizes it).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "grammar/builder.h"

namespace dil::grammar {

struct NfaCall {
  int32_t rule = -1;
  int32_t target = -1;  // state to continue in once the callee has ended
};

struct NfaState {
  std::vector<std::pair<ByteRange, int32_t>> edges;  // one byte in range -> state
  std::vector<int32_t> eps;
  std::vector<NfaCall> calls;
};

struct RuleNfa {
  std::string name;
  std::vector<NfaState> states;
  int32_t start = 0, end = 0;  // the rule has ended in `end`
};

// Every rule of `b` (bodies defined), plus the rules the compiler outlines: a large child of a
// counted repetition (maxItems, maxLength) becomes a rule of its own called once per copy, so
// the automaton grows with the count, not with count x child size. Throws GrammarError beyond
// o.max_nfa_states.
std::vector<RuleNfa> build_nfas(const Builder& b, const GrammarOptions& o);

}  // namespace dil::grammar
