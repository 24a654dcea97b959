// Structured output: a grammar compiled against a vocabulary, and the per-request matcher that
// turns its state into a token mask before each sampling step and advances by the sampled
// token. Front ends that build grammars: json_schema.h (JSON Schema, json_object), regex.h
// (regex, choice); callers compose them with Builder (builder.h).
//
//   auto g = std::make_shared<CompiledGrammar>(compile(builder, root, opts), vocab);
//   Matcher m(g);
//   m.fill_mask(mask, remaining);   // before sampling: allowed token ids (EOS excluded)
//   m.advance(token);               // after sampling
//   m.accepting();                  // the output so far is complete: EOS may end it
#pragma once
#include <atomic>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>

#include "grammar/automaton.h"
#include "grammar/mask_cache.h"
#include "grammar/stack.h"
#include "grammar/vocab.h"

namespace dil::grammar {

// An automaton bound to a vocabulary, with the per-node mask cache. Thread-safe: requests on
// several threads may share one (the cache fills lazily under a lock, reads are lock-free).
class CompiledGrammar {
 public:
  CompiledGrammar(Automaton a, std::shared_ptr<const Vocabulary> v);
  CompiledGrammar(const CompiledGrammar&) = delete;
  CompiledGrammar& operator=(const CompiledGrammar&) = delete;

  const Automaton& automaton() const { return a_; }
  const Vocabulary& vocab() const { return *v_; }
  const NodeMask& node_mask(int32_t node) const;
  int64_t cached_nodes() const;

 private:
  Automaton a_;
  std::shared_ptr<const Vocabulary> v_;
  std::unique_ptr<std::atomic<const NodeMask*>[]> slots_;  // [n_nodes]
  mutable std::mutex mu_;
  mutable std::vector<std::unique_ptr<NodeMask>> owned_;
};

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> g);

  // Consumes a token's bytes; false (state unchanged) when the grammar does not allow them.
  bool advance(int32_t token);
  bool advance_bytes(std::string_view bytes);
  // The output so far is complete (end-of-sequence may follow).
  bool accepting() const { return accepting_; }
  // Some byte may still follow.
  bool can_continue() const { return !stacks_.empty(); }
  // Fewest bytes to a complete output (0 when accepting).
  int64_t distance() const;

  // Sets mask bit t (mask[t / 64] >> t % 64) for every token that may come next; `mask` has
  // vocab().words() words. Never sets end-of-sequence tokens (their text is not output; the
  // caller allows them when accepting()). `remaining`: how many tokens may still follow this
  // one (< 0: no limit). With a limit, the mask keeps the output completable in time: a token
  // is allowed only if the fewest bytes left after it fit in `remaining` (every byte is a
  // token of a byte-level BPE, so a byte count bounds the token count); when even that cannot
  // hold (distance() - 1 > remaining), only the tokens that leave the fewest bytes.
  void fill_mask(std::span<uint64_t> mask, int64_t remaining);

  const CompiledGrammar& grammar() const { return *g_; }

 private:
  bool step_bytes(std::string_view bytes, StackSet& from, StackSet& to, bool* ended);
  void fill(std::span<uint64_t> mask, int64_t limit);

  std::shared_ptr<const CompiledGrammar> g_;
  Stepper step_;
  StackSet stacks_;
  bool accepting_ = false;
  StackSet a_, b_;  // scratch for simulations
  std::vector<uint64_t> scratch_;
};

}  // namespace dil::grammar
