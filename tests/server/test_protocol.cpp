// Request validation: every bad field becomes a 400 naming the field; good requests map to
// the engine's parameters.
#include <gtest/gtest.h>

#include "server/protocol.h"

namespace dil::server {
namespace {

ApiError error_of(const std::string& body, bool chat = true) {
  try {
    const Json j = parse_body(body);
    if (chat) parse_chat_request(j, ServerDefaults{}, 1024);
    else parse_completion_request(j, 1024);
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(0, "no error");
}

const char* kMsg = R"("messages":[{"role":"user","content":"hi"}])";

TEST(Protocol, MalformedBodies) {
  EXPECT_EQ(error_of("{").status, 400);
  EXPECT_EQ(error_of("[]").status, 400);
  EXPECT_EQ(error_of("\"x\"").status, 400);
  EXPECT_EQ(error_of(std::string("{\"messages\":\"\xff\xfe\"}")).status, 400);  // invalid UTF-8
  EXPECT_EQ(error_of("").status, 400);
  EXPECT_EQ(error_of(std::string("{") + kMsg + ",\"max_tokens\":1e400}").status, 400);  // overflow
}

TEST(Protocol, WrongTypesNameTheField) {
  struct Case {
    std::string extra, param;
  } cases[] = {
      {R"("temperature":"hot")", "temperature"},   {R"("temperature":3)", "temperature"},
      {R"("max_tokens":1.5)", "max_tokens"},       {R"("max_tokens":0)", "max_tokens"},
      {R"("max_tokens":1e300)", "max_tokens"},     {R"("max_tokens":99999999999999999999999)", "max_tokens"},
      {R"("n":0)", "n"},                           {R"("n":true)", "n"},
      {R"("top_p":0)", "top_p"},                   {R"("stop":5)", "stop"},
      {R"("stop":[""])", "stop"},                  {R"("seed":"1")", "seed"},
      {R"("stream":"yes")", "stream"},             {R"("logit_bias":{"abc":1})", "logit_bias"},
      {R"("logit_bias":{"5000":1})", "logit_bias"}, {R"("stop_token_ids":[-1])", "stop_token_ids"},
      {R"("top_logprobs":3)", "top_logprobs"},     {R"("tools":{})", "tools"},
      {R"("tool_choice":"required")", "tool_choice"}, {R"("model":7)", "model"},
      {R"("response_format":{"type":"yaml"})", "response_format.type"},
      {R"("response_format":{"type":"json_schema","json_schema":{"schema":7}})", "response_format.json_schema.schema"},
      {R"("guided_regex":5)", "guided_regex"},
      {R"("chat_template_kwargs":{"thinking":"maybe"})", "chat_template_kwargs.thinking"},
      {R"("reasoning_effort":[1])", "reasoning_effort"},
      {R"("reasoning_effort":50)", "reasoning_effort"},  // V4 takes low/medium/high/max only
      {R"("chat_template_kwargs":{"reasoning_effort":"minimal"})", "chat_template_kwargs.reasoning_effort"},
      {R"("min_tokens":-1)", "min_tokens"},        {R"("max_tokens":2,"min_tokens":3)", "min_tokens"},
      {R"("best_of":2)", "best_of"},               {R"("prompt_logprobs":0)", "prompt_logprobs"},
      // Structured output the grammar engine does not offer (guided_json and the rest are parsed).
      {R"("guided_grammar":"root ::= \"a\"")", "guided_grammar"},
      {R"("guided_decoding_backend":"xgrammar")", "guided_decoding_backend"},
      {R"("structural_tag":"{}")", "structural_tag"},
      {R"("structured_outputs":{"grammar":"x"})", "structured_outputs.grammar"},
      // One call at most needs a grammar: plain auto cannot hold the model to it.
      {R"("tools":[{"type":"function","function":{"name":"f"}}],"parallel_tool_calls":false)", "parallel_tool_calls"},
      {R"("echo":true)", "echo"},                  {R"("allowed_token_ids":[])", "allowed_token_ids"},
      {R"("truncate_prompt_tokens":0)", "truncate_prompt_tokens"},
      {R"("stream_options":{"continuous_usage_stats":true})", "stream_options.continuous_usage_stats"},
  };
  for (const auto& c : cases) {
    const ApiError e = error_of("{" + std::string(kMsg) + "," + c.extra + "}");
    EXPECT_EQ(e.status, 400) << c.extra;
    EXPECT_EQ(e.param, c.param) << c.extra << " -> " << e.message;
  }
}

TEST(Protocol, ReasoningEffortFollowsThePromptFormat) {
  ServerDefaults v41;
  v41.format = tok::PromptFormat::V41;
  auto chat = [](const std::string& extra, const ServerDefaults& d) {
    return parse_chat_request(parse_body("{" + std::string(kMsg) + "," + extra + "}"), d, 1024);
  };
  EXPECT_EQ(chat(R"("reasoning_effort":50)", v41).chat.reasoning_effort, 50);
  EXPECT_EQ(chat(R"("reasoning_effort":"max")", v41).chat.reasoning_effort, "max");
  EXPECT_EQ(chat(R"("reasoning_effort":"medium")", ServerDefaults{}).chat.reasoning_effort, "medium");
  for (const char* bad : {R"("reasoning_effort":"medium")", R"("reasoning_effort":0)", R"("reasoning_effort":101)"}) {
    try {
      chat(bad, v41);
      ADD_FAILURE() << bad;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param, "reasoning_effort") << bad;
    }
  }
}

// The fields request_fields.cpp refused before structured output existed now reach it.
TEST(Protocol, StructuredOutputFieldsAreParsedNotRefused) {
  auto chat = [](const std::string& extra) {
    return parse_chat_request(parse_body("{" + std::string(kMsg) + "," + extra + "}"), ServerDefaults{}, 1024);
  };
  const ChatRequest g = chat(R"("guided_json":{})");
  EXPECT_EQ(g.format.kind, OutputFormat::Kind::JsonSchema);
  EXPECT_EQ(g.format.param, "guided_json");
  const ChatRequest so = chat(R"("structured_outputs":{"json":{}})");
  EXPECT_EQ(so.format.kind, OutputFormat::Kind::JsonSchema);
  EXPECT_EQ(so.format.param, "structured_outputs.json");
  EXPECT_EQ(chat(R"("guided_choice":["a","b"])").format.choices, (std::vector<std::string>{"a", "b"}));
  const std::string tools = R"("tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"g"}}])";
  const ChatRequest req = chat(tools + R"(,"tool_choice":"required","parallel_tool_calls":false)");
  EXPECT_EQ(req.tool_choice, "required");
  EXPECT_FALSE(req.parallel_tool_calls);
  const ChatRequest named = chat(tools + R"(,"tool_choice":{"type":"function","function":{"name":"g"}})");
  EXPECT_EQ(named.tool_choice_name, "g");
  ASSERT_EQ(named.chat.tools.size(), 1u);  // only the named tool is offered
  EXPECT_EQ(named.chat.tools[0]["function"]["name"], "g");
  EXPECT_FALSE(chat(tools + R"(,"response_format":{"type":"json_object"},"parallel_tool_calls":false)").parallel_tool_calls);
  const CompletionRequest c = parse_completion_request(
      parse_body(R"({"prompt":"x","response_format":{"type":"json_object"}})"), 1024);
  EXPECT_EQ(c.format.kind, OutputFormat::Kind::JsonObject);
}

TEST(Protocol, ImplementedVllmFieldsMapToTheEngine) {
  const ChatRequest r = parse_chat_request(
      parse_body("{" + std::string(kMsg) +
                 R"(,"max_tokens":9,"min_tokens":4,"n":2,"best_of":2,"allowed_token_ids":[3,4],)"
                 R"("truncate_prompt_tokens":-1,"include_stop_str_in_output":true,"request_id":"x"})"),
      ServerDefaults{}, 1024);
  EXPECT_EQ(r.gen.stop.min_tokens, 4);
  EXPECT_EQ(r.gen.n, 2);
  EXPECT_EQ(r.gen.sampling.allowed_token_ids, (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(r.gen.truncate_prompt_tokens, -1);
  EXPECT_TRUE(r.gen.include_stop_str);
  EXPECT_EQ(r.gen.request_id, "x");
}

TEST(Protocol, BadMessages) {
  EXPECT_EQ(error_of(R"({"messages":[]})").param, "messages");
  EXPECT_EQ(error_of(R"({"messages":[{"content":"x"}]})").param, "messages[0].role");
  EXPECT_EQ(error_of(R"({"messages":[{"role":"wizard","content":"x"}]})").param, "messages[0].role");
  EXPECT_EQ(error_of(R"({"messages":[{"role":"user","content":5}]})").param, "messages[0].content");
  EXPECT_EQ(error_of(R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})").param,
            "messages[0].content");
  EXPECT_EQ(error_of(R"({"messages":[{"role":"assistant","content":null,"tool_calls":[{"type":"function","function":{"name":"f","arguments":5}}]}]})").param,
            "messages[0].tool_calls[0].function.arguments");
}

TEST(Protocol, ChatFieldsMapToEngineParams) {
  const Json j = parse_body(std::string("{") + kMsg + R"(,"temperature":0,"top_k":5,"seed":7,"n":2,
    "max_completion_tokens":9,"stop":["a","bc"],"logprobs":true,"top_logprobs":3,
    "stream":true,"stream_options":{"include_usage":true},"chat_template_kwargs":{"thinking":true,"reasoning_effort":"high"},
    "unknown_field":{"ignored":1}})");
  const ChatRequest r = parse_chat_request(j, ServerDefaults{}, 1024);
  EXPECT_EQ(r.gen.sampling.temperature, 0.0f);
  EXPECT_EQ(r.gen.sampling.top_k, 5);
  EXPECT_EQ(r.gen.sampling.seed.value(), 7u);
  EXPECT_EQ(r.gen.sampling.logprobs, 3);
  EXPECT_EQ(r.gen.n, 2);
  EXPECT_EQ(r.gen.stop.max_tokens, 9);
  EXPECT_EQ(r.gen.stop_strings, (std::vector<std::string>{"a", "bc"}));
  EXPECT_TRUE(r.gen.stream && r.gen.include_usage);
  EXPECT_EQ(r.chat.thinking_mode, "thinking");
  EXPECT_EQ(r.chat.reasoning_effort, "high");
}

TEST(Protocol, ThinkingSwitchesLikePeers) {
  auto mode = [](const std::string& extra, bool def) {
    const Json j = parse_body(std::string("{") + kMsg + extra + "}");
    return parse_chat_request(j, ServerDefaults{def}, 1024).chat.thinking_mode;
  };
  EXPECT_EQ(mode("", false), "chat");
  EXPECT_EQ(mode("", true), "thinking");
  EXPECT_EQ(mode(R"(,"thinking":{"type":"enabled"})", false), "thinking");
  EXPECT_EQ(mode(R"(,"chat_template_kwargs":{"enable_thinking":false})", true), "chat");
  EXPECT_EQ(mode(R"(,"chat_template_kwargs":{"thinking":true})", false), "thinking");
}

TEST(Protocol, CompletionPrompts) {
  auto r = parse_completion_request(parse_body(R"({"prompt":[[5,6],[7]],"logprobs":2})"), 1024);
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_FALSE(r.prompts[0].is_text);
  EXPECT_EQ(r.prompts[1].ids, std::vector<int32_t>{7});
  EXPECT_EQ(r.gen.sampling.logprobs, 2);
  r = parse_completion_request(parse_body(R"({"prompt":["a","b"]})"), 1024);
  EXPECT_EQ(r.prompts[1].text, "b");
  EXPECT_EQ(error_of(R"({"prompt":[1,2,5000]})", false).param, "prompt");
  EXPECT_EQ(error_of(R"({"prompt":""})", false).param, "prompt");
  EXPECT_EQ(error_of(R"({"prompt":{}})", false).param, "prompt");
  EXPECT_EQ(error_of(R"({"max_tokens":3})", false).param, "prompt");
}

TEST(Protocol, ErrorBodyShape) {
  const Json b = error_body(ApiError(404, "nope", "model", "model_not_found"));
  EXPECT_EQ(b["error"]["message"], "nope");
  EXPECT_EQ(b["error"]["type"], "invalid_request_error");
  EXPECT_EQ(b["error"]["param"], "model");
  EXPECT_EQ(b["error"]["code"], "model_not_found");
}

}  // namespace
}  // namespace dil::server
