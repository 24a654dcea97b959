// Token masks per automaton node (xgrammar's adaptive token mask cache).
//
// From a node n of rule r, walking the vocabulary trie with only n's own frame (pushes of
// callees allowed) sorts every token into one of three kinds:
//  - accepted: its bytes are consumed without leaving r (or r ends exactly at its last byte):
//    valid whatever the stack below n is;
//  - rejected: no path consumes it, and none leaves r with bytes left whose next byte can
//    follow r anywhere in the grammar (Automaton::follow);
//  - context-dependent: r can end inside it with a possible next byte: only the full stack
//    decides, so the matcher checks these few tokens against it at every step.
// So a step costs the stored accepted set plus the context-dependent checks, whatever the
// vocabulary size. Built lazily, once per node, shared by every request of the grammar.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "grammar/automaton.h"
#include "grammar/stack.h"
#include "grammar/vocab.h"

namespace dil::grammar {

struct NodeMask {
  // The accepted set is stored the smallest way: a list of accepted ids, a list of the usable
  // ids that are not accepted, or a bitset.
  enum class Form : uint8_t { Accept, Reject, Bits };
  Form form = Form::Accept;
  std::vector<int32_t> ids;
  std::vector<uint64_t> bits;  // [vocab words]
  std::vector<int32_t> dependent;  // context-dependent token ids
  // Largest distance left in n's own frame (and its pushes) after an accepted token: when the
  // budget leaves room for it, no accepted token needs a distance check.
  int64_t max_after = 0;

  // mask |= accepted. `scratch` has the mask's size.
  void apply(std::span<uint64_t> mask, std::span<const uint64_t> all, std::span<uint64_t> scratch) const;
};

NodeMask build_node_mask(const Automaton& a, const Vocabulary& v, int32_t node);

// Exact walk from a whole stack: mask |= every token it accepts whose distance after the token
// is at most `limit`. What the matcher does when the budget is tight (no cache: the distances
// depend on the stack).
void walk_with_limit(const Automaton& a, const Vocabulary& v, std::span<const int32_t> stack, int64_t limit,
                     std::span<uint64_t> mask);
// Every token the stack accepts with the fewest bytes left after it: on(id, distance).
void walk_distances(const Automaton& a, const Vocabulary& v, std::span<const int32_t> stack,
                    const std::function<void(int32_t, int64_t)>& on);

inline void set_bit(std::span<uint64_t> m, int32_t id) { m[size_t(id) / 64] |= uint64_t(1) << (id % 64); }
inline bool test_bit(std::span<const uint64_t> m, int32_t id) { return (m[size_t(id) / 64] >> (id % 64)) & 1; }

}  // namespace dil::grammar
