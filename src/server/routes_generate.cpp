// /v1/chat/completions and /v1/completions: validate, render, tokenize, submit, then answer
// with one JSON body or an SSE stream (role chunk, deltas, finish chunk, usage, [DONE]).
#include <chrono>
#include <cstdio>
#include <optional>

#include "core/check.h"
#include "server/generation.h"
#include "server/openai_format.h"
#include "server/server_core.h"

namespace dil::server {
namespace {

using namespace std::chrono_literals;

// n choices of one prompt: the same request with per-choice seeds (seed + i), so a seeded
// n=2 request is reproducible and its choices still differ.
void add_choices(std::vector<ChoiceSpec>* specs, const GenRequest& base, const ChoiceConfig& cfg, int n,
                 int prompt_index) {
  for (int i = 0; i < n; ++i) {
    ChoiceSpec s{base, cfg, prompt_index};
    if (base.sampling.seed) s.request.sampling.seed = *base.sampling.seed + uint64_t(i);
    specs->push_back(std::move(s));
  }
}

// vLLM's truncate_prompt_tokens: keep the last k tokens (-1: the context length).
void truncate_prompt(std::vector<int32_t>* prompt, int k, int max_model_len) {
  if (k == 0) return;
  const size_t keep = size_t(k < 0 ? max_model_len : k);
  if (keep > 0 && prompt->size() > keep) prompt->erase(prompt->begin(), prompt->end() - std::ptrdiff_t(keep));
}

ChoiceConfig choice_config(const GenParams& g) {
  ChoiceConfig cfg;
  cfg.skip_special = g.skip_special_tokens;
  cfg.stop_strings = g.stop_strings;
  cfg.include_stop_str = g.include_stop_str;
  cfg.min_tokens = g.stop.min_tokens;
  return cfg;
}

// Per-choice accumulation for non-streaming answers.
struct Collected {
  std::string content, reasoning, finish_reason, error;
  std::vector<tok::ToolCall> tool_calls;
  std::vector<GenToken> tokens;
};

// Runs a non-streaming generation to its end. nullopt: the client went away (checked after
// every engine output and every 100 ms), and dropping the Generation cancels the rest.
std::optional<std::vector<Collected>> collect(Generation& g, size_t n_choices, const http::Request& req) {
  std::vector<Collected> out(n_choices);
  while (!g.done()) {
    if (req.client_gone()) return std::nullopt;
    for (auto& d : g.poll(100ms)) {
      Collected& c = out[size_t(d.index)];
      c.content += d.content;
      c.reasoning += d.reasoning;
      for (auto& t : d.tool_calls) c.tool_calls.push_back(std::move(t));
      c.tokens.insert(c.tokens.end(), d.tokens.begin(), d.tokens.end());
      if (!d.finish_reason.empty()) c.finish_reason = d.finish_reason;
      if (!d.error.empty()) c.error = d.error;
    }
  }
  for (const auto& c : out)
    if (c.finish_reason == "error") throw ApiError(500, "generation failed: " + c.error, "", "", "server_error");
  return out;
}

// What a handler answers when its client has gone: nobody reads it, but the access log and
// the status metrics show it (nginx's 499).
void client_gone(http::Response& res) {
  send_error(res, ApiError(499, "client closed the connection", "", "client_closed_request"));
  res.close = true;
}

struct StreamState {
  std::shared_ptr<Generation> gen;
  ResponseMeta meta;
  bool chat = false;
  bool thinking = false;
  bool include_usage = false;
  int top_logprobs = -1;  // -1: no logprobs
  bool started = false;
  bool finished = false;
  std::chrono::steady_clock::time_point last_ping{};
  std::vector<size_t> text_len;  // completions: text offset per choice (for logprobs)
  std::vector<std::string> echo; // completions: prompt text per choice to echo first
};

std::string chat_delta_chunks(const StreamState& st, const ChoiceDelta& d, const tok::Tokenizer& t) {
  std::string out;
  const bool has_text = !d.content.empty() || !d.reasoning.empty() || !d.tool_calls.empty();
  if (has_text || (!d.tokens.empty() && st.top_logprobs >= 0)) {
    Json delta = Json::object();
    if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
    if (!d.content.empty()) delta["content"] = d.content;
    if (!d.tool_calls.empty()) delta["tool_calls"] = tool_calls_json(d.tool_calls, d.first_tool_index, true);
    Json ch{{"index", d.index}, {"delta", delta},
            {"logprobs", st.top_logprobs >= 0 ? chat_logprobs(t, d.tokens, st.top_logprobs) : Json()},
            {"finish_reason", nullptr}};
    out += sse(chat_chunk(st.meta, Json::array({ch}), st.include_usage));
  }
  if (!d.finish_reason.empty()) {
    Json ch{{"index", d.index}, {"delta", Json::object()}, {"logprobs", nullptr},
            {"finish_reason", d.finish_reason}};
    out += sse(chat_chunk(st.meta, Json::array({ch}), st.include_usage));
  }
  return out;
}

std::string completion_delta_chunks(StreamState& st, const ChoiceDelta& d, const tok::Tokenizer& t) {
  if (d.content.empty() && d.finish_reason.empty() && d.tokens.empty()) return "";
  size_t& off = st.text_len[size_t(d.index)];
  Json lp = st.top_logprobs >= 0 ? completion_logprobs(t, d.tokens, st.top_logprobs, off) : Json();
  off += d.content.size();
  Json ch{{"index", d.index}, {"text", d.content}, {"logprobs", lp},
          {"finish_reason", d.finish_reason.empty() ? Json() : Json(d.finish_reason)}};
  return sse(completion_chunk(st.meta, Json::array({ch}), st.include_usage));
}

// Called by the connection layer until sink.done(); each call waits briefly for engine output
// so a disconnect (failed write) is noticed within one engine step of output.
bool pump_unguarded(const std::shared_ptr<StreamState>& st, const tok::Tokenizer& t, http::DataSink& sink) {
  std::string out;
  if (!st->started) {
    st->started = true;
    const size_t n = st->text_len.size();
    for (size_t i = 0; i < n; ++i) {
      if (st->chat) {
        Json ch{{"index", i}, {"delta", Json{{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                {"finish_reason", nullptr}};
        out += sse(chat_chunk(st->meta, Json::array({ch}), st->include_usage));
      } else if (!st->echo[i].empty()) {
        Json ch{{"index", i}, {"text", st->echo[i]}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
        out += sse(completion_chunk(st->meta, Json::array({ch}), st->include_usage));
        st->text_len[i] = st->echo[i].size();
      }
    }
  }
  if (!st->gen->done()) {
    for (const auto& d : st->gen->poll(50ms)) {
      if (d.finish_reason == "error") {
        out += sse(Json{{"error", {{"message", "generation failed: " + d.error}, {"type", "server_error"},
                                   {"param", nullptr}, {"code", nullptr}}}});
        sink.write(out.data(), out.size());
        return false;  // OpenAI clients raise on an error event; close the stream
      }
      out += st->chat ? chat_delta_chunks(*st, d, t) : completion_delta_chunks(*st, d, t);
    }
  }
  if (st->gen->done() && !st->finished) {
    st->finished = true;
    if (st->include_usage) {
      Json u = usage_json(st->gen->prompt_tokens(), st->gen->completion_tokens(), st->gen->cached_tokens());
      Json j = st->chat ? chat_chunk(st->meta, Json::array(), false) : completion_chunk(st->meta, Json::array(), false);
      j["usage"] = u;
      out += sse(j);
    }
    out += kSseDone;
  }
  if (out.empty() && sink.peer_shut_down()) {
    // The client closed or half-closed, and there is nothing to send (a queued request, say):
    // an SSE comment, which clients skip, at most once a second; a closed socket answers it
    // with a reset, so the next write fails and the generation is cancelled.
    const auto now = std::chrono::steady_clock::now();
    if (now - st->last_ping >= 1s) {
      st->last_ping = now;
      out = ": ping\n\n";
    }
  }
  if (!out.empty() && !sink.write(out.data(), out.size())) return false;
  if (st->finished) sink.done();
  return true;
}

// The connection layer runs the provider on its own thread, where an escaping exception would
// end the process: whatever goes wrong in one stream ends that stream with an error event (its
// generation is dropped by the releaser), and the server goes on serving the others.
bool pump(const std::shared_ptr<StreamState>& st, const tok::Tokenizer& t, http::DataSink& sink) {
  try {
    return pump_unguarded(st, t, sink);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "serve: stream ended by an internal error: %s\n", e.what());
    const std::string out = sse(Json{{"error",
                                      {{"message", std::string("internal error: ") + e.what()},
                                       {"type", "server_error"},
                                       {"param", nullptr},
                                       {"code", nullptr}}}});
    sink.write(out.data(), out.size());
    return false;
  }
}

void stream_response(http::Response& res, std::shared_ptr<StreamState> st, const tok::Tokenizer& t) {
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [st, &t](size_t, http::DataSink& sink) { return pump(st, t, sink); },
      [st](bool success) {
        // A failed write means the client went away: drop the generation now so the engine
        // frees the request's state at its next step (the destructor cancels it).
        if (!success) st->gen.reset();
      });
}

}  // namespace

void Server::Core::constrain(const StructuredSpec& s, std::vector<ChoiceSpec>* specs) {
  std::shared_ptr<const grammar::CompiledGrammar> g = grammars.get(s);
  // Two allow-lists rarely meet: the engine would find no common token mid-answer and end the
  // request with an error (a 500), so the contradiction is the client's 400 up front.
  if (g && !specs->empty() && !specs->front().request.sampling.allowed_token_ids.empty())
    throw ApiError(400, "'allowed_token_ids' cannot be combined with structured output (a grammar decides the tokens)",
                   "allowed_token_ids", "unsupported_parameter");
  for (ChoiceSpec& c : *specs) c.request.constraint = make_constraint(g);  // a matcher per choice
}

void Server::Core::chat(const http::Request& req, http::Response& res) {
  const Json body = parse_body(req.body);
  ChatRequest cr = parse_chat_request(body, opts.defaults, vocab);
  check_model(cr.gen.model);
  std::string prompt;
  try {
    prompt = tok::render_chat(format, cr.messages, cr.chat);
  } catch (const dil::Error& e) {
    throw ApiError(400, e.what(), "messages");
  }
  GenRequest base;
  base.prompt = encode(prompt, "messages");
  // The rendered prompt starts with BOS already; add_special_tokens adds another (as vLLM).
  const int32_t bos = engine.info().bos_token_id;
  if (cr.gen.add_special_tokens.value_or(false) && bos >= 0) base.prompt.insert(base.prompt.begin(), bos);
  truncate_prompt(&base.prompt, cr.gen.truncate_prompt_tokens, engine.info().max_model_len);
  fit_context(&cr.gen, int(base.prompt.size()), "messages");
  base.sampling = cr.gen.sampling;
  base.stop = cr.gen.stop;
  base.dp_rank = dp_rank(req);
  // A model that starts a new turn has finished its own (as other V4 servers stop on these).
  for (const char* s : {"<｜User｜>", "<｜Assistant｜>", "<｜latest_reminder｜>", "<｜System｜>"}) {
    const int32_t id = tok.token_to_id(s);
    if (id >= 0) base.stop.stop_token_ids.push_back(id);
  }
  ChoiceConfig cfg = choice_config(cr.gen);
  cfg.chat = true;
  cfg.thinking = cr.chat.thinking_mode == "thinking";
  cfg.parse_tools = !cr.chat.tools.is_null();
  StructuredSpec ss;
  ss.format = cr.format;
  ss.chat = true;
  ss.thinking = cfg.thinking;
  ss.prompt_format = format;
  ss.tool_choice = cr.tool_choice;
  ss.tool_name = cr.tool_choice_name;
  ss.tools = cr.chat.tools;
  ss.parallel_tool_calls = cr.parallel_tool_calls;
  ss.has_tools_for_none = cr.tools_withheld;
  std::vector<ChoiceSpec> specs;
  add_choices(&specs, base, cfg, cr.gen.n, 0);
  constrain(ss, &specs);  // before admit: a schema that cannot compile is the client's 400
  admit(cr.gen.n);
  auto gen = std::make_shared<Generation>(engine, metrics, tok, format, "chatcmpl-" + random_hex(24), std::move(specs),
                                          &live);
  ResponseMeta meta{cr.gen.request_id.empty() ? gen->id() : "chatcmpl-" + cr.gen.request_id, gen->created(),
                    opts.model_name};
  const int top = cr.logprobs ? cr.gen.sampling.logprobs : -1;

  if (cr.gen.stream) {
    auto st = std::make_shared<StreamState>();
    st->gen = gen;
    st->meta = meta;
    st->chat = true;
    st->thinking = cfg.thinking;
    st->include_usage = cr.gen.include_usage;
    st->top_logprobs = top;
    st->text_len.assign(size_t(cr.gen.n), 0);
    st->echo.assign(size_t(cr.gen.n), "");
    stream_response(res, std::move(st), tok);
    return;
  }
  const auto collected = collect(*gen, size_t(cr.gen.n), req);
  if (!collected) return client_gone(res);
  const auto& got = *collected;
  Json choices = Json::array();
  for (size_t i = 0; i < got.size(); ++i) {
    const Collected& c = got[i];
    Json msg{{"role", "assistant"}, {"content", c.content}};
    if (cfg.thinking || !c.reasoning.empty()) msg["reasoning_content"] = c.reasoning;
    if (!c.tool_calls.empty()) {
      msg["tool_calls"] = tool_calls_json(c.tool_calls, 0, false);
      if (c.content.empty()) msg["content"] = nullptr;
    }
    choices.push_back(Json{{"index", i}, {"message", msg},
                           {"logprobs", top >= 0 ? chat_logprobs(tok, c.tokens, top) : Json()},
                           {"finish_reason", c.finish_reason}});
  }
  send_json(res, 200,
            Json{{"id", meta.id}, {"object", "chat.completion"}, {"created", meta.created}, {"model", meta.model},
                 {"system_fingerprint", "deepinfer-lab"}, {"choices", choices},
                 {"usage", usage_json(gen->prompt_tokens(), gen->completion_tokens(), gen->cached_tokens())}});
}

void Server::Core::completions(const http::Request& req, http::Response& res) {
  const Json body = parse_body(req.body);
  CompletionRequest cr = parse_completion_request(body, vocab);
  check_model(cr.gen.model);
  const int32_t bos = engine.info().bos_token_id;
  std::vector<ChoiceSpec> specs;
  std::vector<std::string> echo;
  const ChoiceConfig cfg = choice_config(cr.gen);
  int max_tokens_given = cr.gen.stop.max_tokens;
  const int rank = dp_rank(req);
  for (size_t p = 0; p < cr.prompts.size(); ++p) {
    const auto& pr = cr.prompts[p];
    GenRequest base;
    if (pr.is_text) {
      // Like HF's add_special_tokens=True for DeepSeek: BOS first.
      base.prompt = encode(pr.text, "prompt");
      const bool add_bos = cr.gen.add_special_tokens.value_or(true);
      if (add_bos && bos >= 0 && (base.prompt.empty() || base.prompt[0] != bos))
        base.prompt.insert(base.prompt.begin(), bos);
      if (base.prompt.empty()) throw ApiError(400, "the prompt has no tokens", "prompt");
    } else {
      base.prompt = pr.ids;
    }
    truncate_prompt(&base.prompt, cr.gen.truncate_prompt_tokens, engine.info().max_model_len);
    GenParams g = cr.gen;
    g.stop.max_tokens = max_tokens_given;
    fit_context(&g, int(base.prompt.size()), "prompt");
    base.sampling = g.sampling;
    base.stop = g.stop;
    base.dp_rank = rank;
    add_choices(&specs, base, cfg, cr.gen.n, int(p));
    for (int i = 0; i < cr.gen.n; ++i)
      echo.push_back(cr.echo ? (pr.is_text ? pr.text : tok.decode(pr.ids)) : std::string());
  }
  StructuredSpec ss;
  ss.format = cr.format;
  constrain(ss, &specs);
  admit(int(specs.size()));
  const size_t n_choices = specs.size();
  auto gen = std::make_shared<Generation>(engine, metrics, tok, format, "cmpl-" + random_hex(24), std::move(specs),
                                          &live);
  ResponseMeta meta{cr.gen.request_id.empty() ? gen->id() : "cmpl-" + cr.gen.request_id, gen->created(),
                    opts.model_name};
  const int top = cr.gen.sampling.logprobs;

  if (cr.gen.stream) {
    auto st = std::make_shared<StreamState>();
    st->gen = gen;
    st->meta = meta;
    st->include_usage = cr.gen.include_usage;
    st->top_logprobs = top;
    st->text_len.assign(n_choices, 0);
    st->echo = echo;
    stream_response(res, std::move(st), tok);
    return;
  }
  const auto collected = collect(*gen, n_choices, req);
  if (!collected) return client_gone(res);
  const auto& got = *collected;
  Json choices = Json::array();
  for (size_t i = 0; i < got.size(); ++i) {
    const Collected& c = got[i];
    choices.push_back(Json{{"index", i}, {"text", echo[i] + c.content},
                           {"logprobs", top >= 0 ? completion_logprobs(tok, c.tokens, top, echo[i].size()) : Json()},
                           {"finish_reason", c.finish_reason}});
  }
  send_json(res, 200,
            Json{{"id", meta.id}, {"object", "text_completion"}, {"created", meta.created}, {"model", meta.model},
                 {"system_fingerprint", "deepinfer-lab"}, {"choices", choices},
                 {"usage", usage_json(gen->prompt_tokens(), gen->completion_tokens(), gen->cached_tokens())}});
}

}  // namespace dil::server
