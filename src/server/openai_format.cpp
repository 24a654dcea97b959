#include "server/openai_format.h"

namespace dil::server {
namespace {

Json bytes_of(const std::string& s) {
  Json b = Json::array();
  for (unsigned char ch : s) b.push_back(int(ch));
  return b;
}

}  // namespace

Json usage_json(int prompt_tokens, int completion_tokens, int cached_tokens) {
  return Json{{"prompt_tokens", prompt_tokens},
              {"completion_tokens", completion_tokens},
              {"total_tokens", prompt_tokens + completion_tokens},
              {"prompt_tokens_details", Json{{"cached_tokens", cached_tokens}}}};
}

Json chat_logprobs(const tok::Tokenizer& t, const std::vector<GenToken>& tokens, int top) {
  Json content = Json::array();
  for (const auto& g : tokens) {
    const std::string raw = t.token_bytes(g.token);
    Json tops = Json::array();
    for (int i = 0; i < top && i < int(g.top.size()); ++i) {
      const std::string r = t.token_bytes(g.top[i].token);
      tops.push_back(Json{{"token", t.decode({g.top[i].token})}, {"logprob", g.top[i].logprob}, {"bytes", bytes_of(r)}});
    }
    content.push_back(Json{{"token", t.decode({g.token})}, {"logprob", g.logprob}, {"bytes", bytes_of(raw)},
                           {"top_logprobs", tops}});
  }
  return Json{{"content", content}};
}

Json completion_logprobs(const tok::Tokenizer& t, const std::vector<GenToken>& tokens, int top,
                         size_t offset0) {
  Json toks = Json::array(), lps = Json::array(), tops = Json::array(), offs = Json::array();
  size_t off = offset0;
  for (const auto& g : tokens) {
    const std::string s = t.decode({g.token});
    toks.push_back(s);
    lps.push_back(g.logprob);
    offs.push_back(off);
    off += s.size();
    if (top > 0) {
      Json m = Json::object();
      for (int i = 0; i < top && i < int(g.top.size()); ++i) m[t.decode({g.top[i].token})] = g.top[i].logprob;
      tops.push_back(m);
    } else {
      tops.push_back(nullptr);
    }
  }
  return Json{{"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

Json tool_calls_json(const std::vector<tok::ToolCall>& calls, int first_index, bool streaming) {
  Json arr = Json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    Json c;
    if (streaming) c["index"] = first_index + int(i);
    c["id"] = calls[i].id;
    c["type"] = "function";
    c["function"] = Json{{"name", calls[i].name}, {"arguments", calls[i].arguments_json}};
    arr.push_back(std::move(c));
  }
  return arr;
}

std::string sse(const Json& j) {
  // Invalid UTF-8 cannot reach here (the detokenizer repairs it), but never throw mid-stream.
  return "data: " + j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n\n";
}

Json chat_chunk(const ResponseMeta& m, Json choices, bool with_usage_null) {
  Json j{{"id", m.id}, {"object", "chat.completion.chunk"}, {"created", m.created}, {"model", m.model},
         {"system_fingerprint", "deepinfer-lab"}, {"choices", std::move(choices)}};
  if (with_usage_null) j["usage"] = nullptr;
  return j;
}

Json completion_chunk(const ResponseMeta& m, Json choices, bool with_usage_null) {
  Json j{{"id", m.id}, {"object", "text_completion"}, {"created", m.created}, {"model", m.model},
         {"system_fingerprint", "deepinfer-lab"}, {"choices", std::move(choices)}};
  if (with_usage_null) j["usage"] = nullptr;
  return j;
}

}  // namespace dil::server
