// The IR compiled to automata: each construct accepts exactly its strings; distances, follow
// sets and the limits.
#include <gtest/gtest.h>

#include "grammar_test_util.h"

namespace dil::grammar {
namespace {
using namespace testing;

TEST(Automaton, LiteralsAlternativesAndRepetition) {
  auto g = make_grammar([](Builder& b) {
    return b.seq({b.literal("ab"), b.alt({b.literal("c"), b.literal("de")}), b.repeat(b.byte('x'), 1, 3)});
  });
  for (const char* s : {"abcx", "abdex", "abcxxx", "abdexx"}) EXPECT_TRUE(matches(g, s)) << s;
  for (const char* s : {"", "ab", "abc", "abcxxxx", "abdx", "abcd", "abcex"}) EXPECT_FALSE(matches(g, s)) << s;
  EXPECT_TRUE(prefix_ok(g, "abd"));
  EXPECT_FALSE(prefix_ok(g, "abx"));
}

TEST(Automaton, UnboundedAndOutlinedRepetition) {
  auto star = make_grammar([](Builder& b) { return b.seq({b.repeat(b.literal("ab"), 2, -1), b.byte('!')}); });
  EXPECT_FALSE(matches(star, "ab!"));
  EXPECT_TRUE(matches(star, "abab!"));
  EXPECT_TRUE(matches(star, "abababababab!"));
  // A large child counted many times becomes a called rule; the language is the same.
  const std::string big(100, 'q');
  auto counted = make_grammar([&](Builder& b) { return b.repeat(b.alt({b.literal(big), b.byte('z')}), 3, 5); });
  EXPECT_GT(counted->automaton().rule_start.size(), 1u);
  EXPECT_TRUE(matches(counted, big + "z" + big));
  EXPECT_TRUE(matches(counted, "zzzzz"));
  EXPECT_FALSE(matches(counted, "zz"));
  EXPECT_FALSE(matches(counted, "zzzzzz"));
  EXPECT_FALSE(matches(counted, big + "zz" + big.substr(1)));
}

TEST(Automaton, MembersKeepOrderSkipOptionalAndSeparate) {
  auto g = make_grammar([](Builder& b) {
    return b.seq({b.byte('{'),
                  b.members({{b.byte('a'), false}, {b.byte('b'), true}, {b.byte('c'), false}}, b.byte(','), -1, 0),
                  b.byte('}')});
  });
  for (const char* s : {"{b}", "{a,b}", "{b,c}", "{a,b,c}"}) EXPECT_TRUE(matches(g, s)) << s;
  for (const char* s : {"{}", "{a}", "{b,a}", "{,b}", "{b,}", "{ab}", "{a,b,c,c}", "{c,b}"})
    EXPECT_FALSE(matches(g, s)) << s;
  auto extra = make_grammar([](Builder& b) {
    return b.members({{b.byte('a'), false}}, b.byte(','), b.byte('x'), -1);
  });
  for (const char* s : {"", "a", "x", "a,x,x", "x,x"}) EXPECT_TRUE(matches(extra, s)) << s;
  for (const char* s : {"x,a", "ax", "a,", ",x"}) EXPECT_FALSE(matches(extra, s)) << s;
}

TEST(Automaton, TextWithoutForbiddenStrings) {
  auto g = make_grammar([](Builder& b) { return b.seq({b.text_without({"</t>", "||"}), b.literal("</t>")}); });
  for (const char* s : {"</t>", "abc</t>", "<</t>", "</</t>", "a|b</t>", "</ t></t>"}) EXPECT_TRUE(matches(g, s)) << s;
  for (const char* s : {"a</t>b</t>", "a||</t>", "abc", "</t></t>"}) EXPECT_FALSE(matches(g, s)) << s;
}

// Balanced brackets through a recursive rule; the stack depth bounds the nesting.
TEST(Automaton, RecursionIsBoundedByMaxDepth) {
  GrammarOptions o;
  o.max_depth = 4;
  Builder b;
  const int32_t root = b.add_rule("root");
  b.define(root, b.repeat(b.seq({b.byte('('), b.call(root), b.byte(')')}), 0, -1));
  auto g = std::make_shared<CompiledGrammar>(compile(b, root, o), byte_vocab());
  for (const char* s : {"", "()", "()()", "(())", "((()))()", "((()))"}) EXPECT_TRUE(matches(g, s)) << s;
  EXPECT_FALSE(matches(g, "(((())))"));  // five frames
  EXPECT_FALSE(matches(g, "(()"));
  EXPECT_FALSE(matches(g, "())"));
}

TEST(Automaton, DistancesAndFollowSets) {
  Builder b;
  const int32_t root = b.add_rule("root"), item = b.add_rule("item");
  b.define(item, b.alt({b.literal("xyz"), b.literal("q")}));
  b.define(root, b.seq({b.literal("ab"), b.call(item), b.alt({b.literal(";"), b.literal("!!")})}));
  const Automaton a = compile(b, root, {});
  EXPECT_EQ(a.dist[size_t(a.rule_start[size_t(root)])], 2 + 1 + 1);
  EXPECT_EQ(a.dist[size_t(a.rule_start[size_t(item)])], 1);
  EXPECT_TRUE(a.follow[size_t(item)].test(';'));
  EXPECT_TRUE(a.follow[size_t(item)].test('!'));
  EXPECT_EQ(a.follow[size_t(item)].count(), 2u);
  EXPECT_EQ(a.follow[size_t(root)].count(), 0u);  // nothing follows the output
  auto g = std::make_shared<CompiledGrammar>(compile(b, root, {}), byte_vocab());
  Matcher m(g);
  EXPECT_EQ(m.distance(), 4);
  ASSERT_TRUE(m.advance_bytes("abx"));
  EXPECT_EQ(m.distance(), 2 + 1);
}

TEST(Automaton, GrammarsThatCannotFinishOrAreTooLargeAreRefused) {
  Builder b;
  const int32_t root = b.add_rule("root");
  b.define(root, b.seq({b.byte('('), b.call(root), b.byte(')')}));  // no base case
  EXPECT_THROW(compile(b, root, {}), GrammarError);
  GrammarOptions small;
  small.max_dfa_states = 50;
  EXPECT_THROW(make_grammar([](Builder& bb) { return bb.repeat(bb.byte('a'), 0, 100); }, small), GrammarError);
}

TEST(Vocabulary, TrieInPreorderWithSubtreeEnds) {
  Vocabulary v({"ab", "", "a", "b", "abc", "ab", "ba"});
  EXPECT_EQ(v.n_usable(), 6);
  // Nodes: a, ab, abc, b, ba.
  ASSERT_EQ(v.n_nodes(), 5);
  EXPECT_EQ(v.byte(0), 'a');
  EXPECT_EQ(v.subtree_end(0), 3);
  EXPECT_EQ(std::vector<int32_t>(v.ids_at(1).begin(), v.ids_at(1).end()), (std::vector<int32_t>{0, 5}));
  EXPECT_EQ(v.depth(2), 3);
  EXPECT_EQ(v.subtree_end(3), 5);
  EXPECT_EQ(v.max_depth(), 3);
}

}  // namespace
}  // namespace dil::grammar
