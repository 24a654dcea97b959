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

#include "cli/commands.h"
#include "core/check.h"
#include "tokenizer/tokenizer.h"

namespace dil::cli {
namespace {

struct RenderOptions {
  std::string model;      // folder: its config.json and tokenizer.json
  std::string config;     // or these separately
  std::string tokenizer;
  std::string format;     // v4 | v41; empty: from config.json
  bool parse = false;     // parse completions instead of rendering
  bool ids = false;       // also the rendered prompt's token ids
};

int run_render(const RenderOptions& o) {
  std::string config = o.config, tokenizer = o.tokenizer;
  if (!o.model.empty()) {
    if (config.empty()) config = o.model + "/config.json";
    if (tokenizer.empty()) tokenizer = o.model + "/tokenizer.json";
  }
  tok::PromptFormat fmt;
  if (!o.format.empty()) {
    fmt = o.format == "v4" ? tok::PromptFormat::V4 : tok::PromptFormat::V41;  // checked by the option
  } else {
    fmt = tok::prompt_format_from_config(config);
  }
  std::unique_ptr<tok::Tokenizer> t;
  if (o.ids) {
    if (tokenizer.empty()) DIL_FAIL("--ids needs --tokenizer or --model");
    t = tok::Tokenizer::load(tokenizer);
  }
  const bool parse = o.parse;
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

}  // namespace

void add_render(CLI::App& top, std::vector<Declared>* out) {
  auto o = std::make_shared<RenderOptions>();
  CLI::App* c = top.add_subcommand("render", "render chat messages to the model's prompt string (or --parse completions)");
  c->add_option("--model", o->model, "model folder (its config.json and tokenizer.json)");
  c->add_option("--config", o->config, "config.json choosing the prompt format")->default_str("DIR/config.json of --model");
  c->add_option("--tokenizer", o->tokenizer, "tokenizer.json for --ids")->default_str("DIR/tokenizer.json of --model");
  c->add_option("--format", o->format, "prompt format, overriding the config's")
      ->default_str("from the config")
      ->check(CLI::IsMember({"v4", "v41"}));
  add_switch(c, "--parse", o->parse, "parse {\"text\"} completions into content, reasoning and tool calls");
  add_switch(c, "--ids", o->ids, "add the rendered prompt's token ids");
  require(c, {"--model", "--config", "--format"});
  out->push_back({c, [o](const ProgramArgs&) { return run_render(*o); }});
}

}  // namespace dil::cli
