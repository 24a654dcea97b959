// Structured output in the server: the request fields that constrain the output, the grammar
// they compile to (cached by what it depends on), and the per-choice engine constraint.
//
// Fields (chat and completions): response_format {type: text | json_object | json_schema
// {name, schema, strict}}; vLLM's guided_json, guided_regex, guided_choice (guided_grammar:
// 400) and structured_outputs {json, regex, choice, json_object, disable_any_whitespace,
// disable_additional_properties, disable_fallback}. At most one of them. Chat also:
// tool_choice "required" / a named function force a DSML tool call whose parameters follow
// the tool's JSON schema; "none" (with tools) forbids DSML; in thinking mode free reasoning
// comes first, then </think>, then the constrained part.
#pragma once
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "dil/engine.h"
#include "grammar/grammar.h"
#include "server/output_format.h"
#include "server/protocol.h"
#include "tokenizer/tokenizer.h"

namespace dil::server {

// Everything a request's grammar depends on.
struct StructuredSpec {
  OutputFormat format;
  bool chat = false;
  bool thinking = false;                     // chat: the prompt ended with <think>
  tok::PromptFormat prompt_format = tok::PromptFormat::V4;
  std::string tool_choice = "auto";          // chat: none | auto | required | function
  std::string tool_name;                     // tool_choice function
  Json tools;                                // the tools offered (null: none)
  bool parallel_tool_calls = true;
  bool has_tools_for_none = false;           // tool_choice none with tools sent: forbid DSML
};

// Compiled grammars by spec, least recently used first out. Thread-safe.
class GrammarCache {
 public:
  GrammarCache(const tok::Tokenizer& t, int64_t n_ids, size_t capacity = 64);
  // Null when the spec constrains nothing. ApiError 400 naming the field (and the schema
  // keyword) when it cannot be compiled.
  std::shared_ptr<const grammar::CompiledGrammar> get(const StructuredSpec& s);
  size_t size() const;

 private:
  std::shared_ptr<const grammar::Vocabulary> chat_vocab_, text_vocab_;
  size_t capacity_;
  mutable std::mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<const grammar::CompiledGrammar>>> lru_;  // front: newest
  std::unordered_map<std::string, decltype(lru_)::iterator> index_;
};

// A fresh matcher of `g` for one choice, as the engine's constraint (null for a null grammar).
std::shared_ptr<TokenConstraint> make_constraint(std::shared_ptr<const grammar::CompiledGrammar> g);

}  // namespace dil::server
