// The compiled grammar: one deterministic automaton per rule over byte classes, with call
// edges between rules (a pushdown automaton). Immutable once built; shared by every request
// that uses the same grammar.
//
// A run-time position is a stack of nodes: the top is where the current rule is, the ones
// below are where each caller continues once its callee ends (return nodes). A node may
//  - consume a byte (trans), going to another node of the same rule;
//  - call a rule (calls): the top becomes the return node and the callee's start is pushed;
//  - end its rule (final): the top is popped, the caller continues at its return node.
// The output is complete when the root rule ends with nothing below it.
#pragma once
#include <array>
#include <bitset>
#include <cstdint>
#include <string>
#include <vector>

#include "grammar/builder.h"

namespace dil::grammar {

struct Call {
  int32_t rule = -1;
  int32_t ret = -1;  // node of the calling rule to continue in
};

struct Automaton {
  static constexpr uint8_t kFinal = 1, kBytes = 2, kCalls = 4;
  static constexpr int32_t kInf = INT32_MAX / 4;

  int32_t n_classes = 0;
  std::array<uint8_t, 256> byte_class{};  // byte -> class (bytes no edge tells apart share one)
  std::vector<int32_t> trans;             // [n_nodes, n_classes] next node, -1: no edge
  std::vector<uint8_t> flags;             // [n_nodes] kFinal | kBytes | kCalls
  std::vector<int32_t> call_begin;        // [n_nodes + 1] into `calls`
  std::vector<Call> calls;
  std::vector<int32_t> node_rule;         // [n_nodes]
  std::vector<int32_t> rule_start;        // [n_rules]
  std::vector<std::string> rule_name;     // [n_rules]
  // [n_nodes] fewest bytes from the node to the end of its rule (callees at their shortest):
  // what the budget steering (matcher.h) sums over a stack.
  std::vector<int32_t> dist;
  // [n_rules] bytes that can come right after the rule has ended (in any caller, or nothing
  // for the root): a token that leaves the rule must continue with one of them.
  std::vector<std::bitset<256>> follow;
  int32_t root = 0;
  int max_depth = 24;

  int32_t n_nodes() const { return int32_t(flags.size()); }
  int32_t next(int32_t node, uint8_t byte) const { return trans[size_t(node) * size_t(n_classes) + byte_class[byte]]; }
  bool is_final(int32_t n) const { return flags[size_t(n)] & kFinal; }
  bool has_bytes(int32_t n) const { return flags[size_t(n)] & kBytes; }
  // Only byte edges: a step into it needs no stack work (the fast path of every walk).
  bool simple(int32_t n) const { return flags[size_t(n)] == kBytes; }
  const Call* calls_begin(int32_t n) const { return calls.data() + call_begin[size_t(n)]; }
  const Call* calls_end(int32_t n) const { return calls.data() + call_begin[size_t(n) + 1]; }
};

// Builds the automaton of `root` and every rule it reaches. Throws GrammarError when a limit of
// `o` is exceeded or when the root admits no finite output (e.g. a required property whose
// schema can only recurse).
Automaton compile(const Builder& b, int32_t root, const GrammarOptions& o);

}  // namespace dil::grammar
