// The prompt encoders (render_chat, V4 and V4.1) on arbitrary JSON: messages, tools and
// options as a client could send them after validation or as `render` reads them. They must
// render or throw dil::Error.
#include <cstdint>
#include <string>

#include "core/check.h"
#include "core/json_limits.h"
#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dil;
  fuzz::Choices ch(data, size);
  const uint8_t mode = ch.byte();
  const std::string text(ch.rest());
  if (json_too_deep(text)) return 0;  // refused before parsing everywhere it comes from
  tok::Json j;
  try {
    j = tok::Json::parse(text);
  } catch (const std::exception&) {
    return 0;
  }
  tok::ChatOptions o;
  o.thinking_mode = (mode & 1) ? "thinking" : "chat";
  o.add_generation_prompt = !(mode & 2);
  tok::Json messages = j;
  if (j.is_object()) {
    messages = j.contains("messages") ? j["messages"] : tok::Json::array();
    if (j.contains("tools")) o.tools = j["tools"];
    if (j.contains("response_format")) o.response_format = j["response_format"];
    if (j.contains("reasoning_effort")) o.reasoning_effort = j["reasoning_effort"];
  }
  const tok::PromptFormat f = (mode & 4) ? tok::PromptFormat::V41 : tok::PromptFormat::V4;
  try {
    const std::string p = tok::render_chat(f, messages, o);
    DIL_CHECK(!p.empty(), "an empty prompt (no BOS)");
  } catch (const dil::Error&) {
  }
  return 0;
}
