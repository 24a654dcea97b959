// Helpers of the grammar tests: small vocabularies and whole-string matching.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"

namespace dil::grammar::testing {

// Every single byte (ids 0..255), then `extra` multi-byte tokens (ids 256...).
inline std::shared_ptr<const Vocabulary> byte_vocab(const std::vector<std::string>& extra = {}) {
  std::vector<std::string> t;
  for (int b = 0; b < 256; ++b) t.push_back(std::string(1, char(b)));
  for (const auto& e : extra) t.push_back(e);
  return std::make_shared<Vocabulary>(std::move(t));
}

// A grammar whose root rule is `body(builder)`.
template <typename F>
std::shared_ptr<const CompiledGrammar> make_grammar(F body, const GrammarOptions& o = {},
                                                    std::shared_ptr<const Vocabulary> v = byte_vocab()) {
  Builder b;
  const int32_t root = b.add_rule("root");
  b.define(root, body(b));
  return std::make_shared<CompiledGrammar>(compile(b, root, o), std::move(v));
}

inline std::shared_ptr<const CompiledGrammar> schema_grammar(const std::string& schema, const GrammarOptions& o = {},
                                                             std::shared_ptr<const Vocabulary> v = byte_vocab()) {
  const Json s = Json::parse(schema);
  return make_grammar([&](Builder& b) { return JsonSchemaCompiler(b, s, o).root_value(); }, o, std::move(v));
}

inline std::shared_ptr<const CompiledGrammar> regex_grammar(const std::string& re, const GrammarOptions& o = {}) {
  return make_grammar([&](Builder& b) { return regex_expr(b, re, CharMode::Raw); }, o);
}

// The whole string is in the grammar's language.
inline bool matches(const std::shared_ptr<const CompiledGrammar>& g, const std::string& s) {
  Matcher m(g);
  return m.advance_bytes(s) && m.accepting();
}
// The string can be continued to something in the language.
inline bool prefix_ok(const std::shared_ptr<const CompiledGrammar>& g, const std::string& s) {
  Matcher m(g);
  return m.advance_bytes(s) && (m.accepting() || m.can_continue());
}

}  // namespace dil::grammar::testing
