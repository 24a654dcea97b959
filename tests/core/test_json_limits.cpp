#include "core/json_limits.h"

#include <gtest/gtest.h>

#include <string>

namespace dil {
namespace {

std::string nested(int depth, char open = '[', char close = ']') {
  return std::string(size_t(depth), open) + std::string(size_t(depth), close);
}

TEST(JsonLimits, CountsArraysAndObjects) {
  EXPECT_FALSE(json_too_deep("{}", 1));
  EXPECT_TRUE(json_too_deep("[[]]", 1));
  EXPECT_FALSE(json_too_deep(nested(512)));
  EXPECT_TRUE(json_too_deep(nested(513)));
  EXPECT_FALSE(json_too_deep(R"({"a":[{"b":[1]}],"c":{}})", 4));
  EXPECT_TRUE(json_too_deep(R"({"a":[{"b":[1]}],"c":{}})", 3));
}

TEST(JsonLimits, SiblingsDoNotAccumulate) {
  std::string s = "[";
  for (int i = 0; i < 10000; ++i) s += "[[1]],";
  s += "0]";
  EXPECT_FALSE(json_too_deep(s, 3));
  EXPECT_TRUE(json_too_deep(s, 2));
}

TEST(JsonLimits, BracketsInsideStringsAreText) {
  EXPECT_FALSE(json_too_deep(R"(["[[[[[[[[", "{{{{{{"])", 1));
  // An escaped quote does not end the string; an escaped backslash does not escape the quote.
  EXPECT_FALSE(json_too_deep(R"(["\"[[[[", "x"])", 1));
  EXPECT_TRUE(json_too_deep(R"(["\\", [[0]]])", 2));
  EXPECT_FALSE(json_too_deep(R"(["\\", [[0]]])", 3));
}

TEST(JsonLimits, StopsAtTheFirstLevelPastTheLimit) {
  // 10^6 levels (the attack) are rejected; unbalanced closers never count below zero.
  EXPECT_TRUE(json_too_deep(std::string(1000000, '[')));
  EXPECT_FALSE(json_too_deep("]]]]]]" + nested(3), 3));
  EXPECT_TRUE(json_too_deep("]]]]]]" + nested(4), 3));
}

}  // namespace
}  // namespace dil
