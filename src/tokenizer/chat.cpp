// Prompt encoders: C++ ports of DeepSeek's official `encoding_dsv4.py` (V4) and V4.1
// `encoding/encoding.py`. Message dicts are processed as JSON in the same steps as the Python
// (image blocks -> merge tool messages -> sort tool results -> drop old reasoning -> render),
// so every branch maps to a line of the original. Test vectors: tests/data/tokenizer/.
#include <algorithm>
#include <map>

#include "core/check.h"
#include "core/json_limits.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/pyjson.h"
#include "tokenizer/tokenizer.h"

namespace dil::tok {
namespace {

const char* const kEffortMaxV4 =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the "
    "root cause, rigorously stress-testing your logic against all potential paths, edge cases, and "
    "adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

const char* const kResponseFormat =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

const std::map<std::string, std::string>& task_tokens() {
  static const std::map<std::string, std::string> k = {
      {"action", "<｜action｜>"}, {"query", "<｜query｜>"}, {"authority", "<｜authority｜>"},
      {"domain", "<｜domain｜>"}, {"title", "<｜title｜>"}, {"read_url", "<｜read_url｜>"}};
  return k;
}

// json.loads for argument strings. Documents nested deeper than kMaxJsonDepth count as
// unparsable (Python's json.loads raises RecursionError on them too, which the official
// encoders treat like any other failure) so that no deep DOM is ever built from client text.
bool try_parse(const std::string& text, Json* out) {
  if (json_too_deep(text)) return false;
  try {
    *out = Json::parse(text);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

std::string get_str(const Json& m, const char* key) {
  auto it = m.find(key);
  if (it == m.end()) return "";
  return py_str(*it, key);
}
// Python `x or ""` for a str-valued field.
std::string or_empty(const Json& m, const char* key) {
  auto it = m.find(key);
  if (it == m.end() || !py_truthy(*it)) return "";
  return py_str(*it, key);
}
std::string role_of(const Json& m) {
  auto it = m.find("role");
  return it != m.end() && it->is_string() ? it->get<std::string>() : "";
}
bool has_task(const Json& m) {
  auto it = m.find("task");
  return it != m.end() && !it->is_null();
}

std::string tools_block(PromptFormat f, const Json& tools) {
  const DsmlNames n = dsml_names(f);
  const std::string d = kDsml;
  std::string schemas;
  bool first = true;
  for (const auto& t : tools) {
    if (!t.is_object() || !t.contains("function")) DIL_FAIL("tools: each tool must be {\"type\": \"function\", \"function\": {...}}");
    if (!first) schemas += "\n";
    first = false;
    schemas += py_json_dumps(t["function"]);
  }
  std::string s = "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke "
                  "tools by writing a \"<" + d + n.block + ">\" block like the following:\n\n";
  s += "<" + d + n.block + ">\n";
  s += "<" + d + n.invoke + " name=\"$TOOL_NAME\">\n";
  s += "<" + d + n.parameter + " name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" + d + n.parameter + ">\n";
  s += "...\n</" + d + n.invoke + ">\n";
  s += "<" + d + n.invoke + " name=\"$TOOL_NAME2\">\n...\n</" + d + n.invoke + ">\n";
  s += "</" + d + n.block + ">\n\n";
  s += "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
       "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n";
  s += "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
       "<think>...</think> BEFORE any tool calls or final response.\n\n";
  s += "Otherwise, output directly after </think> with tool calls or final response.\n\n";
  s += "### Available Tool Schemas\n\n" + schemas + "\n\n";
  s += "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";
  return s;
}

// encode_arguments_to_dsml: arguments (a JSON string, or for V4.1 also an object) -> lines.
std::string dsml_arguments(PromptFormat f, const Json& raw) {
  Json args;
  if (f == PromptFormat::V4) {
    // json.loads(arguments); any failure (bad JSON, not a string) -> {"arguments": raw}.
    const bool ok = raw.is_string() && try_parse(raw.get<std::string>(), &args);
    if (!ok) args = Json{{"arguments", raw}};
    if (!args.is_object()) DIL_FAIL("tool call arguments must be a JSON object, got ", raw.dump());
  } else {
    // Tolerates JSON strings, double-encoded ones included; otherwise {"arguments": raw}.
    args = raw;
    if (!args.is_object()) {
      for (int k = 0; k < 2 && args.is_string(); ++k) {
        Json next;
        if (!try_parse(args.get<std::string>(), &next)) break;
        args = std::move(next);
      }
      if (!args.is_object()) args = Json{{"arguments", raw}};
    }
  }
  const DsmlNames n = dsml_names(f);
  std::string out;
  bool first = true;
  for (auto it = args.begin(); it != args.end(); ++it) {
    if (!first) out += "\n";
    first = false;
    bool is_str = it.value().is_string();
    out += "<" + std::string(kDsml) + n.parameter + " name=\"" + it.key() + "\" string=\"" + (is_str ? "true" : "false") +
           "\">" + (is_str ? it.value().get<std::string>() : py_json_dumps(it.value())) + "</" + kDsml + n.parameter + ">";
  }
  return out;
}

int last_user_index(PromptFormat f, const Json& msgs) {
  for (int i = static_cast<int>(msgs.size()) - 1; i >= 0; --i) {
    std::string r = role_of(msgs[i]);
    if (f == PromptFormat::V4 ? (r == "user" || r == "developer") : (r == "user" || (r == "system" && i > 0))) return i;
  }
  return -1;
}

// V4.1 render_reasoning_effort (validated for every message, like the Python); V4 accepts
// None/"high"/"max" like the official assert, plus "low"/"medium" which map to "high" (the
// official prompt has only the max preamble; vLLM normalises low/medium the same way).
std::string effort_prefix(PromptFormat f, int index, bool thinking, const Json& effort) {
  if (f == PromptFormat::V4) {
    std::string e = effort.is_null() ? "" : effort.is_string() ? effort.get<std::string>() : "?";
    if (!(e.empty() || e == "high" || e == "max" || e == "low" || e == "medium"))
      DIL_FAIL("invalid reasoning_effort ", effort.dump(), " for DeepSeek-V4: expected low, medium, high or max");
    return index == 0 && thinking && e == "max" ? kEffortMaxV4 : "";
  }
  int budget = 75;  // default "high"
  if (effort.is_number_integer() || effort.is_number_unsigned()) {
    int64_t v = effort.get<int64_t>();
    if (v < 1 || v > 100) DIL_FAIL("invalid reasoning_effort ", v, " for DeepSeek-V4.1: should be an int within [1,100] or low/high/max");
    budget = static_cast<int>(v);
  } else if (effort.is_string()) {
    std::string e = effort.get<std::string>();
    if (e == "low") budget = 50;
    else if (e == "high") budget = 75;
    else if (e == "max") budget = 100;
    else DIL_FAIL("invalid reasoning_effort '", e, "' for DeepSeek-V4.1: should be an int within [1,100] or low/high/max");
  } else if (!effort.is_null()) {
    DIL_FAIL("invalid reasoning_effort ", effort.dump(), " for DeepSeek-V4.1");
  }
  if (index == 0 && thinking)
    return "Reasoning Effort: " + std::to_string(budget) +
           " (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
  return "";
}

// OpenAI content parts -> text (V4 has no image input).
Json flatten_v4_content(const Json& m) {
  Json msg = m;
  auto it = msg.find("content");
  if (it != msg.end() && it->is_array()) {
    std::string text;
    bool first = true;
    for (const auto& b : *it) {
      std::string type = b.is_object() ? b.value("type", "") : "";
      if (type != "text") DIL_FAIL("DeepSeek-V4 accepts only text content parts, got '", type, "'");
      if (!first) text += "\n\n";
      first = false;
      text += b.value("text", "");
    }
    *it = text;
  }
  return msg;
}

// V4.1 process_image_messages: content lists become content_blocks with image blocks replaced by
// the image placeholder; `content` becomes the texts joined by blank lines.
Json process_image_block_list(const Json& blocks) {
  Json out = Json::array();
  for (const auto& b : blocks) {
    if (!b.is_object()) {
      out.push_back(b);
      continue;
    }
    std::string type = b.value("type", "");
    if (type == "image" || type == "image_url") {
      bool has_src = false;
      if (type == "image_url") {
        const Json& u = b.contains("image_url") ? b["image_url"] : Json();
        has_src = u.is_string() ? !u.get<std::string>().empty() : (u.is_object() && py_truthy(u.value("url", Json(""))));
      } else {
        for (const char* k : {"source", "url", "data"})
          if (b.contains(k) && py_truthy(b[k])) has_src = true;
      }
      if (!has_src) DIL_FAIL("Image block does not contain a valid source");
      out.push_back(Json{{"type", "text"}, {"text", kImage}});
    } else if (type == "tool_result" && b.contains("content") && b["content"].is_array()) {
      Json c = b;
      c["content"] = process_image_block_list(b["content"]);
      out.push_back(c);
    } else if (type == "text") {
      const Json& t = b.contains("text") ? b["text"] : Json();
      if (t.is_string() && t.get<std::string>().find(kImage) != std::string::npos)
        DIL_FAIL("Text block contains image placeholder '", kImage, "'. Images should be separate content blocks.");
      out.push_back(b);
    } else {
      out.push_back(b);
    }
  }
  return out;
}

Json process_images_v41(const Json& m) {
  Json msg = m;
  for (const char* k : {"content", "reasoning_content"}) {
    if (msg.contains(k) && msg[k].is_string() && msg[k].get<std::string>().find(kImage) != std::string::npos)
      DIL_FAIL("Message ", k, " contains image special token '", kImage, "'. Images should be provided as image content blocks.");
  }
  if (msg.contains("content") && msg["content"].is_array() && !msg.contains("content_blocks")) {
    msg["content_blocks"] = msg["content"];
    msg.erase("content");
  }
  if (msg.contains("content_blocks") && py_truthy(msg["content_blocks"])) {
    msg["content_blocks"] = process_image_block_list(msg["content_blocks"]);
    if (!(msg.contains("content") && msg["content"].is_string())) {
      std::string text;
      bool first = true;
      for (const auto& b : msg["content_blocks"]) {
        if (!(b.is_object() && b.value("type", "") == "text")) continue;
        if (!first) text += "\n\n";
        first = false;
        text += py_str(b.value("text", Json("")), "text");
      }
      msg["content"] = text;
    }
  }
  return msg;
}

Json merge_tool_messages(PromptFormat f, const Json& messages) {
  Json merged = Json::array();
  for (const auto& msg : messages) {
    std::string role = role_of(msg);
    auto last_is_mergeable_user = [&](bool need_no_task) {
      if (merged.empty()) return false;
      const Json& l = merged.back();
      return role_of(l) == "user" && l.contains("content_blocks") && !(need_no_task && has_task(l));
    };
    if (role == "tool") {
      Json block = {{"type", "tool_result"},
                    {"tool_use_id", msg.contains("tool_call_id") ? msg["tool_call_id"] : Json("")},
                    {"content", msg.contains("content") ? msg["content"] : Json("")}};
      if (last_is_mergeable_user(false)) merged.back()["content_blocks"].push_back(block);
      else merged.push_back(Json{{"role", "user"}, {"content_blocks", Json::array({block})}});
    } else if (role == "user") {
      if (f == PromptFormat::V4) {
        Json content = msg.contains("content") ? msg["content"] : Json("");
        Json text_block = {{"type", "text"}, {"text", content}};
        if (last_is_mergeable_user(true)) {
          merged.back()["content_blocks"].push_back(text_block);
        } else {
          Json nm = {{"role", "user"}, {"content", content}, {"content_blocks", Json::array({text_block})}};
          for (const char* k : {"task", "wo_eos", "mask"})
            if (msg.contains(k)) nm[k] = msg[k];
          merged.push_back(nm);
        }
      } else {
        Json blocks = msg.contains("content_blocks") && !msg["content_blocks"].is_null()
                          ? msg["content_blocks"]
                          : Json::array({Json{{"type", "text"}, {"text", msg.contains("content") ? msg["content"] : Json("")}}});
        if (last_is_mergeable_user(true)) {
          for (const auto& b : blocks) merged.back()["content_blocks"].push_back(b);
        } else {
          Json nm = msg;
          nm["content_blocks"] = blocks;
          merged.push_back(nm);
        }
      }
    } else {
      merged.push_back(msg);
    }
  }
  return merged;
}

void sort_tool_results(Json& messages) {
  std::map<std::string, int> order;
  for (auto& msg : messages) {
    std::string role = role_of(msg);
    if (role == "assistant" && msg.contains("tool_calls") && py_truthy(msg["tool_calls"])) {
      order.clear();
      int idx = 0;
      for (const auto& tc : msg["tool_calls"]) {
        std::string id;
        if (tc.contains("id") && py_truthy(tc["id"])) id = py_str(tc["id"], "tool call id");
        else if (tc.contains("function") && tc["function"].is_object() && tc["function"].contains("id"))
          id = py_str(tc["function"]["id"], "tool call id");
        if (!id.empty()) order[id] = idx;
        ++idx;
      }
    } else if (role == "user" && msg.contains("content_blocks") && py_truthy(msg["content_blocks"])) {
      Json& blocks = msg["content_blocks"];
      std::vector<Json> tool_blocks;
      for (const auto& b : blocks)
        if (b.is_object() && b.value("type", "") == "tool_result") tool_blocks.push_back(b);
      if (tool_blocks.size() > 1 && !order.empty()) {
        auto key = [&](const Json& b) {
          std::string id = b.contains("tool_use_id") && b["tool_use_id"].is_string() ? b["tool_use_id"].get<std::string>() : "";
          auto it = order.find(id);
          return it == order.end() ? 0 : it->second;
        };
        std::stable_sort(tool_blocks.begin(), tool_blocks.end(), [&](const Json& a, const Json& b) { return key(a) < key(b); });
        size_t k = 0;
        for (auto& b : blocks)
          if (b.is_object() && b.value("type", "") == "tool_result") b = tool_blocks[k++];
      }
    }
  }
}

Json drop_thinking_messages(PromptFormat f, const Json& messages) {
  int last = last_user_index(f, messages);
  Json out = Json::array();
  for (int i = 0; i < static_cast<int>(messages.size()); ++i) {
    const Json& m = messages[i];
    std::string r = role_of(m);
    if (r == "user" || r == "system" || r == "tool" || r == "latest_reminder" || r == "direct_search_results" || i >= last) {
      out.push_back(m);
    } else if (r == "assistant") {
      Json c = m;
      c.erase("reasoning_content");
      out.push_back(c);
    }
  }
  return out;
}

std::string render_user_blocks(const Json& blocks) {
  std::string out;
  bool first = true;
  for (const auto& b : blocks) {
    if (!first) out += "\n\n";
    first = false;
    std::string type = b.is_object() ? py_str(b.value("type", Json()), "content block type") : "None";
    if (type == "text") {
      const Json t = b.value("text", Json(""));
      if (t.is_null()) DIL_FAIL("user message content must be a string");
      out += py_str(t, "text");
    } else if (type == "tool_result") {
      Json c = b.value("content", Json(""));
      std::string content;
      if (c.is_array()) {
        bool f2 = true;
        for (const auto& x : c) {
          if (!f2) content += "\n\n";
          f2 = false;
          std::string t = x.is_object() ? py_str(x.value("type", Json()), "type") : "None";
          content += t == "text" ? py_str(x.value("text", Json("")), "text") : "[Unsupported " + t + "]";
        }
      } else {
        content = py_str(c, "tool result content");
      }
      out += "<tool_result>" + content + "</tool_result>";
    } else {
      out += "[Unsupported " + type + "]";
    }
  }
  return out;
}

std::string render_message(PromptFormat f, int index, const Json& msgs, bool thinking, bool drop_thinking,
                           const Json& effort, bool add_generation_prompt) {
  const Json& msg = msgs[index];
  const int last_user = last_user_index(f, msgs);
  const std::string role = role_of(msg);
  const bool has_tools = msg.contains("tools") && py_truthy(msg["tools"]);
  const bool has_rf = msg.contains("response_format") && py_truthy(msg["response_format"]);
  std::string prompt;

  std::string effort_text = effort_prefix(f, index, thinking, effort);
  if (f == PromptFormat::V41 && index == 0 && (!effort_text.empty() || role == "system")) prompt += kSystem;
  prompt += effort_text;

  auto tools_and_format = [&](std::string& s) {
    if (has_tools) {
      if (!msg["tools"].is_array()) DIL_FAIL("tools must be an array");
      s += "\n\n" + tools_block(f, msg["tools"]);
    }
    if (has_rf) s += "\n\n" + std::string(kResponseFormat) + py_json_dumps(msg["response_format"]);
  };

  if (role == "system") {
    if (f == PromptFormat::V41 && index > 0) prompt += kSystem;
    prompt += or_empty(msg, "content");
    tools_and_format(prompt);
  } else if (role == "developer" && f == PromptFormat::V4) {
    if (!msg.contains("content") || !py_truthy(msg["content"])) DIL_FAIL("Invalid message for role `developer`: empty content");
    std::string s = std::string(kUser) + py_str(msg["content"], "content");
    tools_and_format(s);
    prompt += s;
  } else if (role == "user") {
    prompt += kUser;
    if (msg.contains("content_blocks") && py_truthy(msg["content_blocks"])) prompt += render_user_blocks(msg["content_blocks"]);
    else prompt += or_empty(msg, "content");
  } else if (role == "latest_reminder") {
    prompt += std::string(kLatestReminder) + get_str(msg, "content");
    if (!msg.contains("content")) prompt += "None";
  } else if (role == "tool") {
    DIL_FAIL("tool messages must follow an assistant message");  // merged above; unreachable
  } else if (role == "assistant") {
    std::string tc_content;
    if (msg.contains("tool_calls") && py_truthy(msg["tool_calls"])) {
      const DsmlNames n = dsml_names(f);
      std::string list;
      bool first = true;
      for (const auto& tc : msg["tool_calls"]) {
        if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object())
          DIL_FAIL("assistant tool_calls entries must be {\"type\": \"function\", \"function\": {...}}");
        const Json& fn = tc["function"];
        if (!fn.contains("name") || !fn.contains("arguments")) DIL_FAIL("tool call function needs name and arguments");
        if (!first) list += "\n";
        first = false;
        list += "<" + std::string(kDsml) + n.invoke + " name=\"" + py_str(fn["name"], "tool call name") + "\">\n" +
                dsml_arguments(f, fn["arguments"]) + "\n</" + kDsml + n.invoke + ">";
      }
      tc_content = "\n\n<" + std::string(kDsml) + n.block + ">\n" + list + "\n</" + kDsml + n.block + ">";
    }
    std::string thinking_part;
    bool prev_has_task = index >= 1 && has_task(msgs[index - 1]);
    if (thinking && !prev_has_task && (!drop_thinking || index > last_user))
      thinking_part = or_empty(msg, "reasoning_content") + kThinkEnd;
    prompt += thinking_part + or_empty(msg, "content") + tc_content;
    if (!(msg.contains("wo_eos") && py_truthy(msg["wo_eos"]))) prompt += kEos;
  } else {
    DIL_FAIL("unknown message role '", role, "'");
  }

  // Transition to the next turn.
  if (index + 1 < static_cast<int>(msgs.size())) {
    std::string next = role_of(msgs[index + 1]);
    if (next != "assistant" && next != "latest_reminder") return prompt;
  }
  if (has_task(msg)) {
    std::string task = py_str(msg["task"], "task");
    auto it = task_tokens().find(task);
    if (it == task_tokens().end()) DIL_FAIL("Invalid task: '", task, "'");
    if (task != "action") {
      prompt += it->second;
    } else {
      prompt += kAssistant;
      prompt += thinking ? kThinkStart : kThinkEnd;
      prompt += it->second;
    }
  } else if (f == PromptFormat::V4 ? (role == "user" || role == "developer")
                                    : (role == "user" || (role == "system" && index > 0))) {
    // The generation header; add_generation_prompt=false leaves it off the final turn only.
    if (!add_generation_prompt && index + 1 == static_cast<int>(msgs.size())) return prompt;
    prompt += kAssistant;
    if (!drop_thinking && thinking) prompt += kThinkStart;
    else if (drop_thinking && thinking && index >= last_user) prompt += kThinkStart;
    else prompt += kThinkEnd;
  }
  return prompt;
}

}  // namespace

std::string render_chat(PromptFormat f, const Json& messages_in, const ChatOptions& o) {
  if (!messages_in.is_array()) DIL_FAIL("messages must be an array");
  if (o.thinking_mode != "chat" && o.thinking_mode != "thinking")
    DIL_FAIL("Invalid thinking_mode `", o.thinking_mode, "` (expected chat or thinking)");
  const bool thinking = o.thinking_mode == "thinking";
  Json messages = Json::array();
  for (const auto& m : messages_in) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) DIL_FAIL("each message must be an object with a string role");
    messages.push_back(f == PromptFormat::V4 ? flatten_v4_content(m) : process_images_v41(m));
  }
  // Request-level tools / response_format go on the leading system message (inserted if absent),
  // which is where the official encoders expect them.
  bool want_tools = py_truthy(o.tools), want_rf = py_truthy(o.response_format);
  if (want_tools || want_rf) {
    if (messages.empty() || role_of(messages[0]) != "system")
      messages.insert(messages.begin(), Json{{"role", "system"}, {"content", ""}});
    if (want_tools) messages[0]["tools"] = o.tools;
    if (want_rf) messages[0]["response_format"] = o.response_format;
  }
  messages = merge_tool_messages(f, messages);
  sort_tool_results(messages);

  std::string prompt = kBos;
  bool drop_thinking = true;
  for (const auto& m : messages)
    if (m.contains("tools") && py_truthy(m["tools"])) drop_thinking = false;
  if (thinking && drop_thinking) messages = drop_thinking_messages(f, messages);
  for (int i = 0; i < static_cast<int>(messages.size()); ++i)
    prompt += render_message(f, i, messages, thinking, drop_thinking, o.reasoning_effort, o.add_generation_prompt);
  return prompt;
}

}  // namespace dil::tok
