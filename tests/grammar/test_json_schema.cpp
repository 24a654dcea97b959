// JSON Schema compilation: each keyword's language on hand-picked documents, numeric ranges
// exhaustively, and a named error for every keyword that is not supported.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "grammar/json_number.h"
#include "grammar_test_util.h"

namespace dil::grammar {
namespace {
using namespace testing;

void expect_docs(const std::string& schema, std::vector<std::string> yes, std::vector<std::string> no,
                 const GrammarOptions& o = {}) {
  auto g = schema_grammar(schema, o);
  for (const auto& s : yes) EXPECT_TRUE(matches(g, s)) << schema << " should accept " << s;
  for (const auto& s : no) EXPECT_FALSE(matches(g, s)) << schema << " should reject " << s;
}

TEST(JsonSchema, ObjectsInDeclaredOrderWithRequiredAndOptional) {
  const std::string s = R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},
      "c":{"type":"boolean"}},"required":["b"],"additionalProperties":false})";
  expect_docs(s, {R"({"b":"x"})", R"({"a":1,"b":""})", R"({"a":-7,"b":"x","c":true})", R"({ "b" : "x" })",
                  "{\"b\":\"x\",\n\"c\":false}"},
              {R"({})", R"({"a":1})", R"({"b":"x","a":1})", R"({"b":"x","d":1})", R"({"b":1})", R"({"b":"x",})",
               R"({   "b":"x"})", R"({"a":1.5,"b":"x"})"});
}

TEST(JsonSchema, AdditionalPropertiesNeverRepeatADeclaredKey) {
  expect_docs(R"({"type":"object","properties":{"ab":{"type":"null"}},"additionalProperties":{"type":"integer"}})",
              {R"({})", R"({"ab":null})", R"({"ab":null,"a":1,"abc":2})", R"({"x_y-1":3})"},
              {R"({"ab":1})", R"({"ab":null,"ab":3})", R"({"a":null})", R"({"a b":1})"});
  // Absent additionalProperties: no keys beyond the declared ones (a subset of what it allows);
  // without properties either, any object.
  expect_docs(R"({"properties":{"k":{"const":1}}})", {R"({"k":1})", R"({})"}, {R"({"k":1,"z":2})"});
  expect_docs(R"({"type":"object"})", {R"({})", R"({"k":1,"z":[true]})"}, {"[]", R"({"k":})"});
  expect_docs(R"({"type":"object","required":["id"]})", {R"({"id":"x"})", R"({"id":1,"n":null})"}, {R"({})"});
}

TEST(JsonSchema, ArraysCountedAndTuples) {
  const std::string s = R"({"type":"array","items":{"type":"integer","minimum":0,"maximum":9},"minItems":1,"maxItems":3})";
  expect_docs(s, {"[1]", "[1,2]", "[ 1 , 2 , 3 ]"}, {"[]", "[1,2,3,4]", "[10]", "[1,]", "[-1]"});
  expect_docs(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"null"}],"items":false,"minItems":1})",
              {R"(["a"])", R"(["a",null])"}, {"[]", R"([null])", R"(["a",null,null])", R"(["a","b"])"});
  expect_docs(R"({"type":"array","prefixItems":[{"const":1}],"items":{"const":2}})",
              {"[]", "[1]", "[1,2]", "[1,2,2]"}, {"[2]", "[1,1]"});
  expect_docs(R"({"type":"array","maxItems":0})", {"[]"}, {"[1]"});
}

TEST(JsonSchema, StringsLengthsPatternsAndFormats) {
  // Lengths count characters: an escape or a multi-byte character is one.
  expect_docs(R"({"type":"string","minLength":2,"maxLength":3})",
              {R"("ab")", R"("abc")", R"("a\n")", R"("é€")", R"("\"\\")", R"("\u0001x")"},
              {R"("a")", R"("abcd")", "\"a\nb\"", R"("ab)", R"(ab)"});
  expect_docs(R"({"type":"string","pattern":"^[A-Z]{2}-\\d+$"})", {R"("AB-1")", R"("ZZ-0123")"},
              {R"("A-1")", R"("AB-")", R"("ab-1")"});
  expect_docs(R"({"type":"string","format":"date"})", {R"("2024-02-28")", R"("1999-12-31")"},
              {R"("2024-13-01")", R"("2024-02-30")", R"("24-01-01")"});
  expect_docs(R"({"type":"string","format":"date-time"})", {R"("2024-05-06T07:08:09Z")", R"("2024-05-06T23:59:59.123+02:00")"},
              {R"("2024-05-06 07:08:09Z")", R"("2024-05-06T24:00:00Z")"});
  expect_docs(R"({"type":"string","format":"uuid"})", {R"("123e4567-e89b-12d3-a456-426614174000")"}, {R"("123e4567")"});
  expect_docs(R"({"type":"string","format":"email"})", {R"("a.b+c@example.co")"}, {R"("a@b")", R"("@example.com")", R"("a..b@x.io")"});
  expect_docs(R"({"type":"string","format":"ipv4"})", {R"("192.168.0.255")"}, {R"("256.1.1.1")", R"("01.1.1.1")"});
}

TEST(JsonSchema, EnumConstAnyOfAndTypes) {
  expect_docs(R"({"enum":["a",1,null,{"k":[true]}]})", {R"("a")", "1", "null", R"({"k":[true]})"}, {R"("b")", "2", "true"});
  expect_docs(R"({"type":"string","enum":["a",1]})", {R"("a")"}, {"1"});
  expect_docs(R"({"const":"x\"y"})", {R"("x\"y")"}, {R"("xy")"});
  expect_docs(R"({"anyOf":[{"type":"integer"},{"type":"null"}],"title":"t","default":null})", {"3", "null"}, {"1.5", R"("3")"});
  expect_docs(R"({"type":["boolean","null"]})", {"true", "false", "null"}, {"0", R"("true")"});
  expect_docs(R"({"oneOf":[{"type":"string"},{"type":"integer"}]})", {R"("s")", "4"}, {"4.5"});
  expect_docs(R"({"oneOf":[{"type":"object","properties":{"t":{"const":"a"},"x":{"type":"integer"}},"required":["t","x"]},
                            {"type":"object","properties":{"t":{"const":"b"}},"required":["t"]}]})",
              {R"({"t":"a","x":1})", R"({"t":"b"})"}, {R"({"t":"a"})", R"({"t":"c"})"});
  expect_docs(R"({"allOf":[{"type":"null"}]})", {"null"}, {"1"});
  expect_docs("true", {"1", R"({"a":[1,{"b":null}]})", R"("s")"}, {"", "nul"});
}

TEST(JsonSchema, RefsDefsAndBoundedRecursion) {
  const std::string tree = R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
      "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v","kids"]}},"$ref":"#/$defs/node"})";
  expect_docs(tree, {R"({"v":1,"kids":[]})", R"({"v":1,"kids":[{"v":2,"kids":[]},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"},
              {R"({"v":1})", R"({"v":1,"kids":[{"v":2}]})"});
  GrammarOptions shallow;
  shallow.max_depth = 3;
  expect_docs(tree, {R"({"v":1,"kids":[{"v":2,"kids":[]}]})"}, {R"({"v":1,"kids":[{"v":2,"kids":[{"v":3,"kids":[]}]}]})"},
              shallow);
  expect_docs(R"({"definitions":{"a":{"type":"boolean"}},"type":"array","items":{"$ref":"#/definitions/a"}})",
              {"[true,false]"}, {"[1]"});
  expect_docs(R"({"type":"object","properties":{"self":{"$ref":"#"}},"additionalProperties":false})",
              {R"({})", R"({"self":{"self":{}}})"}, {R"({"self":1})"});
}

TEST(JsonSchema, IntegerRangesExhaustively) {
  const std::vector<std::pair<std::optional<int64_t>, std::optional<int64_t>>> ranges = {
      {0, 100}, {-37, 5}, {-150, -7}, {9, 9}, {10, 99}, {1, std::nullopt}, {std::nullopt, -12}, {-1, 1}, {95, 123}};
  for (auto [lo, hi] : ranges) {
    auto g = make_grammar([&](Builder& b) { return integer_expr(b, lo, hi); });
    for (int64_t v = -200; v <= 200; ++v) {
      const bool in = (!lo || v >= *lo) && (!hi || v <= *hi);
      EXPECT_EQ(matches(g, std::to_string(v)), in) << v << " in [" << lo.value_or(-999) << ", " << hi.value_or(999) << "]";
    }
    EXPECT_FALSE(matches(g, "01"));
    EXPECT_FALSE(matches(g, "-0"));
    EXPECT_FALSE(matches(g, "+1"));
  }
  expect_docs(R"({"type":"integer","exclusiveMinimum":2.5,"maximum":4})", {"3", "4"}, {"2", "5", "3.0"});
  expect_docs(R"({"type":"integer"})", {"0", "-123456789012345678"}, {"1234567890123456789", "1.0", "01"});
}

TEST(JsonSchema, DecimalRangesAgreeWithDoubleComparison) {
  struct Case {
    const char* schema;
    double lo, hi;
    bool lo_x, hi_x;
  };
  const Case cases[] = {
      {R"({"type":"number","minimum":0,"maximum":1})", 0, 1, false, false},
      {R"({"type":"number","exclusiveMinimum":0,"exclusiveMaximum":1})", 0, 1, true, true},
      {R"({"type":"number","minimum":-2.5,"exclusiveMaximum":0.125})", -2.5, 0.125, false, true},
      {R"({"type":"number","exclusiveMinimum":-1.75,"maximum":-0.5})", -1.75, -0.5, true, false},
      {R"({"type":"number","minimum":0.1})", 0.1, INFINITY, false, false},
      {R"({"type":"number","maximum":-3})", -INFINITY, -3, false, false},
  };
  std::vector<std::string> values;
  for (int i = -400; i <= 400; ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", i / 80.0);
    values.push_back(buf);
    values.push_back(std::to_string(i / 40));
  }
  for (const char* v : {"0.1", "0.10", "0.09", "0.100001", "-0.5", "-0.50", "1.0", "0.0", "-3", "-3.000", "-2.999"})
    values.push_back(v);
  for (const Case& c : cases) {
    auto g = schema_grammar(c.schema);
    for (const std::string& v : values) {
      if (v == "-0" || v.rfind("-0.000", 0) == 0) continue;  // -0: never generated
      const double x = std::stod(v);
      const bool in = (c.lo_x ? x > c.lo : x >= c.lo) && (c.hi_x ? x < c.hi : x <= c.hi);
      EXPECT_EQ(matches(g, v), in) << c.schema << " value " << v;
    }
  }
  expect_docs(R"({"type":"number"})", {"0", "-1.5e-10", "3E+2", "12.5"}, {"1.", ".5", "1e", "01", "1e100"});
}

TEST(JsonSchema, UnsupportedKeywordsAreNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"type":"object","patternProperties":{"a":{}}})", "patternProperties"},
      {R"({"type":"object","minProperties":1})", "minProperties"},
      {R"({"not":{"type":"null"}})", "not"},
      {R"({"if":{},"then":{}})", "if"},
      {R"({"type":"array","uniqueItems":true})", "uniqueItems"},
      {R"({"type":"string","format":"color"})", "format"},
      {R"({"type":"number","multipleOf":0.5})", "multipleOf"},
      {R"({"$ref":"http://example.com/s.json"})", "$ref"},
      {R"({"$ref":"#/$defs/missing"})", "$ref"},
      {R"({"$ref":"#/$defs/a","type":"object","$defs":{"a":{}}})", "type"},
      {R"({"anyOf":[{"type":"string"}],"minLength":1})", "minLength"},
      {R"({"oneOf":[{"type":"string"},{"type":"string","maxLength":3}]})", "oneOf"},
      {R"({"allOf":[{"type":"string"},{"maxLength":3}]})", "allOf"},
      {R"j({"type":"string","pattern":"(?=x)"})j", "pattern"},
      {R"({"type":"string","maxLength":100000})", "maxLength"},
      {R"({"type":"integer","minimum":5,"maximum":4})", "minimum"},
      {R"({"type":"widget"})", "type"},
      {R"({"type":"object","properties":{"a":{"contains":{}}}})", "contains"},
  };
  for (const auto& [schema, kw] : cases) {
    try {
      schema_grammar(schema);
      ADD_FAILURE() << schema << " compiled";
    } catch (const GrammarError& e) {
      EXPECT_EQ(e.keyword, kw) << schema << ": " << e.what();
    }
  }
  try {
    schema_grammar(R"({"type":"object","properties":{"a":{"type":"object","properties":{"b":{"nope":1}}}}})");
    ADD_FAILURE();
  } catch (const GrammarError& e) {
    EXPECT_EQ(e.path, "/properties/a/properties/b");
    EXPECT_NE(std::string(e.what()).find("'nope'"), std::string::npos);
  }
}

TEST(JsonSchema, WhitespaceIsBounded) {
  GrammarOptions compact;
  compact.max_whitespace = 0;
  expect_docs(R"({"type":"array","items":{"type":"integer"}})", {"[1,2]"}, {"[1, 2]", "[ 1]"}, compact);
  GrammarOptions two;
  expect_docs(R"({"type":"array","items":{"type":"integer"}})", {"[\n 1,\t2  ]"}, {"[1,   2]"}, two);
}

TEST(JsonSchema, RawStringAndNonStringForms) {
  const Json s = Json::parse(R"({"anyOf":[{"type":"string","maxLength":3},{"type":"integer"},{"enum":["x|y",2]}]})");
  CharSet no_bar = CharSet::all().minus(CharSet::of('|', '|'));
  auto raw = make_grammar([&](Builder& b) { return JsonSchemaCompiler(b, s, {}, no_bar).value(s, "", ValueForm::RawString); });
  for (const char* v : {"", "a\"b", "é\n"}) EXPECT_TRUE(matches(raw, v)) << v;
  for (const char* v : {"abcd", "\"ab\"", "a|", "x|y"}) EXPECT_FALSE(matches(raw, v)) << v;
  auto other = make_grammar([&](Builder& b) { return JsonSchemaCompiler(b, s, {}).value(s, "", ValueForm::JsonNonString); });
  for (const char* v : {"12", "2", "-3"}) EXPECT_TRUE(matches(other, v)) << v;
  for (const char* v : {"\"a\"", "x|y", "1.5"}) EXPECT_FALSE(matches(other, v)) << v;
}

TEST(JsonSchema, PlainDecimal) {
  EXPECT_EQ(plain_decimal(1e-05), "0.00001");
  EXPECT_EQ(plain_decimal(-2.5e3), "-2500");
  EXPECT_EQ(plain_decimal(0.1), "0.1");
  EXPECT_EQ(plain_decimal(1e21), "1000000000000000000000");
}

}  // namespace
}  // namespace dil::grammar
