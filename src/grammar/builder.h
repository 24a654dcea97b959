// The grammar IR: expressions over bytes (literals, byte sets, sequences, alternatives, bounded
// repetition, calls of named rules) that the front ends (JSON Schema, regex, choice, the DSML
// tool-call format) build and `compile` (automaton.h) turns into one pushdown automaton.
//
// Rules are the only recursion: a rule's body may call any rule, itself included, and the
// automaton keeps the calls on a stack (bounded by GrammarOptions::max_depth). Everything else
// is inlined into the calling rule's finite automaton, so most tokens are decided by the
// automaton state alone (context-independent, see mask_cache.h).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/check.h"

namespace dil::grammar {

// A schema, regex or grammar the engine cannot compile: a user error (HTTP 400). `keyword`
// names the offending JSON Schema keyword or regex feature, `path` where it is (a JSON
// pointer into the schema, or an offset into the regex).
class GrammarError : public dil::Error {
 public:
  GrammarError(const std::string& msg, std::string kw = "", std::string at = "")
      : dil::Error(msg), keyword(std::move(kw)), path(std::move(at)) {}
  std::string keyword, path;
};

struct GrammarOptions {
  // JSON: whitespace between tokens is at most this many bytes of [ \n\t] (0: compact JSON).
  // Bounded so that a model cannot spend its budget on whitespace (xgrammar's
  // max_whitespace_cnt; vLLM's disable_any_whitespace is 0).
  int max_whitespace = 2;
  // JSON Schema: false -> additionalProperties true/schema adds no keys beyond the declared
  // ones (vLLM's disable_additional_properties; a subset, so still valid).
  bool additional_properties = true;
  // Nesting of rule calls at run time: recursive $ref and free JSON values end at this depth.
  int max_depth = 24;
  // Automaton size limits (a schema or regex beyond them is refused, not truncated).
  int max_nfa_states = 1 << 20;
  int max_dfa_states = 1 << 17;
};

struct ByteRange {
  uint8_t lo = 0, hi = 0;
};

class Builder {
 public:
  using Id = int32_t;  // an expression
  enum class Kind : uint8_t { Empty, Nothing, Literal, Bytes, Seq, Alt, Repeat, Call, Members, TextWithout };

  struct Node {
    Kind kind = Kind::Empty;
    std::vector<Id> kids;                 // Seq, Alt; Repeat: {child}; Members: members then {sep, extra}
    std::string bytes;                    // Literal
    std::vector<ByteRange> ranges;        // Bytes (one byte out of these ranges)
    std::vector<std::string> forbidden;   // TextWithout
    std::vector<uint8_t> required;        // Members: per member
    int min = 0, max = 0;                 // Repeat (max < 0: unbounded); Members: extra count bound
  bool inline_copies = false;           // Repeat: never outline the child (see nfa.h)
    int32_t rule = -1;                    // Call
  };

  Id empty();
  Id nothing();  // matches no string (an unsatisfiable branch)
  Id literal(std::string_view bytes);
  Id bytes_in(std::vector<ByteRange> ranges);  // one byte
  Id byte(uint8_t b) { return bytes_in({{b, b}}); }
  Id seq(std::vector<Id> parts);
  Id alt(std::vector<Id> options);
  // e{min,max}; max < 0: unbounded. inline_copies: copy the child even when large (string
  // characters: a rule boundary per character would make every multi-character token
  // context-dependent).
  Id repeat(Id e, int min, int max, bool inline_copies = false);
  Id optional(Id e) { return repeat(e, 0, 1); }
  // JSON-object-like member lists without duplicating any member: `members` in their order,
  // each present or (when not required) skipped, `sep` between two present ones; then up to
  // `extra_max` (< 0: any number) `extra` members (extra < 0: none).
  Id members(const std::vector<std::pair<Id, bool>>& items, Id sep, Id extra, int extra_max);
  // Any byte string in which none of `forbidden` occurs (free text around markup).
  Id text_without(std::vector<std::string> forbidden);

  int32_t add_rule(std::string name);  // body defined later (define), so rules may recurse
  void define(int32_t rule, Id body);
  Id call(int32_t rule);

  const Node& node(Id e) const { return nodes_[size_t(e)]; }
  int32_t n_rules() const { return int32_t(rule_body_.size()); }
  Id rule_body(int32_t r) const { return rule_body_[size_t(r)]; }
  const std::string& rule_name(int32_t r) const { return rule_name_[size_t(r)]; }

 private:
  Id add(Node n);
  std::vector<Node> nodes_;
  std::vector<Id> rule_body_;
  std::vector<std::string> rule_name_;
};

}  // namespace dil::grammar
