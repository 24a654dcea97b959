// Tokenizer unit tests. Exactness against HF `tokenizers` on a large corpus is in
// tests/python/test_tokenizer_hf.py; here: the spec's published ids, errors, decoding,
// streaming detokenization and stop strings.
#include <gtest/gtest.h>

#include "core/check.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

using namespace dil;
using namespace dil::tok;

namespace {
const Tokenizer& v3() {
  static const auto t = Tokenizer::load("tests/data/deepseek-v3-tokenizer/tokenizer.json");  // read-only
  return *t;
}
const char* const kMixed =
    "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ 日本語のかなカナ 한국어 مرحبا नमस्ते สวัสดี 👨‍👩‍👧‍👦 👍🏽 e\u0301\n"
    "def f(x):\r\n\treturn x ** 2  # comment\n\n   <｜begin▁of▁sentence｜>hi<｜end▁of▁sentence｜>";
}  // namespace

TEST(Tokenizer, SpecVectors) {
  // model-spec.md §5.1 (ids published for the DeepSeek tokenizer; V3 and V4 agree here).
  EXPECT_EQ(v3().encode("Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ"),
            (std::vector<int32_t>{19923, 3, 223, 5464, 5008, 1175, 19, 940, 223, 19, 438, 223, 20, 6113, 257, 76589, 131,
                                  100, 76032, 1628, 76589, 131, 108, 76589, 131, 98}));
  EXPECT_EQ(v3().token_to_id("<｜User｜>"), 128803);
  EXPECT_EQ(v3().token_to_id("<｜end▁of▁sentence｜>"), 1);
  EXPECT_TRUE(v3().is_special(1));
  EXPECT_EQ(v3().token_to_id("no such token"), -1);
  EXPECT_EQ(v3().encode("<｜User｜>x")[0], 128803);
}

TEST(Tokenizer, ParseSpecialFalseTreatsSpecialTokensAsText) {
  // Like HF's encode_special_tokens: special tokens become text; non-special added tokens
  // (V3's <｜User｜> is one) are still matched.
  auto ids = v3().encode("<｜end▁of▁sentence｜><｜User｜>", false);
  EXPECT_GT(ids.size(), 2u);
  EXPECT_NE(ids[0], 1);
  EXPECT_EQ(ids.back(), 128803);
  EXPECT_EQ(v3().decode(ids), "<｜end▁of▁sentence｜><｜User｜>");
}

TEST(Tokenizer, InvalidUtf8IsAClearError) {
  EXPECT_THROW(v3().encode(std::string("ok \xff bad")), Error);
  EXPECT_THROW(v3().encode(std::string("cut \xe4\xb8")), Error);
  EXPECT_THROW(v3().encode(std::string("surrogate \xed\xa0\x80")), Error);
  try {
    v3().encode(std::string("ab\xc0\xaf"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("byte offset 2"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, DecodeRoundTripAndSkipSpecial) {
  auto ids = v3().encode(kMixed);
  EXPECT_EQ(v3().decode(ids), kMixed);
  std::string skipped = v3().decode(ids, true);
  EXPECT_EQ(skipped.find("<｜end▁of▁sentence｜>"), std::string::npos);
  EXPECT_NE(skipped.find("hi"), std::string::npos);
  EXPECT_THROW(v3().decode({-1}), Error);
  // Ids past the tokenizer (a checkpoint's padded vocabulary rows: V4's head has 129,280 for the
  // tokenizer's 128,815 ids) have no text, as HF's decode skips them.
  const auto pad = static_cast<int32_t>(v3().vocab_size());
  EXPECT_EQ(v3().decode({ids[0], pad, 129279, ids[1]}), v3().decode({ids[0], ids[1]}));
}

// A model may sample a padded id; the streaming detokenizer adds no text for it and never throws
// (it runs on the server's connection threads, where an exception would end the process).
TEST(Detokenizer, IdsPastTheTokenizerAddNoText) {
  IncrementalDetokenizer d(v3(), false);
  const auto ids = v3().encode("hello world");
  std::string all = d.push(ids[0]);
  EXPECT_EQ(d.push(static_cast<int32_t>(v3().vocab_size())), "");
  EXPECT_EQ(d.push(129279), "");
  EXPECT_EQ(d.push(-5), "");
  for (size_t i = 1; i < ids.size(); ++i) all += d.push(ids[i]);
  all += d.flush();
  EXPECT_EQ(all, "hello world");
}

TEST(Tokenizer, LoadErrors) {
  EXPECT_THROW(Tokenizer::load("tests/data/does-not-exist.json"), Error);
  EXPECT_THROW(Tokenizer::load("tests/data/tokenizer/README.md"), Error);
}

TEST(Detokenizer, NeverEmitsBrokenUtf8AndMatchesDecode) {
  auto ids = v3().encode(kMixed);
  // Byte-level tokens split emoji and CJK across ids: every emitted piece must still be valid.
  for (bool skip : {false, true}) {
    IncrementalDetokenizer d(v3(), skip);
    std::string all;
    int split_chars = 0;
    for (int32_t id : ids) {
      std::string piece = d.push(id);
      EXPECT_EQ(utf8_invalid_at(piece), std::string::npos) << "id " << id;
      if (piece.empty()) ++split_chars;
      all += piece;
    }
    all += d.flush();
    EXPECT_EQ(all, v3().decode(ids, skip));
    EXPECT_GT(split_chars, 0);  // the text really has characters spread over several tokens
  }
}

TEST(Detokenizer, InvalidBytesBecomeReplacementLikeDecode) {
  // The byte-level token of byte 0xE4 (GPT-2 maps it to U+00E4 "ä") is a lone lead byte of a
  // 3-byte sequence; followed by ASCII it can never complete.
  const int32_t lead = v3().token_to_id("ä");
  ASSERT_GE(lead, 0);
  std::vector<int32_t> ids = {lead, v3().encode("A")[0]};
  IncrementalDetokenizer d(v3(), false);
  std::string all = d.push(ids[0]);
  EXPECT_EQ(all, "");  // could still become a character
  all += d.push(ids[1]);
  all += d.flush();
  EXPECT_EQ(all, v3().decode(ids));
  EXPECT_EQ(utf8_invalid_at(all), std::string::npos);
  IncrementalDetokenizer e(v3(), false);
  std::string first = e.push(lead);
  EXPECT_EQ(first + e.flush(), "\xEF\xBF\xBD");
}

TEST(StopMatcher, StopStringSpanningPieces) {
  const std::string text = "The answer is 42.\nUser: next question";
  // Every way of cutting the text in two must give the same output.
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    StopMatcher m({"\nUser:", "never"});
    bool stopped = false;
    std::string out = m.push(text.substr(0, cut), &stopped);
    EXPECT_EQ(out.find('\n'), std::string::npos) << cut;  // the stop's first char is held back
    if (!stopped) out += m.push(text.substr(cut), &stopped);
    EXPECT_TRUE(stopped) << cut;
    EXPECT_EQ(out, "The answer is 42.") << cut;
    EXPECT_EQ(m.flush(), "");
  }
}

TEST(StopMatcher, PartialMatchIsReleasedWhenItFails) {
  StopMatcher m({"</stop>"});
  bool stopped;
  EXPECT_EQ(m.push("a </st", &stopped), "a ");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(m.push("ay>", &stopped), "</stay>");
  EXPECT_EQ(m.push("</s", &stopped), "");
  EXPECT_EQ(m.flush(), "</s");
}

TEST(StopMatcher, EarliestStopWinsAndUtf8IsKept) {
  StopMatcher m({"世界", "b"});
  bool stopped;
  std::string out = m.push("a你好世", &stopped);
  EXPECT_EQ(out, "a你好");
  out += m.push("界b", &stopped);
  EXPECT_TRUE(stopped);
  EXPECT_EQ(out, "a你好");
}

TEST(PromptFormat, FromConfig) {
  EXPECT_EQ(prompt_format_from_config("tests/data/v4-tiny/config.json"), PromptFormat::V4);
  EXPECT_EQ(prompt_format_from_config("tests/data/v41-tiny/config.json"), PromptFormat::V41);
  EXPECT_THROW(prompt_format_from_config("tests/data/nope/config.json"), Error);
}
