// Request -> grammar: the JSON / regex / choice body, the DSML tool-call block (the text the
// V4/V4.1 encoders write and tok::parse_completion reads back), the thinking prefix; the cache;
// the engine constraint around a matcher.
#include "server/structured.h"

#include <set>

#include "grammar/json_schema.h"
#include "grammar/regex.h"
#include "server/grammar_vocab.h"
#include "tokenizer/chat_format.h"

namespace dil::server {
namespace {

using grammar::Builder;
using grammar::CharMode;
using grammar::CharSet;
using grammar::GrammarError;

// Markup the output parser reacts to: never part of free text or a raw DSML value. (The added
// tokens are out of the grammar's vocabulary anyway; this also keeps the BPE from spelling them.)
std::vector<std::string> markup_strings() {
  return {tok::kThinkStart, tok::kThinkEnd, tok::kDsml, tok::kEos, tok::kBos};
}

// U+FF5C (the bar of ｜DSML｜ and of every special token): never in a string of a DSML
// parameter value (raw, or inside its JSON), so that a value cannot close its tag early.
CharSet raw_value_chars() { return CharSet::all().minus(CharSet::of(0xFF5C, 0xFF5C)); }

class Composer {
 public:
  Composer(Builder& b, const StructuredSpec& s, const grammar::GrammarOptions& o) : b_(b), s_(s), o_(o) {}

  // The whole output, or -1 when nothing constrains it.
  Builder::Id root() {
    Builder::Id body = -1;
    const bool forced = s_.tool_choice == "required" || s_.tool_choice == "function";
    const bool tools = s_.chat && !s_.tools.is_null() && !s_.tools.empty();
    if (forced) {
      body = tool_block();
    } else if (s_.format.kind != OutputFormat::Kind::Text) {
      body = format_body();
      // With tools on offer (auto) the model may call them instead of answering.
      if (tools && s_.tool_choice == "auto") body = b_.alt({body, tool_block()});
    } else if (s_.chat && s_.tool_choice == "none" && s_.has_tools_for_none) {
      body = b_.text_without(markup_strings());
    } else {
      return -1;
    }
    if (s_.chat && s_.thinking) body = b_.seq({b_.text_without(markup_strings()), b_.literal(tok::kThinkEnd), body});
    return body;
  }

 private:
  Builder::Id format_body() {
    const OutputFormat& f = s_.format;
    try {
      switch (f.kind) {
        case OutputFormat::Kind::JsonObject: {
          grammar::JsonSchemaCompiler c(b_, Json(true), o_);
          return b_.seq({c.ws(), c.any_object()});
        }
        case OutputFormat::Kind::JsonSchema: {
          grammar::JsonSchemaCompiler c(b_, f.schema, o_);
          return b_.seq({c.ws(), c.root_value()});
        }
        case OutputFormat::Kind::Regex: return grammar::regex_expr(b_, f.regex, CharMode::Raw);
        case OutputFormat::Kind::Choice: return grammar::choice_expr(b_, f.choices, CharMode::Raw);
        case OutputFormat::Kind::Text: break;
      }
    } catch (const GrammarError& e) {
      throw_for(e, f.param, f.kind == OutputFormat::Kind::Regex ? "regex" : "schema");
    }
    return b_.empty();
  }

  [[noreturn]] static void throw_for(const GrammarError& e, const std::string& param, const char* what) {
    std::string msg = param + ": " + e.what();
    if (!e.path.empty() && std::string(what) == "schema") msg += " (at #" + e.path + ")";
    throw ApiError(400, msg, param, e.keyword.empty() ? "invalid_structured_output" : "unsupported_" + std::string(what) + "_feature");
  }

  // "\n\n<｜DSML｜tool_calls>\n" invoke ("\n" invoke)* "\n</｜DSML｜tool_calls>"  (V4.1: " calls")
  Builder::Id tool_block() {
    const tok::DsmlNames n = tok::dsml_names(s_.prompt_format);
    const std::string d = tok::kDsml;
    std::vector<Builder::Id> invokes;
    for (size_t i = 0; i < s_.tools.size(); ++i) {
      const Json& fn = s_.tools[i]["function"];
      if (s_.tool_choice == "function" && fn["name"] != s_.tool_name) continue;
      invokes.push_back(invoke(fn, str_cat("tools[", i, "].function.parameters"), n));
    }
    DIL_CHECK(!invokes.empty(), "a forced tool call without a tool (checked by the protocol)");
    const Builder::Id one = b_.alt(std::move(invokes));
    const bool several = s_.tool_choice != "function" && s_.parallel_tool_calls;
    return b_.seq({b_.literal("\n\n<" + d + n.block + ">\n"), one,
                   several ? b_.repeat(b_.seq({b_.byte('\n'), one}), 0, -1) : b_.empty(),
                   b_.literal("\n</" + d + n.block + ">")});
  }

  // <｜DSML｜invoke name="NAME">\n (parameter\n)* </｜DSML｜invoke>, the parameters in the
  // schema's order, the required ones always.
  Builder::Id invoke(const Json& fn, const std::string& param, const tok::DsmlNames& n) {
    const std::string d = tok::kDsml;
    const Json params = fn.contains("parameters") && fn["parameters"].is_object() ? fn["parameters"] : Json::object();
    std::vector<std::pair<Builder::Id, bool>> items;
    try {
      grammar::JsonSchemaCompiler raw(b_, params, o_, raw_value_chars());
      if (params.contains("type") && params["type"] != "object")
        throw GrammarError("tool parameters must be a JSON Schema of type object", "type", "");
      for (const char* k : {"anyOf", "oneOf", "allOf", "$ref", "enum", "const"})
        if (params.contains(k)) throw GrammarError(str_cat("'", k, "' at the top of tool parameters is not supported"), k, "");
      // The whole schema through the compiler once (the expression is not used): every keyword
      // it does not support is refused here too, not only those of the parameters below.
      (void)raw.value(params, "", grammar::ValueForm::Json);
      std::set<std::string> required;
      if (params.contains("required") && params["required"].is_array())
        for (const auto& r : params["required"])
          if (r.is_string()) required.insert(r.get<std::string>());
      const Json props = params.contains("properties") && params["properties"].is_object() ? params["properties"] : Json::object();
      for (const std::string& r : required)
        if (!props.contains(r))
          throw GrammarError(str_cat("required parameter '", r, "' has no schema in 'properties'"), "required", "");
      for (auto it = props.begin(); it != props.end(); ++it) {
        const std::string path = "/properties/" + it.key();
        const std::string head = "<" + d + n.parameter + " name=\"" + it.key() + "\" string=\"";
        // String values are written raw (string="true"), anything else as JSON.
        const Builder::Id as_string = raw.value(it.value(), path, grammar::ValueForm::RawString);
        const Builder::Id as_json = raw.value(it.value(), path, grammar::ValueForm::JsonNonString);
        const Builder::Id value = b_.alt({b_.seq({b_.literal("true\">"), as_string}), b_.seq({b_.literal("false\">"), as_json})});
        items.push_back({b_.seq({b_.literal(head), value, b_.literal("</" + d + n.parameter + ">\n")}),
                         required.count(it.key()) > 0});
      }
    } catch (const GrammarError& e) {
      throw_for(e, param, "schema");
    }
    const std::string name = fn["name"].get<std::string>();
    return b_.seq({b_.literal("<" + d + n.invoke + " name=\"" + name + "\">\n"), b_.members(items, b_.empty(), -1, 0),
                   b_.literal("</" + d + n.invoke + ">")});
  }

  Builder& b_;
  const StructuredSpec& s_;
  const grammar::GrammarOptions& o_;
};

std::string cache_key(const StructuredSpec& s) {
  const OutputFormat& f = s.format;
  Json k = {{"kind", int(f.kind)}, {"ws", f.max_whitespace}, {"ap", f.additional_properties}, {"chat", s.chat},
            {"think", s.thinking}, {"pf", int(s.prompt_format)}, {"tc", s.tool_choice}, {"tn", s.tool_name},
            {"ptc", s.parallel_tool_calls}, {"none_tools", s.has_tools_for_none}};
  if (f.kind == OutputFormat::Kind::JsonSchema) k["schema"] = f.schema;
  if (f.kind == OutputFormat::Kind::Regex) k["regex"] = f.regex;
  if (f.kind == OutputFormat::Kind::Choice) k["choices"] = f.choices;
  if (s.tool_choice == "required" || s.tool_choice == "function" ||
      (s.tool_choice == "auto" && f.kind != OutputFormat::Kind::Text))
    k["tools"] = s.tools;
  return k.dump();
}

class GrammarConstraint final : public TokenConstraint {
 public:
  explicit GrammarConstraint(std::shared_ptr<const grammar::CompiledGrammar> g) : m_(std::move(g)) {}
  void fill_mask(std::span<uint64_t> mask, int remaining) override {
    // One token is kept for EOS, so that a complete output finishes with "stop", not "length"
    // (clients such as openai's parse() refuse a "length" answer).
    int budget = remaining - 1;
    if (budget < 0) {
      if (m_.accepting()) return;  // only EOS (the engine adds it)
      budget = 0;
    }
    m_.fill_mask(mask, budget);
  }
  void advance(int32_t token) override {
    // The engine samples from the mask: a token the grammar refuses is a broken invariant.
    DIL_CHECK(m_.advance(token), "structured output: the engine sampled token ", token, ", which the grammar refuses");
  }
  bool accepting() const override { return m_.accepting(); }

 private:
  grammar::Matcher m_;
};

}  // namespace

GrammarCache::GrammarCache(const tok::Tokenizer& t, int64_t n_ids, size_t capacity)
    : chat_vocab_(grammar_vocabulary(t, n_ids, true)), text_vocab_(grammar_vocabulary(t, n_ids, false)),
      capacity_(capacity) {}

std::shared_ptr<const grammar::CompiledGrammar> GrammarCache::get(const StructuredSpec& s) {
  const std::string key = cache_key(s);
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = index_.find(key);
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
  }
  // Compiled outside the lock (a large schema takes milliseconds); a concurrent twin is dropped.
  grammar::GrammarOptions o;
  if (s.format.max_whitespace >= 0) o.max_whitespace = s.format.max_whitespace;
  o.additional_properties = s.format.additional_properties;
  Builder b;
  const int32_t root = b.add_rule("output");
  const Builder::Id body = Composer(b, s, o).root();
  if (body < 0) return nullptr;
  b.define(root, body);
  std::shared_ptr<const grammar::CompiledGrammar> g;
  try {
    g = std::make_shared<grammar::CompiledGrammar>(grammar::compile(b, root, o), s.chat ? chat_vocab_ : text_vocab_);
  } catch (const GrammarError& e) {
    const std::string param = s.format.kind != OutputFormat::Kind::Text ? s.format.param : "tools";
    throw ApiError(400, param + ": " + e.what(), param, "invalid_structured_output");
  }
  std::lock_guard<std::mutex> lk(mu_);
  auto it = index_.find(key);
  if (it != index_.end()) return it->second->second;
  lru_.emplace_front(key, g);
  index_[key] = lru_.begin();
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return g;
}

size_t GrammarCache::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return lru_.size();
}

std::shared_ptr<TokenConstraint> make_constraint(std::shared_ptr<const grammar::CompiledGrammar> g) {
  if (!g) return nullptr;
  return std::make_shared<GrammarConstraint>(std::move(g));
}

}  // namespace dil::server
