// Regexes and choices: whole-string matching, the escapes, and a named error for every
// feature that is not supported.
#include <gtest/gtest.h>

#include "grammar_test_util.h"

namespace dil::grammar {
namespace {
using namespace testing;

void expect_language(const std::string& re, std::vector<std::string> yes, std::vector<std::string> no) {
  auto g = regex_grammar(re);
  for (const auto& s : yes) EXPECT_TRUE(matches(g, s)) << re << " should match '" << s << "'";
  for (const auto& s : no) EXPECT_FALSE(matches(g, s)) << re << " should not match '" << s << "'";
}

TEST(Regex, Basics) {
  expect_language("abc", {"abc"}, {"", "ab", "abcd"});
  expect_language("^a(b|cd)*e$", {"ae", "abe", "acdbe", "abbbcde"}, {"a", "ace", "abce"});
  expect_language("[a-c]+x?", {"a", "abcx", "cc"}, {"", "x", "ad", "ax x"});
  expect_language("[^a-c\\d]", {"d", "Z"}, {"a", "5", "", "dd", "é"});  // a shorthand inside: ASCII
  expect_language("[^a-c]", {"d", "é", "5"}, {"a", "", "dd"});
  expect_language("\\d{2,3}-\\w\\s", {"12-a ", "123-_\t"}, {"1-a ", "1234-a ", "12-- "});
  expect_language("a{3}b{2,}c{0,1}", {"aaabb", "aaabbbbc"}, {"aabb", "aaab", "aaabbcc"});
  expect_language("(?:ab)+(?P<n>c)(?<m>d)", {"abcd", "ababcd"}, {"cd", "abc"});
  expect_language("x.y", {"xay", "x-y", "x→y"}, {"xy", "x\ny"});
  expect_language("\\.\\*\\x41\\u00e9[\\]\\-]", {".*Aé]", ".*Aé-"}, {".*Ae]"});
  expect_language("a+?b*?", {"a", "aab"}, {"b"});  // lazy quantifiers: the same language
  expect_language("[]a]|[-z]", {"]", "a", "-", "z"}, {"b"});
}

TEST(Regex, NegatedShorthandsStayInAscii) {
  // Python's re reads \D \W \S as Unicode classes: only what both readings agree on.
  expect_language("\\W", {"-", " "}, {"a", "é", "٣"});
  expect_language("[^\\d]", {"a", "-"}, {"٣", "5"});
}

TEST(Regex, JsonStringModeEscapes) {
  auto g = make_grammar([](Builder& b) { return regex_expr(b, "a\"[\\\\x]\\n", CharMode::JsonString); });
  EXPECT_TRUE(matches(g, "a\\\"\\\\\\n"));
  EXPECT_TRUE(matches(g, "a\\\"x\\n"));
  EXPECT_FALSE(matches(g, "a\"x\n"));
}

TEST(Regex, UnsupportedFeaturesAreNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"(?=a)b", "(?="}, {"(?!a)b", "(?!"}, {"(?<=a)b", "(?<="}, {"(a)\\1", "backreference"}, {"\\bword", "\\b"},
      {"\\p{L}", "\\p"}, {"(?i)abc", "(?"}, {"a*+", "+"}, {"a^b", "^"}, {"[[:alpha:]]", "[:"}, {"a{2000}", "{"},
      {"(ab", "("}, {"ab)", ")"}, {"*a", "*"}};
  for (const auto& [re, feature] : cases) {
    try {
      regex_grammar(re);
      ADD_FAILURE() << re << " compiled";
    } catch (const GrammarError& e) {
      EXPECT_FALSE(e.keyword.empty()) << re;
      EXPECT_EQ(e.keyword, feature) << re << ": " << e.what();
    }
  }
}

TEST(Regex, Choice) {
  auto g = make_grammar([](Builder& b) { return choice_expr(b, {"yes", "no", "not sure"}, CharMode::Raw); });
  for (const char* s : {"yes", "no", "not sure"}) EXPECT_TRUE(matches(g, s));
  for (const char* s : {"", "ye", "nope", "not"}) EXPECT_FALSE(matches(g, s));
}

}  // namespace
}  // namespace dil::grammar
