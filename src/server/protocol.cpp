#include "server/protocol.h"

#include <cmath>
#include <limits>

#include "core/check.h"
#include "core/json_limits.h"
#include "server/request_fields.h"

namespace dil::server {
namespace {

[[noreturn]] void bad(const std::string& param, const std::string& msg) {
  throw ApiError(400, msg, param);
}

const char* type_name(const Json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  return "object";
}

const Json* field(const Json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

std::vector<std::string> read_stop(const Json& j) {
  std::vector<std::string> out;
  const Json* v = field(j, "stop");
  if (!v) return out;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    if (v->size() > 16) bad("stop", "'stop' accepts at most 16 strings");
    for (const auto& s : *v) {
      if (!s.is_string()) bad("stop", "'stop' must be a string or an array of strings");
      out.push_back(s.get<std::string>());
    }
  } else {
    bad("stop", std::string("'stop' must be a string or an array of strings, got ") + type_name(*v));
  }
  for (const auto& s : out)
    if (s.empty()) bad("stop", "stop strings must not be empty");
  return out;
}

// The sampling, stopping and streaming fields both endpoints share.
GenParams read_gen(const Json& j, int64_t vocab) {
  GenParams g;
  read_string(j, "model", &g.model);
  double d;
  int64_t i;
  if (read_number(j, "temperature", 0.0, 2.0, &d)) g.sampling.temperature = float(d);
  if (read_number(j, "top_p", 0.0, 1.0, &d)) {
    if (d <= 0.0) bad("top_p", "'top_p' must be in (0, 1]");
    g.sampling.top_p = float(d);
  }
  if (read_int(j, "top_k", -1, std::numeric_limits<int32_t>::max(), &i)) g.sampling.top_k = i < 0 ? 0 : int(i);
  if (read_number(j, "min_p", 0.0, 1.0, &d)) g.sampling.min_p = float(d);
  if (read_number(j, "presence_penalty", -2.0, 2.0, &d)) g.sampling.presence_penalty = float(d);
  if (read_number(j, "frequency_penalty", -2.0, 2.0, &d)) g.sampling.frequency_penalty = float(d);
  if (read_number(j, "repetition_penalty", 0.0, 100.0, &d)) {
    if (d <= 0.0) bad("repetition_penalty", "'repetition_penalty' must be > 0");
    g.sampling.repetition_penalty = float(d);
  }
  if (const Json* v = field(j, "seed")) {
    if (!v->is_number_integer()) bad("seed", std::string("'seed' must be an integer, got ") + type_name(*v));
    // Any 64-bit pattern is a valid seed; negative values wrap like numpy does.
    g.sampling.seed = v->is_number_unsigned() ? v->get<uint64_t>() : uint64_t(v->get<int64_t>());
  }
  if (const Json* v = field(j, "logit_bias")) {
    if (!v->is_object()) bad("logit_bias", "'logit_bias' must be an object of token id -> bias");
    for (auto it = v->begin(); it != v->end(); ++it) {
      int64_t id = -1;
      try {
        size_t pos = 0;
        id = std::stoll(it.key(), &pos);
        if (pos != it.key().size()) id = -1;
      } catch (...) {
        id = -1;
      }
      if (id < 0 || id >= vocab) bad("logit_bias", "logit_bias key '" + it.key() + "' is not a token id of this model");
      if (!it.value().is_number() || !std::isfinite(it.value().get<double>()) ||
          std::fabs(it.value().get<double>()) > 100.0)
        bad("logit_bias", "logit_bias values must be numbers in [-100, 100]");
      g.sampling.logit_bias[int32_t(id)] = it.value().get<float>();
    }
  }
  g.stop.max_tokens = -1;
  if (read_int(j, "max_tokens", 1, std::numeric_limits<int32_t>::max(), &i)) g.stop.max_tokens = int(i);
  if (read_int(j, "max_completion_tokens", 1, std::numeric_limits<int32_t>::max(), &i)) g.stop.max_tokens = int(i);
  if (read_int(j, "min_tokens", 0, std::numeric_limits<int32_t>::max(), &i)) {
    if (g.stop.max_tokens >= 0 && i > g.stop.max_tokens)
      bad("min_tokens", str_cat("'min_tokens' (", i, ") must not exceed 'max_tokens' (", g.stop.max_tokens, ")"));
    g.stop.min_tokens = int(i);
  }
  if (read_int(j, "n", 1, 128, &i)) g.n = int(i);
  // best_of == n is what the server does; more candidates than returned would need ranking
  // (vLLM's V1 engine dropped it too).
  if (read_int(j, "best_of", 1, 128, &i) && i != g.n)
    throw ApiError(400, str_cat("'best_of' (", i, ") must equal 'n' (", g.n, "): ranking more candidates than are "
                               "returned is not implemented"),
                   "best_of", "unsupported_parameter");
  if (const Json* v = field(j, "allowed_token_ids")) {
    g.sampling.allowed_token_ids = read_token_ids(*v, "allowed_token_ids", vocab);
    if (g.sampling.allowed_token_ids.empty()) bad("allowed_token_ids", "'allowed_token_ids' must not be empty");
  }
  if (read_int(j, "truncate_prompt_tokens", -1, std::numeric_limits<int32_t>::max(), &i)) {
    if (i == 0) bad("truncate_prompt_tokens", "'truncate_prompt_tokens' must be -1 (the context length) or >= 1");
    g.truncate_prompt_tokens = int(i);
  }
  read_bool(j, "include_stop_str_in_output", &g.include_stop_str);
  bool b;
  // Byte-level BPE decodes tokens by concatenation: no spaces to put between special tokens
  // (HF's fast tokenizers ignore the flag the same way), so either value gives the same text.
  read_bool(j, "spaces_between_special_tokens", &b);
  if (read_bool(j, "add_special_tokens", &b)) g.add_special_tokens = b;
  if (read_string(j, "request_id", &g.request_id) && g.request_id.size() > 256)
    bad("request_id", "'request_id' must be at most 256 characters");
  read_bool(j, "ignore_eos", &g.stop.ignore_eos);
  if (const Json* v = field(j, "stop_token_ids")) g.stop.stop_token_ids = read_token_ids(*v, "stop_token_ids", vocab);
  g.stop_strings = read_stop(j);
  read_bool(j, "stream", &g.stream);
  if (const Json* v = field(j, "stream_options")) {
    if (!v->is_object()) bad("stream_options", "'stream_options' must be an object");
    read_bool(*v, "include_usage", &g.include_usage);
  }
  read_bool(j, "skip_special_tokens", &g.skip_special_tokens);
  return g;
}

std::string content_text(const Json& content, const std::string& param) {
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad(param, "message content must be a string, null or an array of content parts");
  std::string out;
  for (const auto& part : content) {
    if (!part.is_object()) bad(param, "content parts must be objects");
    std::string type;
    read_string(part, "type", &type);
    if (type == "text") {
      std::string t;
      if (!read_string(part, "text", &t)) bad(param, "a text content part needs a 'text' string");
      out += t;
    } else if (type == "image_url" || type == "input_audio" || type == "file" || type == "image") {
      bad(param, "content part type '" + type + "' is not supported by this model (text only)");
    } else {
      bad(param, "unknown content part type '" + type + "'");
    }
  }
  return out;
}

void read_thinking_value(const Json& v, const std::string& param, bool* thinking) {
  if (v.is_boolean()) {
    *thinking = v.get<bool>();
  } else if (v.is_object()) {  // DeepSeek API: {"type": "enabled" | "disabled"}
    std::string t;
    read_string(v, "type", &t);
    if (t == "enabled") *thinking = true;
    else if (t == "disabled") *thinking = false;
    else bad(param, "'" + param + ".type' must be \"enabled\" or \"disabled\"");
  } else if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "thinking" || s == "enabled") *thinking = true;
    else if (s == "chat" || s == "disabled") *thinking = false;
    else bad(param, "'" + param + "' must be true/false, \"enabled\"/\"disabled\" or \"thinking\"/\"chat\"");
  } else if (!v.is_null()) {
    bad(param, std::string("'") + param + "' has the wrong type (" + type_name(v) + ")");
  }
}

// The values the model's encoder takes (chat.cpp effort_prefix): V4 low/medium/high/max;
// V4.1 low/high/max or an integer budget 1..100.
void check_effort(const Json& v, const std::string& param, tok::PromptFormat f) {
  if (v.is_null()) return;
  const std::string s = v.is_string() ? v.get<std::string>() : "";
  if (f == tok::PromptFormat::V4) {
    if (s == "low" || s == "medium" || s == "high" || s == "max") return;
    bad(param, "'" + param + "' must be one of \"low\", \"medium\", \"high\", \"max\" for DeepSeek-V4, got " +
                   v.dump());
  }
  if (s == "low" || s == "high" || s == "max") return;
  if (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() >= 1 && v.get<int64_t>() <= 100) return;
  if (v.is_number_unsigned() && v.get<uint64_t>() >= 1 && v.get<uint64_t>() <= 100) return;
  bad(param, "'" + param + "' must be \"low\", \"high\", \"max\" or an integer in [1, 100] for DeepSeek-V4.1, got " +
                 v.dump());
}

}  // namespace

Json error_body(const ApiError& e) {
  Json err = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return Json{{"error", err}};
}

Json parse_body(const std::string& body) {
  // Before any DOM exists: what consumes a parsed document recurses per level.
  if (json_too_deep(body))
    throw ApiError(400, str_cat("request body nests arrays/objects deeper than ", kMaxJsonDepth, " levels"), "",
                   "json_too_deep");
  Json j;
  try {
    j = Json::parse(body);
  } catch (const Json::exception& e) {
    // nlohmann also rejects invalid UTF-8 inside strings here.
    throw ApiError(400, std::string("request body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw ApiError(400, "request body must be a JSON object");
  return j;
}

bool read_int(const Json& j, const char* key, int64_t lo, int64_t hi, int64_t* out) {
  const Json* v = field(j, key);
  if (!v) return false;
  if (!v->is_number_integer())
    bad(key, std::string("'") + key + "' must be an integer, got " + type_name(*v));
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    bad(key, std::string("'") + key + "' is out of range");
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi)
    bad(key, str_cat("'", key, "' must be in [", lo, ", ", hi, "], got ", x));
  *out = x;
  return true;
}

bool read_number(const Json& j, const char* key, double lo, double hi, double* out) {
  const Json* v = field(j, key);
  if (!v) return false;
  if (!v->is_number()) bad(key, std::string("'") + key + "' must be a number, got " + type_name(*v));
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    bad(key, str_cat("'", key, "' must be in [", lo, ", ", hi, "]"));
  *out = x;
  return true;
}

bool read_bool(const Json& j, const char* key, bool* out) {
  const Json* v = field(j, key);
  if (!v) return false;
  if (!v->is_boolean()) bad(key, std::string("'") + key + "' must be a boolean, got " + type_name(*v));
  *out = v->get<bool>();
  return true;
}

bool read_string(const Json& j, const char* key, std::string* out) {
  const Json* v = field(j, key);
  if (!v) return false;
  if (!v->is_string()) bad(key, std::string("'") + key + "' must be a string, got " + type_name(*v));
  *out = v->get<std::string>();
  return true;
}

std::vector<int32_t> read_token_ids(const Json& v, const std::string& param, int64_t vocab) {
  if (!v.is_array()) bad(param, "'" + param + "' must be an array of token ids");
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (const auto& x : v) {
    if (!x.is_number_integer() || (x.is_number_unsigned() && x.get<uint64_t>() >= uint64_t(vocab)) ||
        x.get<int64_t>() < 0 || x.get<int64_t>() >= vocab)
      bad(param, str_cat("'", param, "' must hold integer token ids in [0, ", vocab, ")"));
    ids.push_back(int32_t(x.get<int64_t>()));
  }
  return ids;
}

Json normalize_messages(const Json& messages) {
  if (!messages.is_array() || messages.empty())
    bad("messages", "'messages' must be a non-empty array");
  Json out = Json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    const std::string p = str_cat("messages[", i, "]");
    if (!m.is_object()) bad(p, p + " must be an object");
    std::string role;
    if (!read_string(m, "role", &role)) bad(p + ".role", p + " needs a 'role'");
    static constexpr const char* kRoles[] = {"system", "developer", "user", "assistant", "tool",
                                             "latest_reminder"};
    bool known = false;
    for (const char* r : kRoles) known |= role == r;
    if (!known) bad(p + ".role", "unknown role '" + role + "'");
    Json n = m;
    // Content parts go to the encoder as sent (the official encoders join them their own
    // way); here they are only checked to be text.
    if (m.contains("content")) {
      (void)content_text(m["content"], p + ".content");
      if (m["content"].is_null()) n["content"] = "";  // assistant turns with only tool calls
    }
    else if (role != "assistant") bad(p + ".content", p + " needs 'content'");
    else n["content"] = "";
    // Peers name the field `reasoning`; the encoder reads `reasoning_content`.
    if (m.contains("reasoning") && !m.contains("reasoning_content")) {
      n["reasoning_content"] = m["reasoning"];
      n.erase("reasoning");
    }
    if (n.contains("reasoning_content") && !n["reasoning_content"].is_null() &&
        !n["reasoning_content"].is_string())
      bad(p + ".reasoning_content", "'reasoning_content' must be a string");
    if (auto it = m.find("tool_calls"); it != m.end() && !it->is_null()) {
      if (role != "assistant") bad(p + ".tool_calls", "only assistant messages carry tool_calls");
      if (!it->is_array()) bad(p + ".tool_calls", "'tool_calls' must be an array");
      for (size_t k = 0; k < it->size(); ++k) {
        const Json& tc = (*it)[k];
        const std::string q = str_cat(p, ".tool_calls[", k, "]");
        if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object())
          bad(q, q + " must be an object with a 'function' object");
        std::string name;
        if (!read_string(tc["function"], "name", &name) || name.empty())
          bad(q + ".function.name", q + " needs a function name");
        const Json& args = tc["function"].contains("arguments") ? tc["function"]["arguments"] : Json();
        if (args.is_object()) n["tool_calls"][k]["function"]["arguments"] = args.dump();
        else if (!args.is_string()) bad(q + ".function.arguments", "'arguments' must be a JSON string");
        else if (json_too_deep(args.get<std::string>()))  // the encoder parses it
          throw ApiError(400, str_cat("'arguments' nests arrays/objects deeper than ", kMaxJsonDepth, " levels"),
                         q + ".function.arguments", "json_too_deep");
        // Not-JSON argument text is rendered raw, as the official encoder does.
      }
    } else if (n.contains("tool_calls")) {
      n.erase("tool_calls");
    }
    if (role == "tool") {
      if (auto it = m.find("tool_call_id"); it != m.end() && !it->is_null() && !it->is_string())
        bad(p + ".tool_call_id", "'tool_call_id' must be a string");
    }
    out.push_back(std::move(n));
  }
  return out;
}

void parse_chat_options(const Json& j, const ServerDefaults& d, tok::ChatOptions* o) {
  bool thinking = d.thinking;
  Json effort;
  if (const Json* v = field(j, "thinking")) read_thinking_value(*v, "thinking", &thinking);
  if (const Json* v = field(j, "reasoning_effort")) {
    check_effort(*v, "reasoning_effort", d.format);
    effort = *v;
  }
  if (const Json* kw = field(j, "chat_template_kwargs")) {
    if (!kw->is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    for (const char* k : {"thinking", "enable_thinking", "thinking_mode"})
      if (const Json* v = field(*kw, k)) read_thinking_value(*v, std::string("chat_template_kwargs.") + k, &thinking);
    if (const Json* v = field(*kw, "reasoning_effort")) {
      check_effort(*v, "chat_template_kwargs.reasoning_effort", d.format);
      effort = *v;
    }
  }
  o->thinking_mode = thinking ? "thinking" : "chat";
  o->reasoning_effort = effort;
  if (const Json* v = field(j, "response_format")) {
    if (!v->is_object()) bad("response_format", "'response_format' must be an object");
    std::string type;
    read_string(*v, "type", &type);
    // The official encoders write the format into the system prompt; generation also enforces
    // it (parse_output_format, structured.h).
    if (type != "text") o->response_format = *v;
  }
  if (const Json* v = field(j, "tools")) {
    if (!v->is_array()) bad("tools", "'tools' must be an array");
    for (size_t i = 0; i < v->size(); ++i) {
      const Json& t = (*v)[i];
      const std::string p = str_cat("tools[", i, "]");
      std::string type = "function", name;
      if (!t.is_object()) bad(p, p + " must be an object");
      read_string(t, "type", &type);
      if (type != "function") bad(p + ".type", "only 'function' tools are supported");
      if (!t.contains("function") || !t["function"].is_object() ||
          !read_string(t["function"], "name", &name) || name.empty())
        bad(p + ".function", p + " needs a 'function' with a 'name'");
      if (auto it = t["function"].find("parameters"); it != t["function"].end() && !it->is_null() && !it->is_object())
        bad(p + ".function.parameters", "'parameters' must be a JSON schema object");
    }
    if (!v->empty()) o->tools = *v;
  }
  read_bool(j, "add_generation_prompt", &o->add_generation_prompt);
}

ChatRequest parse_chat_request(const Json& j, const ServerDefaults& d, int64_t vocab) {
  refuse_unsupported_fields(j, Endpoint::Chat);
  ChatRequest r;
  r.gen = read_gen(j, vocab);
  if (!j.contains("messages")) bad("messages", "'messages' is required");
  r.messages = normalize_messages(j["messages"]);
  parse_chat_options(j, d, &r.chat);
  r.format = parse_output_format(j);
  read_bool(j, "parallel_tool_calls", &r.parallel_tool_calls);
  if (const Json* v = field(j, "tool_choice")) {
    if (v->is_string()) {
      r.tool_choice = v->get<std::string>();
      if (r.tool_choice != "none" && r.tool_choice != "auto" && r.tool_choice != "required")
        bad("tool_choice", "'tool_choice' must be none, auto, required or a named function");
    } else if (v->is_object() && v->contains("function") && (*v)["function"].is_object() &&
               read_string((*v)["function"], "name", &r.tool_choice_name)) {
      r.tool_choice = "function";
    } else {
      bad("tool_choice", "'tool_choice' must be none, auto, required or {\"type\":\"function\",\"function\":{\"name\":...}}");
    }
  }
  if (r.tool_choice != "none" && r.tool_choice != "auto" && r.chat.tools.is_null())
    bad("tool_choice", "'tool_choice' " + r.tool_choice + " needs 'tools'");
  if (r.tool_choice == "function") {
    // Only the named tool is offered to the model (the grammar forces a call of it).
    auto only = decltype(r.chat.tools)::array();
    for (const auto& t : r.chat.tools)
      if (t["function"]["name"] == r.tool_choice_name) only.push_back(t);
    if (only.empty()) bad("tool_choice", "tool_choice names '" + r.tool_choice_name + "', which is not in 'tools'");
    r.chat.tools = only;
  }
  // Only a grammar can hold the model to one call: tool_choice required (and a named function,
  // one call by definition), or auto next to a response format (structured.cpp). Plain auto
  // lets the model write as many calls as it likes, so false cannot be enforced there.
  const bool offered = !r.chat.tools.is_null() && !r.chat.tools.empty() && r.tool_choice != "none";
  const bool constrained = r.tool_choice == "required" || r.tool_choice == "function" ||
                           r.format.kind != OutputFormat::Kind::Text;
  if (!r.parallel_tool_calls && offered && !constrained)
    throw ApiError(400,
                   "'parallel_tool_calls' false is only enforced when the tool call is constrained: send "
                   "tool_choice \"required\" or a named function, or a response format",
                   "parallel_tool_calls", "unsupported_parameter");
  if (r.tool_choice == "none") {
    r.tools_withheld = !r.chat.tools.is_null();
    r.chat.tools = Json();  // nothing to call: do not offer tools
  }
  read_bool(j, "logprobs", &r.logprobs);
  int64_t top = -1;
  read_int(j, "top_logprobs", 0, 20, &top);
  if (top >= 0 && !r.logprobs) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  r.gen.sampling.logprobs = r.logprobs ? int(std::max<int64_t>(top, 0)) : -1;
  return r;
}

CompletionRequest parse_completion_request(const Json& j, int64_t vocab) {
  refuse_unsupported_fields(j, Endpoint::Completion);
  CompletionRequest r;
  r.gen = read_gen(j, vocab);
  const Json* p = field(j, "prompt");
  if (!p) bad("prompt", "'prompt' is required");
  auto one = [&](const Json& v, const std::string& param) {
    CompletionPrompt cp;
    if (v.is_string()) {
      cp.text = v.get<std::string>();
    } else {
      cp.is_text = false;
      cp.ids = read_token_ids(v, param, vocab);
    }
    if (cp.is_text ? cp.text.empty() : cp.ids.empty()) bad(param, "the prompt must not be empty");
    r.prompts.push_back(std::move(cp));
  };
  if (p->is_string()) {
    one(*p, "prompt");
  } else if (p->is_array() && !p->empty() && (*p)[0].is_number()) {
    one(*p, "prompt");
  } else if (p->is_array() && !p->empty()) {
    if (p->size() > 64) bad("prompt", "at most 64 prompts per request");
    for (size_t i = 0; i < p->size(); ++i) {
      const Json& v = (*p)[i];
      if (!v.is_string() && !v.is_array()) bad("prompt", "'prompt' must be a string, an array of strings, token ids or arrays of token ids");
      one(v, str_cat("prompt[", i, "]"));
    }
  } else {
    bad("prompt", "'prompt' must be a non-empty string, an array of strings, token ids or arrays of token ids");
  }
  read_bool(j, "echo", &r.echo);
  r.format = parse_output_format(j);
  int64_t lp = -1;
  read_int(j, "logprobs", 0, 20, &lp);
  r.gen.sampling.logprobs = int(lp);
  if (r.echo && lp >= 0) bad("echo", "'echo' together with 'logprobs' (prompt logprobs) is not supported");
  if (const Json* s = field(j, "suffix"); s && !(s->is_string() && s->get<std::string>().empty()))
    bad("suffix", "'suffix' is not supported");
  return r;
}

}  // namespace dil::server
