// Strings of the DeepSeek V4 and V4.1 chat formats (encoding_dsv4.py / V4.1 encoding.py).
#pragma once
#include <string>

#include "tokenizer/tokenizer.h"

namespace dil::tok {

inline constexpr const char* kBos = "<｜begin▁of▁sentence｜>";
inline constexpr const char* kEos = "<｜end▁of▁sentence｜>";
inline constexpr const char* kThinkStart = "<think>";
inline constexpr const char* kThinkEnd = "</think>";
inline constexpr const char* kDsml = "｜DSML｜";
inline constexpr const char* kUser = "<｜User｜>";
inline constexpr const char* kAssistant = "<｜Assistant｜>";
inline constexpr const char* kSystem = "<｜System｜>";  // V4.1 only
inline constexpr const char* kLatestReminder = "<｜latest_reminder｜>";
inline constexpr const char* kImage = "<｜deepseek_image｜>";  // V4.1 only

// DSML tag names: V4.1 puts a space after ｜DSML｜ and renames the block to " calls".
struct DsmlNames {
  std::string block, invoke, parameter;
};
inline DsmlNames dsml_names(PromptFormat f) {
  if (f == PromptFormat::V41) return {" calls", " invoke", " parameter"};
  return {"tool_calls", "invoke", "parameter"};
}

}  // namespace dil::tok
