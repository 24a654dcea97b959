// The completion parser (reasoning, content, DSML tool calls) on arbitrary model output: the
// streaming OutputParser fed in input-chosen chunks at character boundaries (what the
// detokenizer hands it), then the strict whole-text parse_completion.
#include <cstdint>
#include <string>

#include "core/check.h"
#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dil;
  fuzz::Choices ch(data, size);
  const uint8_t mode = ch.byte();
  const uint8_t step = ch.byte();
  // Model text is valid UTF-8 by construction (the detokenizer repairs it).
  const std::string text = tok::utf8_lossy(ch.rest());
  const tok::PromptFormat f = (mode & 1) ? tok::PromptFormat::V41 : tok::PromptFormat::V4;
  const bool thinking = mode & 2;
  tok::OutputParser p(f, thinking);
  std::string streamed;
  size_t i = 0, calls = 0;
  while (i < text.size()) {
    size_t j = std::min(text.size(), i + size_t(step % 16) + 1);
    while (j < text.size() && (static_cast<uint8_t>(text[j]) & 0xC0) == 0x80) ++j;  // whole characters
    const tok::ParserDelta d = p.push(std::string_view(text).substr(i, j - i));
    streamed += d.reasoning + d.content;
    calls += d.new_tool_calls.size();
    i = j;
  }
  const tok::ParserDelta last = p.finish();
  streamed += last.reasoning + last.content;
  calls += last.new_tool_calls.size();
  const tok::ParsedMessage m = p.message();
  DIL_CHECK(m.tool_calls.size() == calls, "message() has ", m.tool_calls.size(), " calls, deltas ", calls);
  DIL_CHECK(tok::utf8_invalid_at(streamed) == std::string::npos, "the parser emitted invalid UTF-8");
  try {
    (void)tok::parse_completion(f, text, thinking);
  } catch (const dil::Error&) {
  }
  return 0;
}
