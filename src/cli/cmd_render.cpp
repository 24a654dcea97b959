// `deepinfer-lab render --model DIR | --config config.json [--tokenizer tokenizer.json] [--parse]`
// Prompt inspection. JSON lines in, JSON lines out:
//   render:  {"messages": [...], "thinking_mode": "chat"|"thinking", "reasoning_effort": ...,
//             "tools": [...], "response_format": {...}, "add_generation_prompt": true}
//            -> {"prompt": "..."} (+ "ids" when a tokenizer is given and --ids is set)
//   --parse: {"text": "<completion>", "thinking_mode": ...}
//            -> {"content", "reasoning_content", "tool_calls": [{"type": "function", "function": {...}}]}
// The prompt format (V4 or V4.1) comes from config.json (--format v4|v41 overrides it).
// A bad line yields {"error": "..."} and processing continues (exit code 1 at the end).
#include <iostream>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "tokenizer/tokenizer.h"

namespace dil::cli {

int cmd_render(int argc, char** argv) {
  Args args(argc, argv, {"parse", "ids"});
  std::string config = args.get("config"), tokenizer = args.get("tokenizer");
  if (args.has("model")) {
    if (config.empty()) config = args.get("model") + "/config.json";
    if (tokenizer.empty()) tokenizer = args.get("model") + "/tokenizer.json";
  }
  tok::PromptFormat fmt;
  if (args.has("format")) {
    std::string f = args.get("format");
    if (f == "v4") fmt = tok::PromptFormat::V4;
    else if (f == "v41") fmt = tok::PromptFormat::V41;
    else DIL_FAIL("--format must be v4 or v41");
  } else {
    if (config.empty()) DIL_FAIL("render needs --model DIR or --config PATH (or --format v4|v41)");
    fmt = tok::prompt_format_from_config(config);
  }
  std::unique_ptr<tok::Tokenizer> t;
  if (args.has("ids")) {
    if (tokenizer.empty()) DIL_FAIL("--ids needs --tokenizer or --model");
    t = tok::Tokenizer::load(tokenizer);
  }
  const bool parse = args.has("parse");
  std::ios::sync_with_stdio(false);
  std::string line;
  int rc = 0;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    tok::Json out;
    try {
      tok::Json in = tok::Json::parse(line);
      std::string mode = in.value("thinking_mode", "chat");
      if (parse) {
        auto m = tok::parse_completion(fmt, in.at("text").get<std::string>(), mode == "thinking");
        out["content"] = m.content;
        out["reasoning_content"] = m.reasoning_content;
        out["tool_calls"] = tok::Json::array();
        for (const auto& c : m.tool_calls)
          out["tool_calls"].push_back({{"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments_json}}}});
      } else {
        tok::ChatOptions o;
        o.thinking_mode = mode;
        o.reasoning_effort = in.value("reasoning_effort", tok::Json());
        o.tools = in.value("tools", tok::Json());
        o.response_format = in.value("response_format", tok::Json());
        o.add_generation_prompt = in.value("add_generation_prompt", true);
        out["prompt"] = tok::render_chat(fmt, in.at("messages"), o);
        if (t) out["ids"] = t->encode(out["prompt"].get<std::string>());
      }
    } catch (const std::exception& e) {
      out = {{"error", e.what()}};
      rc = 1;
    }
    std::cout << out.dump(-1, ' ', false, tok::Json::error_handler_t::replace) << '\n';
  }
  std::cout.flush();
  return rc;
}

}  // namespace dil::cli
