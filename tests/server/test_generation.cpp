// The per-choice text pipeline (real tiny-v4 tokenizer, synthetic model output fed one token
// per engine output, i.e. split at every token boundary) and Generation over FakeEngine.
#include <gtest/gtest.h>

#include "fake_engine.h"
#include "server/generation.h"

namespace dil::server {
namespace {

using namespace std::chrono_literals;

const std::string kDir = "models/tiny-v4";

struct ChoicePipeline : ::testing::Test {
  std::unique_ptr<tok::Tokenizer> tok = tok::Tokenizer::load(kDir + "/tokenizer.json");
  tok::PromptFormat fmt = tok::prompt_format_from_config(kDir + "/config.json");

  // Feeds `text`'s tokens one per output, then EOS; returns the concatenated deltas.
  ChoiceDelta run(const std::string& text, const ChoiceConfig& cfg, bool* stop_hit_seen = nullptr,
                  int* outputs_after_stop = nullptr) {
    ChoiceDecoder d(*tok, fmt, cfg);
    ChoiceDelta all;
    const auto ids = tok->encode(text, true);
    int after = 0;
    bool seen = false;
    for (size_t i = 0; i <= ids.size(); ++i) {
      GenOutput o;
      if (i < ids.size()) o.tokens.push_back(GenToken{ids[i], -0.5f, {}});
      else o.finish = FinishReason::Stop;
      bool hit = false;
      if (seen) ++after;
      ChoiceDelta x = d.push(o, &hit);
      seen |= hit;
      all.content += x.content;
      all.reasoning += x.reasoning;
      for (auto& t : x.tool_calls) all.tool_calls.push_back(t);
      if (!x.finish_reason.empty()) all.finish_reason = x.finish_reason;
    }
    if (stop_hit_seen) *stop_hit_seen = seen;
    if (outputs_after_stop) *outputs_after_stop = after;
    return all;
  }
};

TEST_F(ChoicePipeline, CompletionTextRoundTripsAndStopsAtStopString) {
  ChoiceConfig cfg;
  EXPECT_EQ(run("Hello, 世界! 123", cfg).content, "Hello, 世界! 123");
  cfg.stop_strings = {"END"};
  bool hit = false;
  const ChoiceDelta d = run("one two ENDthree", cfg, &hit);
  EXPECT_TRUE(hit);
  EXPECT_EQ(d.content, "one two ");
  EXPECT_EQ(d.finish_reason, "stop");
}

TEST_F(ChoicePipeline, ThinkingSplitsReasoningFromContent) {
  ChoiceConfig cfg;
  cfg.chat = true;
  cfg.thinking = true;
  const ChoiceDelta d = run("Let me think.</think>The answer is 4.", cfg);
  EXPECT_EQ(d.reasoning, "Let me think.");
  EXPECT_EQ(d.content, "The answer is 4.");
  EXPECT_EQ(d.finish_reason, "stop");
}

TEST_F(ChoicePipeline, DsmlToolCallBecomesToolCallsWithoutLeaking) {
  ChoiceConfig cfg;
  cfg.chat = true;
  cfg.parse_tools = true;
  const std::string dsml =
      "Checking.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  const ChoiceDelta d = run(dsml, cfg);
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "get_weather");
  EXPECT_EQ(nlohmann::json::parse(d.tool_calls[0].arguments_json), (nlohmann::json{{"city", "Paris"}, {"days", 3}}));
  EXPECT_EQ(d.tool_calls[0].id.rfind("call_", 0), 0u);
  EXPECT_EQ(d.content.find("DSML"), std::string::npos) << d.content;
  EXPECT_EQ(d.finish_reason, "tool_calls");
  // Tools not offered: the call is dropped and the markup still never reaches content.
  cfg.parse_tools = false;
  const ChoiceDelta n = run(dsml, cfg);
  EXPECT_TRUE(n.tool_calls.empty());
  EXPECT_EQ(n.content.find("DSML"), std::string::npos) << n.content;
}

TEST_F(ChoicePipeline, SeededChoicesFollowTheEngine) {
  testing::FakeEngine e(1024, 4096);
  Metrics m("t");
  std::vector<ChoiceSpec> specs;
  for (int i = 0; i < 2; ++i) {
    ChoiceSpec s;
    s.request.prompt = {0, 5, 6};
    s.request.sampling.seed = 100 + uint64_t(i);
    s.request.sampling.logprobs = 0;
    s.request.stop.max_tokens = 6;
    s.request.stop.ignore_eos = true;
    specs.push_back(s);
  }
  std::vector<std::vector<int32_t>> got(2);
  {
    Generation g(e, m, *tok, fmt, "gen", specs);
    while (!g.done())
      for (const auto& d : g.poll(100ms))
        for (const auto& t : d.tokens) got[size_t(d.index)].push_back(t.token);
    EXPECT_EQ(g.prompt_tokens(), 3);
    EXPECT_EQ(g.completion_tokens(), 12);
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(got[size_t(i)].size(), 6u);
    for (int p = 0; p < 6; ++p) EXPECT_EQ(got[size_t(i)][size_t(p)], testing::FakeEngine::token_at(100 + uint64_t(i), p, 1024));
  }
  EXPECT_EQ(m.in_flight(), 0);
}

TEST_F(ChoicePipeline, DroppingAGenerationCancelsItsEngineRequests) {
  testing::FakeEngine e(1024, 2000000);
  Metrics m("t");
  ChoiceSpec s;
  s.request.prompt = {0, 5};
  s.request.stop.max_tokens = 1000000 - 10;
  s.request.stop.ignore_eos = true;
  {
    Generation g(e, m, *tok, fmt, "gen", {s});
    (void)g.poll(50ms);
    EXPECT_EQ(e.stats().running, 1);
    EXPECT_EQ(m.in_flight(), 1);
  }
  EXPECT_EQ(e.stats().running, 0);
  EXPECT_EQ(m.in_flight(), 0);
}

}  // namespace
}  // namespace dil::server
