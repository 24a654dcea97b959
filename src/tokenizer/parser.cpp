// Completion parser: the official `parse_message_from_completion_text` (strict, whole text) and
// an incremental version for streaming that holds back anything that may still turn into markup.
#include <algorithm>

#include "core/check.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/pyjson.h"
#include "tokenizer/tokenizer.h"

namespace dil::tok {
namespace {

// _read_until_stop: (new index, text before the earliest stop, which stop or -1).
struct Read {
  size_t index;
  std::string_view content;
  int stop;
};
Read read_until(std::string_view text, size_t index, const std::vector<std::string>& stops) {
  size_t best = text.size();
  int which = -1;
  for (size_t k = 0; k < stops.size(); ++k) {
    size_t p = text.find(stops[k], index);
    if (p != std::string_view::npos && p < best) {
      best = p;
      which = static_cast<int>(k);
    }
  }
  if (which < 0) return {text.size(), text.substr(std::min(index, text.size())), -1};
  return {best + stops[which].size(), text.substr(index, best - index), which};
}

bool py_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }

// re.findall(r'^\s*name="(.*?)">\n$', s, DOTALL): `$` also matches before a final "\n".
bool match_tool_name(std::string_view s, std::string* name) {
  size_t i = 0;
  while (i < s.size() && py_space(static_cast<unsigned char>(s[i]))) ++i;
  // \s* is greedy but may give back characters; `name="` starts with 'n', never a space.
  if (s.compare(i, 6, "name=\"") != 0) return false;
  size_t b = i + 6;
  for (size_t end : {s.size(), s.size() - 1}) {  // ">\n" at the end, or before a final "\n"
    if (end == s.size() - 1 && (s.empty() || s.back() != '\n')) continue;
    if (end < b + 3) continue;
    if (s.compare(end - 3, 3, "\">\n") == 0) {
      *name = std::string(s.substr(b, end - 3 - b));
      return true;
    }
  }
  return false;
}

// re.findall(r'^ name="(.*?)" string="(true|false)">(.*?)<$', s, DOTALL).
bool match_param(std::string_view s, std::string* name, std::string* is_str, std::string* value) {
  if (s.compare(0, 7, " name=\"") != 0) return false;
  // The value ends at a '<' that is last, or last before a final "\n".
  size_t q;
  if (!s.empty() && s.back() == '<') q = s.size() - 1;
  else if (s.size() >= 2 && s[s.size() - 2] == '<' && s.back() == '\n') q = s.size() - 2;
  else return false;
  // Lazy name: the first `" string="true|false">` that leaves room for the value.
  for (size_t i = 7; i < s.size(); ++i) {
    for (const char* flag : {"true", "false"}) {
      std::string sep = std::string("\" string=\"") + flag + "\">";
      if (i + sep.size() <= q && s.compare(i, sep.size(), sep) == 0) {
        *name = std::string(s.substr(7, i - 7));
        *is_str = flag;
        *value = std::string(s.substr(i + sep.size(), q - i - sep.size()));
        return true;
      }
    }
  }
  return false;
}

struct Tokens {
  std::string tool_start;     // "\n\n<｜DSML｜tool_calls" (or " calls")
  std::string calls_end;      // "</｜DSML｜tool_calls>"
  std::string invoke_start;   // "<｜DSML｜invoke"
  std::string invoke_end;     // "</｜DSML｜invoke"
  std::string param_start;    // "<｜DSML｜parameter"
  std::string param_end;      // "/｜DSML｜parameter"
};
Tokens tokens_for(PromptFormat f) {
  DsmlNames n = dsml_names(f);
  std::string d = kDsml;
  return {"\n\n<" + d + n.block, "</" + d + n.block + ">", "<" + d + n.invoke, "</" + d + n.invoke,
          "<" + d + n.parameter, "/" + d + n.parameter};
}

// parse_tool_calls from `index` (just after the tool-calls start token). Throws dil::Error
// with the official messages. Returns the index after the block and whether the end token
// (rather than the end of text) stopped it.
size_t parse_tool_calls(const Tokens& t, std::string_view text, size_t index, std::vector<ToolCall>& calls,
                        int* last_stop) {
  *last_stop = -1;  // -1 None, 0 end-of-calls token, 1 other
  while (index < text.size()) {
    Read r = read_until(text, index, {t.invoke_start, t.calls_end});
    index = r.index;
    if (r.content != ">\n") DIL_FAIL("Tool call format error: expected '>\\n' but got '", r.content, "'");
    if (r.stop == 1) {
      *last_stop = 0;
      break;
    }
    if (r.stop < 0) DIL_FAIL("Missing special token in tool calls");
    Read nr = read_until(text, index, {t.param_start, t.invoke_end});
    index = nr.index;
    *last_stop = nr.stop < 0 ? -1 : 1;
    std::string name;
    if (!match_tool_name(nr.content, &name)) DIL_FAIL("Tool name format error: '", nr.content, "'");
    std::vector<std::pair<std::string, std::pair<std::string, std::string>>> args;  // in order
    int stop = nr.stop;
    while (stop == 0) {
      Read pr = read_until(text, index, {t.param_end});
      index = pr.index;
      std::string pname, is_str, value;
      if (!match_param(pr.content, &pname, &is_str, &value)) DIL_FAIL("Parameter format error: '", pr.content, "'");
      for (const auto& a : args)
        if (a.first == pname) DIL_FAIL("Duplicate parameter name: '", pname, "'");
      args.push_back({pname, {value, is_str}});
      Read er = read_until(text, index, {t.param_start, t.invoke_end});
      index = er.index;
      stop = er.stop;
      *last_stop = er.stop < 0 ? -1 : 1;
      if (er.content != ">\n") DIL_FAIL("Parameter format error: expected '>\\n' but got '", er.content, "'");
    }
    // decode_dsml_to_arguments: string values are JSON-quoted, the others are copied verbatim.
    std::string json = "{";
    for (size_t k = 0; k < args.size(); ++k) {
      if (k) json += ", ";
      json += py_json_string(args[k].first) + ": " +
              (args[k].second.second == "true" ? py_json_string(args[k].second.first) : args[k].second.first);
    }
    json += "}";
    calls.push_back({"", name, json});
  }
  return index;
}

void check_no_special(const ParsedMessage& m) {
  for (const char* sp : {kBos, kEos, kThinkStart, kThinkEnd, kDsml})
    if (m.content.find(sp) != std::string::npos || m.reasoning_content.find(sp) != std::string::npos)
      DIL_FAIL("Unexpected special token '", sp, "' in content");
}

}  // namespace

ParsedMessage parse_completion(PromptFormat f, std::string_view text, bool thinking) {
  const Tokens t = tokens_for(f);
  ParsedMessage m;
  size_t index = 0;
  if (thinking) {
    Read r = read_until(text, index, {kThinkEnd, t.tool_start});
    index = r.index;
    m.reasoning_content = std::string(r.content);
    if (r.stop != 0) DIL_FAIL("Invalid thinking format: missing </think>");
  }
  Read r = read_until(text, index, {kEos, t.tool_start});
  index = r.index;
  m.content = std::string(r.content);
  int stop = r.stop;  // 0 EOS, 1 tool start, -1 none
  if (stop == -1) DIL_FAIL("Invalid format: missing EOS token");
  bool stop_ok = stop == 0;
  if (stop == 1) {
    int last = -1;
    index = parse_tool_calls(t, text, index, m.tool_calls, &last);
    Read e = read_until(text, index, {kEos});
    index = e.index;
    if (!e.content.empty()) DIL_FAIL("Unexpected content after tool calls");
    stop_ok = e.stop == 0 || e.stop == -1;
  }
  if (index != text.size() || !stop_ok) DIL_FAIL("Unexpected content at end");
  check_no_special(m);
  return m;
}

// ---------------------------------------------------------------------------------------------
// Streaming. States: reasoning -> content -> tools -> done. In the text states the longest
// suffix that is a prefix of a state-changing marker is held back, so markup never leaks. In the
// tools state the raw block is buffered and each call is emitted once its invoke closes.

struct OutputParser::State {
  PromptFormat f;
  Tokens t;
  enum Phase { kReasoning, kContent, kTools, kDone } phase;
  std::string held;       // undecided text of the current phase
  std::string tools_raw;  // tool block after the start token
  size_t tools_emitted = 0;
  size_t invokes_closed = 0;  // closing invoke tags seen so far (re-parse only when it grows)
  ParsedMessage msg;
};

namespace {
// Longest suffix of `s` that is a proper prefix of one of `marks`.
size_t partial_suffix(const std::string& s, const std::vector<std::string>& marks) {
  size_t keep = 0;
  for (const auto& m : marks)
    for (size_t k = std::min(m.size() - 1, s.size()); k > keep; --k)
      if (s.compare(s.size() - k, k, m, 0, k) == 0) {
        keep = k;
        break;
      }
  return keep;
}

// Complete invokes at the start of a tool block (lenient: stops at the first incomplete one).
void scan_complete_calls(const Tokens& t, const std::string& raw, std::vector<ToolCall>& calls) {
  // Parse the prefix that ends right after the last complete invoke closing tag.
  std::string close = t.invoke_end + ">\n";
  size_t end = raw.rfind(close);
  if (end == std::string::npos) return;
  std::string_view prefix(raw.data(), end + close.size() - 1);  // keep up to ">" (next read wants ">\n")
  std::vector<ToolCall> out;
  try {
    int last;
    std::string text = std::string(prefix) + "\n" + t.calls_end;  // close it so the parse can finish
    parse_tool_calls(t, text, 0, out, &last);
  } catch (const Error&) {
    return;  // malformed so far: decided at finish()
  }
  calls = std::move(out);
}
}  // namespace

OutputParser::~OutputParser() = default;
OutputParser::OutputParser(OutputParser&&) noexcept = default;
OutputParser& OutputParser::operator=(OutputParser&&) noexcept = default;

OutputParser::OutputParser(PromptFormat f, bool thinking) : s_(std::make_unique<State>()) {
  s_->f = f;
  s_->t = tokens_for(f);
  s_->phase = thinking ? State::kReasoning : State::kContent;
}

ParserDelta OutputParser::push(std::string_view text) {
  State& s = *s_;
  ParserDelta d;
  std::string in(text);
  while (!in.empty() && s.phase != State::kDone) {
    if (s.phase == State::kTools) {
      // Count closing tags in the new text (plus a tag split across pushes).
      size_t from = s.tools_raw.size() >= s.t.invoke_end.size() + 1 ? s.tools_raw.size() - s.t.invoke_end.size() - 1 : 0;
      s.tools_raw += in;
      in.clear();
      const std::string close = s.t.invoke_end + ">\n";
      size_t closed = s.invokes_closed;
      for (size_t p = s.tools_raw.find(close, from); p != std::string::npos; p = s.tools_raw.find(close, p + 1)) ++closed;
      if (closed == s.invokes_closed) break;
      s.invokes_closed = closed;
      std::vector<ToolCall> calls;
      scan_complete_calls(s.t, s.tools_raw, calls);
      for (size_t k = s.tools_emitted; k < calls.size(); ++k) {
        d.new_tool_calls.push_back(calls[k]);
        s.msg.tool_calls.push_back(calls[k]);
      }
      s.tools_emitted = std::max(s.tools_emitted, calls.size());
      break;
    }
    s.held += in;
    in.clear();
    const bool reasoning = s.phase == State::kReasoning;
    std::vector<std::string> marks = reasoning ? std::vector<std::string>{kThinkEnd, s.t.tool_start}
                                               : std::vector<std::string>{kEos, s.t.tool_start};
    Read r = read_until(s.held, 0, marks);
    std::string& sink = reasoning ? d.reasoning : d.content;
    std::string& total = reasoning ? s.msg.reasoning_content : s.msg.content;
    if (r.stop < 0) {
      size_t keep = partial_suffix(s.held, marks);
      std::string out = s.held.substr(0, s.held.size() - keep);
      sink += out;
      total += out;
      s.held.erase(0, s.held.size() - keep);
      break;
    }
    sink += std::string(r.content);
    total += std::string(r.content);
    in = s.held.substr(r.index);  // continue with what follows the marker in the next phase
    s.held.clear();
    if (r.stop == 1) s.phase = State::kTools;
    else if (reasoning) s.phase = State::kContent;
    else s.phase = State::kDone;
  }
  return d;
}

ParserDelta OutputParser::finish() {
  State& s = *s_;
  ParserDelta d;
  if (s.phase == State::kReasoning || s.phase == State::kContent) {
    // Generation ended without EOS (length limit): the held-back text is plain text after all.
    (s.phase == State::kReasoning ? d.reasoning : d.content) += s.held;
    (s.phase == State::kReasoning ? s.msg.reasoning_content : s.msg.content) += s.held;
  } else if (s.phase == State::kTools) {
    // Close an unterminated block so that complete calls are kept; a malformed block is given
    // back as content so nothing the model wrote is lost.
    std::vector<ToolCall> calls;
    std::string raw = s.tools_raw;
    size_t eos = raw.find(kEos);
    if (eos != std::string::npos) raw.erase(eos);
    try {
      int last;
      std::string text = raw;
      if (text.find(s.t.calls_end) == std::string::npos) text += "\n" + s.t.calls_end;
      parse_tool_calls(s.t, text, 0, calls, &last);
      for (size_t k = s.tools_emitted; k < calls.size(); ++k) {
        d.new_tool_calls.push_back(calls[k]);
        s.msg.tool_calls.push_back(calls[k]);
      }
      s.tools_emitted = std::max(s.tools_emitted, calls.size());
    } catch (const Error&) {
      if (s.tools_emitted == 0) {
        std::string back = s.t.tool_start + raw;
        d.content += back;
        s.msg.content += back;
      }
    }
  }
  s.held.clear();
  s.phase = State::kDone;
  return d;
}

ParsedMessage OutputParser::message() const { return s_->msg; }

}  // namespace dil::tok
