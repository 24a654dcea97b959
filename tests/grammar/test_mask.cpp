// Token masks against brute force (advance every token on a copy of the matcher), along
// random walks through grammars with rule boundaries inside tokens; and the budget: with a
// token limit every walk ends complete within it.
#include <gtest/gtest.h>

#include <random>

#include "grammar_test_util.h"

namespace dil::grammar {
namespace {
using namespace testing;

// Bytes plus multi-byte tokens made of JSON-ish pieces, so that many tokens cross the end of
// a string, an object or a called rule.
std::shared_ptr<const Vocabulary> json_vocab(int n_random, uint32_t seed) {
  std::vector<std::string> extra = {"{\"", "\":", "\",\"", "\"}", "},{\"", "}]", "]}", "null", "true,", "false}",
                                    "12", "3.5", "-1", "\"a", "ab", "\": \"", "\n  ", "  ", "}}", "]]", "[{", "\"\"",
                                    "\\n", "\\\"", "é", "\xC3", "\xA9\"", "e+1", "0,", "\"x\":[", "<|x|>", "|>"};
  const std::string alphabet = "{}[]\",:0123456789.-eE truenfalsabcxyz\\\n|<>";
  std::mt19937 rng(seed);
  for (int i = 0; i < n_random; ++i) {
    std::string t;
    const int len = 2 + int(rng() % 5);
    for (int k = 0; k < len; ++k) t += alphabet[rng() % alphabet.size()];
    extra.push_back(t);
  }
  return byte_vocab(extra);
}

std::vector<uint64_t> brute_force(const Matcher& m) {
  const Vocabulary& v = m.grammar().vocab();
  std::vector<uint64_t> out(size_t(v.words()), 0);
  for (int32_t id = 0; id < v.size(); ++id) {
    Matcher c = m;
    if (c.advance(id)) set_bit(out, id);
  }
  return out;
}

std::vector<int32_t> allowed(const std::vector<uint64_t>& mask) {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < int32_t(mask.size() * 64); ++id)
    if (test_bit(mask, id)) ids.push_back(id);
  return ids;
}

// Random walks; at every step the mask equals brute force. Returns the number of steps.
int walk_and_compare(const std::shared_ptr<const CompiledGrammar>& g, int walks, int max_steps, uint32_t seed) {
  std::mt19937 rng(seed);
  int steps = 0;
  std::vector<uint64_t> mask(size_t(g->vocab().words()));
  for (int w = 0; w < walks; ++w) {
    Matcher m(g);
    for (int s = 0; s < max_steps && m.can_continue(); ++s) {
      m.fill_mask(mask, -1);
      const std::vector<uint64_t> want = brute_force(m);
      EXPECT_EQ(mask, want) << "walk " << w << " step " << s;
      if (mask != want) return steps;
      const std::vector<int32_t> ids = allowed(mask);
      if (ids.empty()) break;
      EXPECT_TRUE(m.advance(ids[rng() % ids.size()]));
      ++steps;
    }
  }
  return steps;
}

const char* kSchemas[] = {
    R"({"type":"object","properties":{"name":{"type":"string","maxLength":6},"age":{"type":"integer","minimum":0,"maximum":120},
        "tags":{"type":"array","items":{"enum":["a","b","xy"]},"maxItems":3},"ok":{"type":"boolean"}},
        "required":["name","age"]})",
    R"({"$defs":{"n":{"type":"object","properties":{"v":{"type":"number"},"k":{"type":"array","items":{"$ref":"#/$defs/n"},
        "maxItems":2}},"required":["v"]}},"$ref":"#/$defs/n"})",
    R"({"anyOf":[{"type":"null"},{"type":"array","items":{"anyOf":[{"type":"string"},{"type":"object",
        "properties":{"x":{"type":"integer"}},"additionalProperties":true}]}}]})",
    "true",
};

TEST(Mask, EqualsBruteForceOnRandomWalks) {
  auto v = json_vocab(400, 7);
  int total = 0;
  for (const char* s : kSchemas) total += walk_and_compare(schema_grammar(s, {}, v), 12, 60, 11);
  // Markup around free text and a JSON body (the shape of the DSML and thinking grammars).
  auto g = make_grammar(
      [](Builder& b) {
        const Json s = Json::parse(R"({"type":"object","properties":{"q":{"type":"string"}},"required":["q"]})");
        JsonSchemaCompiler c(b, s, {});
        return b.seq({b.text_without({"<|x|>"}), b.literal("<|x|>"), c.root_value()});
      },
      {}, v);
  total += walk_and_compare(g, 12, 60, 5);
  EXPECT_GT(total, 1000);  // the walks went somewhere
}

TEST(Mask, CacheIsSharedAndContextDependentTokensAreFew) {
  auto v = json_vocab(400, 3);
  auto g = schema_grammar(kSchemas[1], {}, v);
  walk_and_compare(g, 4, 40, 1);
  const int64_t cached = g->cached_nodes();
  EXPECT_GT(cached, 0);
  EXPECT_LE(cached, g->automaton().n_nodes());
  // Tokens of an object rule's node that cross the rule's end are context-dependent; the
  // follow set keeps only those whose next byte can follow the rule.
  for (int32_t n = 0; n < g->automaton().n_nodes(); ++n) {
    const NodeMask& nm = g->node_mask(n);
    EXPECT_LT(nm.dependent.size(), size_t(v->size() / 4)) << "node " << n;
  }
}

// With a limit of N tokens, walks that pick random allowed tokens always end complete, for
// every N from the shortest output up.
TEST(Mask, BudgetKeepsEveryWalkCompletable) {
  auto v = json_vocab(400, 9);
  for (const char* schema : kSchemas) {
    auto g = schema_grammar(schema, {}, v);
    const int64_t shortest = Matcher(g).distance();
    std::mt19937 rng(17);
    std::vector<uint64_t> mask(size_t(v->words()));
    for (int64_t budget = shortest; budget < shortest + 25; ++budget) {
      for (int w = 0; w < 6; ++w) {
        Matcher m(g);
        int64_t used = 0;
        for (; used < budget; ++used) {
          m.fill_mask(mask, budget - used - 1);
          std::vector<int32_t> ids = allowed(mask);
          // An accepting matcher could also stop here (EOS); the walk stops with chance 1/4.
          if (m.accepting() && (ids.empty() || rng() % 4 == 0)) break;
          ASSERT_FALSE(ids.empty()) << schema << " budget " << budget << " step " << used;
          ASSERT_TRUE(m.advance(ids[rng() % ids.size()]));
        }
        EXPECT_TRUE(m.accepting()) << schema << " budget " << budget << " walk " << w;
      }
    }
  }
}

TEST(Mask, BudgetBelowTheShortestOutputStillMovesTowardsTheEnd) {
  auto g = schema_grammar(R"({"type":"object","properties":{"abcdefgh":{"const":"ijklmnop"}},"required":["abcdefgh"]})");
  Matcher m(g);
  std::vector<uint64_t> mask(size_t(g->vocab().words()));
  for (int64_t d = m.distance(); d > 0; --d) {
    m.fill_mask(mask, 0);  // no room at all: only shortest-path bytes are allowed
    const std::vector<int32_t> ids = allowed(mask);
    ASSERT_FALSE(ids.empty());
    ASSERT_TRUE(m.advance(ids[0]));
    EXPECT_EQ(m.distance(), d - 1);
  }
  EXPECT_TRUE(m.accepting());
}

}  // namespace
}  // namespace dil::grammar
