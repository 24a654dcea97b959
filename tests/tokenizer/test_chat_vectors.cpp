// Prompt encoders and the completion parser against the official encoders' outputs
// (tests/data/tokenizer/, made by DeepSeek's encoding_dsv4.py and V4.1 encoding.py).
#include <gtest/gtest.h>

#include <fstream>

#include "core/check.h"
#include "tokenizer/tokenizer.h"

using namespace dil;
using namespace dil::tok;

namespace {

Json load(const std::string& name) {
  std::ifstream f("tests/data/tokenizer/" + name);
  EXPECT_TRUE(f.good()) << name;
  return Json::parse(f);
}

PromptFormat fmt_of(const Json& d) { return d["format"] == "v41" ? PromptFormat::V41 : PromptFormat::V4; }

ChatOptions options(const Json& req) {
  ChatOptions o;
  o.thinking_mode = req.value("thinking_mode", "chat");
  o.reasoning_effort = req.value("reasoning_effort", Json());
  o.tools = req.value("tools", Json());
  o.response_format = req.value("response_format", Json());
  return o;
}

void check_prompts(const std::string& file) {
  Json d = load(file);
  ASSERT_GE(d["cases"].size(), 40u);
  for (const auto& c : d["cases"]) {
    std::string got = render_chat(fmt_of(d), c["request"]["messages"], options(c["request"]));
    EXPECT_EQ(got, c["prompt"].get<std::string>()) << file << ": " << c["name"] << " " << c["request"]["thinking_mode"];
  }
  for (const auto& c : d["rejected"]) {
    EXPECT_THROW(render_chat(fmt_of(d), c["request"]["messages"], options(c["request"])), Error)
        << file << ": " << c["request"].dump() << " (official: " << c["official_error"] << ")";
  }
}

Json as_json(const ParsedMessage& m) {
  Json calls = Json::array();
  for (const auto& c : m.tool_calls)
    calls.push_back({{"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments_json}}}});
  return {{"content", m.content}, {"reasoning_content", m.reasoning_content}, {"tool_calls", calls}};
}

// Character boundaries of a UTF-8 string (the detokenizer only ever emits whole characters).
std::vector<size_t> char_bounds(const std::string& s) {
  std::vector<size_t> b;
  for (size_t i = 0; i <= s.size(); ++i)
    if (i == s.size() || (static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) b.push_back(i);
  return b;
}

bool has_markup(const std::string& s) {
  for (const char* m : {"<｜", "｜DSML｜", "<think>", "</think>", "｜>"})
    if (s.find(m) != std::string::npos) return true;
  return false;
}

// Feeds `pieces` to a streaming parser; returns the final message and the concatenated deltas.
struct Streamed {
  ParsedMessage msg;
  std::string content, reasoning;
  std::vector<ToolCall> calls;
  bool leaked = false;
};
Streamed stream(PromptFormat f, bool thinking, const std::vector<std::string>& pieces) {
  OutputParser p(f, thinking);
  Streamed s;
  auto take = [&](const ParserDelta& d) {
    s.content += d.content;
    s.reasoning += d.reasoning;
    s.calls.insert(s.calls.end(), d.new_tool_calls.begin(), d.new_tool_calls.end());
    if (has_markup(d.content) || has_markup(d.reasoning)) s.leaked = true;
  };
  for (const auto& x : pieces) take(p.push(x));
  take(p.finish());
  s.msg = p.message();
  return s;
}

void check_parser(const std::string& file) {
  Json d = load(file);
  const PromptFormat f = fmt_of(d);
  int valid = 0;
  for (const auto& c : d["cases"]) {
    const std::string text = c["text"];
    const bool thinking = c["thinking_mode"] == "thinking";
    if (c.contains("official_error")) {
      EXPECT_THROW(parse_completion(f, text, thinking), Error) << file << ": " << text;
      continue;
    }
    ++valid;
    ParsedMessage whole = parse_completion(f, text, thinking);
    Json expected = c["expected"];
    ASSERT_EQ(as_json(whole), expected) << text;
    // Streaming, split at every character boundary into two pieces, and one char at a time.
    auto bounds = char_bounds(text);
    std::vector<std::vector<std::string>> splits;
    for (size_t b : bounds) splits.push_back({text.substr(0, b), text.substr(b)});
    std::vector<std::string> chars;
    for (size_t k = 0; k + 1 < bounds.size(); ++k) chars.push_back(text.substr(bounds[k], bounds[k + 1] - bounds[k]));
    splits.push_back(chars);
    for (const auto& pieces : splits) {
      Streamed s = stream(f, thinking, pieces);
      std::string where = file + ": split after " + std::to_string(pieces[0].size()) + " bytes of " + text;
      EXPECT_EQ(as_json(s.msg), expected) << where;
      EXPECT_EQ(s.content, whole.content) << where;
      EXPECT_EQ(s.reasoning, whole.reasoning_content) << where;
      ASSERT_EQ(s.calls.size(), whole.tool_calls.size()) << where;
      for (size_t k = 0; k < s.calls.size(); ++k) {
        EXPECT_EQ(s.calls[k].name, whole.tool_calls[k].name) << where;
        EXPECT_EQ(s.calls[k].arguments_json, whole.tool_calls[k].arguments_json) << where;
      }
      EXPECT_FALSE(s.leaked) << where;
    }
  }
  EXPECT_GE(valid, 10);
}

}  // namespace

TEST(ChatV4, OfficialPromptVectors) { check_prompts("prompts_v4.json"); }
TEST(ChatV41, OfficialPromptVectors) { check_prompts("prompts_v41.json"); }
TEST(ParserV4, OfficialVectorsWholeAndStreamedAtEveryBoundary) { check_parser("parser_v4.json"); }
TEST(ParserV41, OfficialVectorsWholeAndStreamedAtEveryBoundary) { check_parser("parser_v41.json"); }

TEST(Chat, AddGenerationPromptFalseOmitsOnlyTheFinalHeader) {
  Json msgs = Json::parse(R"([{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}])");
  ChatOptions o;
  std::string with = render_chat(PromptFormat::V4, msgs, o);
  o.add_generation_prompt = false;
  std::string without = render_chat(PromptFormat::V4, msgs, o);
  EXPECT_EQ(with, without + "<｜Assistant｜></think>");
}

TEST(Chat, KeyOrderOfToolSchemasIsPreserved) {
  // Python renders dicts in insertion order; a sorted-key JSON would reorder "type"/"properties".
  Json tools = Json::parse(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"z":{},"a":{}}}}}])");
  ChatOptions o;
  o.tools = tools;
  std::string p = render_chat(PromptFormat::V41, Json::parse(R"([{"role":"user","content":"x"}])"), o);
  EXPECT_NE(p.find(R"({"name": "f", "parameters": {"type": "object", "properties": {"z": {}, "a": {}}}})"), std::string::npos);
}

TEST(Parser, StreamingWithoutEosKeepsHeldBackText) {
  // Generation cut by the length limit right after a partial EOS marker: it was plain text.
  Streamed s = stream(PromptFormat::V4, false, {"answer <｜end"});
  EXPECT_EQ(s.msg.content, "answer <｜end");
  EXPECT_EQ(s.content, "answer <｜end");
}

TEST(Parser, StreamingHoldsBackAPartialToolBlock) {
  OutputParser p(PromptFormat::V4, false);
  ParserDelta d = p.push("Sure.\n\n<｜DSML｜tool_c");
  EXPECT_EQ(d.content, "Sure.");
  d = p.push("alls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"x\" string=\"false\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n");
  EXPECT_EQ(d.content, "");
  ASSERT_EQ(d.new_tool_calls.size(), 1u);  // emitted as soon as its invoke closed
  EXPECT_EQ(d.new_tool_calls[0].arguments_json, "{\"x\": 1}");
  d = p.push("</｜DSML｜tool_calls><｜end▁of▁sentence｜>");
  EXPECT_TRUE(d.new_tool_calls.empty());
  d = p.finish();
  EXPECT_TRUE(d.new_tool_calls.empty());
  EXPECT_EQ(p.message().tool_calls.size(), 1u);
}

TEST(Parser, TokenByTokenThroughTheDetokenizer) {
  // The serving path: ids -> IncrementalDetokenizer -> OutputParser, at real token boundaries
  // (the V3 vocabulary splits the DSML and think markers into several byte-level tokens).
  auto tok = Tokenizer::load("tests/data/deepseek-v3-tokenizer/tokenizer.json");
  for (const char* file : {"parser_v4.json", "parser_v41.json"}) {
    Json d = load(file);
    for (const auto& c : d["cases"]) {
      if (c.contains("official_error")) continue;
      const bool thinking = c["thinking_mode"] == "thinking";
      IncrementalDetokenizer detok(*tok, false);
      OutputParser p(fmt_of(d), thinking);
      std::string content;
      for (int32_t id : tok->encode(c["text"].get<std::string>())) {
        ParserDelta delta = p.push(detok.push(id));
        EXPECT_FALSE(has_markup(delta.content)) << c["text"];
        content += delta.content;
      }
      content += p.push(detok.flush()).content;
      content += p.finish().content;
      EXPECT_EQ(as_json(p.message()), c["expected"]) << file << ": " << c["text"];
      EXPECT_EQ(content, c["expected"]["content"].get<std::string>());
    }
  }
}
