// Structured output in the server: the request fields, and the grammars they compile to,
// checked by walking them with random allowed tokens of the bundled tokenizer and reading the
// text back with the real output parser (tool calls) or a JSON parser.
#include <gtest/gtest.h>

#include <random>

#include "server/structured.h"
#include "tokenizer/chat_format.h"

namespace dil::server {
namespace {

const tok::Tokenizer& tiny_tokenizer() {
  static const std::unique_ptr<tok::Tokenizer> t = tok::Tokenizer::load("models/tiny-v4/tokenizer.json");
  return *t;
}

ApiError error_of(const std::string& body) {
  try {
    parse_output_format(Json::parse(body));
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << body << " parsed";
  return ApiError(0, "");
}

TEST(OutputFormat, FieldsAndConflicts) {
  using K = OutputFormat::Kind;
  EXPECT_EQ(parse_output_format(Json::parse(R"({"response_format":{"type":"text"}})")).kind, K::Text);
  EXPECT_EQ(parse_output_format(Json::parse(R"({"response_format":{"type":"json_object"}})")).kind, K::JsonObject);
  OutputFormat js = parse_output_format(
      Json::parse(R"({"response_format":{"type":"json_schema","json_schema":{"name":"x","strict":true,"schema":{"type":"null"}}}})"));
  EXPECT_EQ(js.kind, K::JsonSchema);
  EXPECT_EQ(js.schema, Json::parse(R"({"type":"null"})"));
  EXPECT_EQ(js.param, "response_format.json_schema.schema");
  EXPECT_EQ(parse_output_format(Json::parse(R"({"response_format":{"type":"json_schema","json_schema":{"name":"x"}}})")).kind,
            K::JsonObject);
  EXPECT_EQ(parse_output_format(Json::parse(R"({"guided_json":"{\"type\":\"integer\"}"})")).schema["type"], "integer");
  EXPECT_EQ(parse_output_format(Json::parse(R"({"guided_regex":"a+"})")).regex, "a+");
  EXPECT_EQ(parse_output_format(Json::parse(R"({"guided_choice":["x","y"]})")).choices, (std::vector<std::string>{"x", "y"}));
  OutputFormat so = parse_output_format(
      Json::parse(R"({"structured_outputs":{"json":{"type":"object"},"disable_any_whitespace":true,"disable_additional_properties":true}})"));
  EXPECT_EQ(so.kind, K::JsonSchema);
  EXPECT_EQ(so.max_whitespace, 0);
  EXPECT_FALSE(so.additional_properties);
  EXPECT_EQ(parse_output_format(Json::parse(R"({"structured_outputs":{"json_object":true}})")).kind, K::JsonObject);

  EXPECT_EQ(error_of(R"({"response_format":{"type":"json_object"},"guided_regex":"a"})").param, "guided_regex");
  EXPECT_EQ(error_of(R"({"guided_json":{},"guided_choice":["a"]})").param, "guided_choice");
  EXPECT_EQ(error_of(R"({"structured_outputs":{"regex":"a","choice":["b"]}})").param, "structured_outputs.choice");
  EXPECT_EQ(error_of(R"({"guided_grammar":"root ::= \"a\""})").param, "guided_grammar");
  EXPECT_EQ(error_of(R"({"structured_outputs":{"grammar":"x"}})").param, "structured_outputs.grammar");
  EXPECT_EQ(error_of(R"({"response_format":{"type":"structural_tag"}})").param, "response_format.type");
  EXPECT_EQ(error_of(R"({"guided_choice":[]})").param, "guided_choice");
  EXPECT_EQ(error_of(R"({"guided_json":"not json"})").param, "guided_json");
  EXPECT_EQ(error_of(R"({"response_format":{"type":"json_schema"}})").param, "response_format.json_schema");
}

TEST(GrammarCache, SameSpecSameGrammarAndSchemaErrorsName400) {
  GrammarCache cache(tiny_tokenizer(), 1024, 2);
  StructuredSpec s;
  EXPECT_EQ(cache.get(s), nullptr);  // nothing to constrain
  s.format = parse_output_format(Json::parse(R"({"guided_json":{"type":"integer"}})"));
  auto a = cache.get(s), b = cache.get(s);
  EXPECT_NE(a, nullptr);
  EXPECT_EQ(a, b);
  StructuredSpec other = s;
  other.chat = true;
  EXPECT_NE(cache.get(other), a);
  StructuredSpec third = s;
  third.format.schema = Json::parse(R"({"type":"null"})");
  cache.get(third);
  EXPECT_EQ(cache.size(), 2u);  // capacity 2: the oldest went
  s.format = parse_output_format(Json::parse(
      R"({"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object","properties":{"a":{"not":{}}}}}}})"));
  try {
    cache.get(s);
    ADD_FAILURE() << "compiled";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "response_format.json_schema.schema");
    EXPECT_NE(e.message.find("'not'"), std::string::npos) << e.message;
    EXPECT_NE(e.message.find("#/properties/a"), std::string::npos) << e.message;
  }
}

// Random walks: each step picks a random allowed token (EOS once complete, with some chance),
// within a budget of `budget` tokens. Returns the texts (without EOS).
std::vector<std::string> walks(const std::shared_ptr<const grammar::CompiledGrammar>& g, int n, int budget, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::string> out;
  std::vector<uint64_t> mask(size_t(g->vocab().words()));
  for (int w = 0; w < n; ++w) {
    grammar::Matcher m(g);
    std::vector<int32_t> ids;
    for (int k = 0; k < budget; ++k) {
      m.fill_mask(mask, budget - k - 1);
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < g->vocab().size(); ++id)
        if (grammar::test_bit(mask, id)) allowed.push_back(id);
      if (m.accepting() && (allowed.empty() || rng() % 3 == 0)) break;
      EXPECT_FALSE(allowed.empty()) << "after '" << tiny_tokenizer().decode(ids) << "' distance " << m.distance();
      if (allowed.empty()) break;
      const int32_t t = allowed[rng() % allowed.size()];
      EXPECT_TRUE(m.advance(t));
      ids.push_back(t);
    }
    EXPECT_TRUE(m.accepting()) << "walk " << w << " did not finish in " << budget << " tokens";
    out.push_back(tiny_tokenizer().decode(ids));
  }
  return out;
}

const char* kTools = R"([
  {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
     "city":{"type":"string","maxLength":12},"days":{"type":"integer","minimum":1,"maximum":7},
     "unit":{"enum":["c","f"]},"when":{"anyOf":[{"type":"string","format":"date"},{"type":"null"}]}},
     "required":["city","unit"]}}},
  {"type":"function","function":{"name":"noop"}},
  {"type":"function","function":{"name":"tag","parameters":{"type":"object","properties":{
     "labels":{"type":"array","items":{"type":"string"},"maxItems":2},"meta":{"type":"object","properties":{"k":{"type":"boolean"}}}},
     "required":["labels"]}}}])";

void check_call(const tok::ToolCall& c, const std::string& only) {
  if (!only.empty()) {
    EXPECT_EQ(c.name, only);
  }
  const Json args = Json::parse(c.arguments_json);  // throws on invalid JSON
  ASSERT_TRUE(args.is_object()) << c.arguments_json;
  // No string of a parameter, raw or inside JSON, may hold the bar of the DSML tags.
  EXPECT_EQ(c.arguments_json.find("\xEF\xBD\x9C"), std::string::npos) << c.arguments_json;
  if (c.name == "get_weather") {
    ASSERT_TRUE(args.contains("city") && args["city"].is_string()) << c.arguments_json;
    EXPECT_LE(args["city"].get<std::string>().size(), 12u * 4);
    ASSERT_TRUE(args.contains("unit")) << c.arguments_json;
    EXPECT_TRUE(args["unit"] == "c" || args["unit"] == "f");
    if (args.contains("days")) {
      EXPECT_TRUE(args["days"].is_number_integer() && args["days"] >= 1 && args["days"] <= 7);
    }
    if (args.contains("when")) {
      EXPECT_TRUE(args["when"].is_null() || args["when"].is_string());
    }
    for (auto it = args.begin(); it != args.end(); ++it)
      EXPECT_TRUE(it.key() == "city" || it.key() == "days" || it.key() == "unit" || it.key() == "when") << it.key();
  } else if (c.name == "noop") {
    EXPECT_TRUE(args.empty());
  } else {
    ASSERT_EQ(c.name, "tag");
    ASSERT_TRUE(args.contains("labels") && args["labels"].is_array()) << c.arguments_json;
    EXPECT_LE(args["labels"].size(), 2u);
    if (args.contains("meta")) {
      EXPECT_TRUE(args["meta"].is_object());
    }
  }
}

TEST(StructuredGrammar, ForcedToolCallsParseBackWithValidArguments) {
  GrammarCache cache(tiny_tokenizer(), 1024);
  for (tok::PromptFormat pf : {tok::PromptFormat::V4, tok::PromptFormat::V41}) {
    for (bool thinking : {false, true}) {
      for (const char* choice : {"required", "function"}) {
        StructuredSpec s;
        s.chat = true;
        s.thinking = thinking;
        s.prompt_format = pf;
        s.tool_choice = choice;
        s.tools = Json::parse(kTools);
        if (s.tool_choice == "function") {
          s.tool_name = "get_weather";
          s.tools = Json::array({s.tools[0]});
        }
        auto g = cache.get(s);
        ASSERT_NE(g, nullptr);
        for (const std::string& text : walks(g, 25, 160, 3 + int(thinking))) {
          tok::ParsedMessage m;
          ASSERT_NO_THROW(m = tok::parse_completion(pf, text + tok::kEos, thinking)) << text;
          ASSERT_FALSE(m.tool_calls.empty()) << text;
          EXPECT_EQ(m.content, "");
          for (const auto& c : m.tool_calls) check_call(c, s.tool_choice == "function" ? "get_weather" : "");
          if (s.tool_choice == "function") {
            EXPECT_EQ(m.tool_calls.size(), 1u);
          }
        }
      }
    }
  }
}

TEST(StructuredGrammar, ToolSchemasWithUnsupportedKeywordsAre400) {
  GrammarCache cache(tiny_tokenizer(), 1024);
  StructuredSpec s;
  s.chat = true;
  s.tool_choice = "required";
  for (const char* params : {R"({"type":"object","minProperties":1,"properties":{"a":{"type":"string"}}})",
                             R"({"type":"object","properties":{"a":{"type":"string","not":{}}}})",
                             R"({"type":"array","items":{}})"}) {
    s.tools = Json::array({Json{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", Json::parse(params)}}}}});
    try {
      cache.get(s);
      ADD_FAILURE() << params << " compiled";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, "tools[0].function.parameters") << e.message;
    }
  }
}

TEST(StructuredGrammar, JsonAfterThinkingAndToolChoiceNone) {
  GrammarCache cache(tiny_tokenizer(), 1024);
  StructuredSpec s;
  s.chat = true;
  s.thinking = true;
  s.format = parse_output_format(Json::parse(
      R"({"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}}}})"));
  for (const std::string& text : walks(cache.get(s), 25, 80, 9)) {
    tok::ParsedMessage m = tok::parse_completion(tok::PromptFormat::V4, text + tok::kEos, true);
    const Json j = Json::parse(m.content);
    EXPECT_TRUE(j.contains("n") && j["n"].is_number_integer()) << m.content;
  }
  StructuredSpec none;
  none.chat = true;
  none.tool_choice = "none";
  none.has_tools_for_none = true;
  for (const std::string& text : walks(cache.get(none), 25, 40, 2)) EXPECT_EQ(text.find(tok::kDsml), std::string::npos) << text;
  // auto with tools and a response format: JSON content or a tool call, both parse.
  StructuredSpec either = s;
  either.thinking = false;
  either.tools = Json::parse(kTools);
  int calls = 0, answers = 0;
  for (const std::string& text : walks(cache.get(either), 40, 160, 4)) {
    tok::ParsedMessage m = tok::parse_completion(tok::PromptFormat::V4, text + tok::kEos, false);
    if (m.tool_calls.empty()) {
      EXPECT_TRUE(Json::parse(m.content).contains("n"));
      ++answers;
    } else {
      for (const auto& c : m.tool_calls) check_call(c, "");
      ++calls;
    }
  }
  EXPECT_GT(calls + answers, 0);
}

}  // namespace
}  // namespace dil::server
