#include "server/server.h"

#include <chrono>
#include <cstdio>
#include <thread>

#include "core/check.h"
#include "server/server_core.h"

namespace dil::server {
namespace {

// Every handler runs inside this: user errors become OpenAI error bodies, and nothing a
// client sends can escape as an exception (a broken invariant would still abort).
template <typename F>
http::HttpServer::Handler guarded(F f) {
  return [f](const http::Request& req, http::Response& res) {
    try {
      f(req, res);
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const dil::Error& e) {
      send_error(res, ApiError(400, e.what()));
    } catch (const Json::exception& e) {
      send_error(res, ApiError(400, std::string("invalid request: ") + e.what()));
    } catch (const std::exception& e) {
      send_error(res, ApiError(500, std::string("internal error: ") + e.what(), "", "", "server_error"));
    }
  };
}

// Errors of the connection layer (framing, limits, routing) as OpenAI error bodies.
ApiError status_error(int status, const std::string& message) {
  switch (status) {
    case 404: return ApiError(404, "no such endpoint", "", "not_found");
    case 405: return ApiError(405, "method not allowed for this endpoint");
    case 408: return ApiError(408, message, "", "request_timeout");
    case 413: return ApiError(413, message, "", "request_too_large");
    default: return ApiError(status, message, "", "",
                             status >= 500 ? "server_error" : "invalid_request_error");
  }
}

bool needs_auth(const std::string& path) {
  return path.rfind("/v1/", 0) == 0 || path == "/tokenize" || path == "/detokenize";
}

}  // namespace

void send_json(http::Response& res, int status, const Json& j) {
  res.status = status;
  res.set_content(j.dump(-1, ' ', false, Json::error_handler_t::replace), "application/json");
}

void send_error(http::Response& res, const ApiError& e) {
  if (e.status == 429) res.set_header("Retry-After", "1");
  send_json(res, e.status, error_body(e));
}

namespace {

http::HttpConfig http_config(const ServerOptions& o) {
  http::HttpConfig c;
  c.host = o.host;
  c.port = o.port;
  c.limits.max_body_bytes = o.max_body_bytes;
  c.idle_timeout_s = o.keep_alive_timeout_s;
  c.request_timeout_s = o.request_timeout_s;
  c.max_workers = std::max(o.threads, 8);
  return c;
}

}  // namespace

Server::Core::Core(Engine& e, const tok::Tokenizer& t, tok::PromptFormat f, ServerOptions o)
    : engine(e), tok(t), format(f), opts(std::move(o)), metrics(opts.model_name), http(http_config(opts)),
      // Masks cover the model's logits row: as many ids as the engine has.
      grammars(t, e.info().vocab_size > 0 ? e.info().vocab_size : t.vocab_size()) {
  opts.defaults.format = f;
  vocab = t.vocab_size();
  if (e.info().vocab_size > 0) vocab = std::min<int64_t>(vocab, e.info().vocab_size);
}

void Server::Core::check_model(const std::string& model) const {
  if (model.empty() || model == opts.model_name || (!opts.model_dir.empty() && model == opts.model_dir)) return;
  throw ApiError(404, "The model `" + model + "` does not exist. This server serves `" + opts.model_name + "`.",
                 "model", "model_not_found");
}

std::vector<int32_t> Server::Core::encode(const std::string& text, const std::string& param) const {
  try {
    return tok.encode(text, /*parse_special=*/true);
  } catch (const dil::Error& e) {
    throw ApiError(400, std::string("cannot tokenize the input: ") + e.what(), param);
  }
}

void Server::Core::fit_context(GenParams* g, int prompt_tokens, const std::string& param) const {
  const int max_len = engine.info().max_model_len;
  if (max_len <= 0) {
    if (g->stop.max_tokens < 0) g->stop.max_tokens = 16;
    return;
  }
  const int64_t want = g->stop.max_tokens < 0 ? 0 : g->stop.max_tokens;
  // vLLM's message (clients parse its first sentence), plus the KV capacity: the engine starts
  // only with a pool that holds max_model_len, so this is exactly the request that can never fit.
  const EngineInfo& info = engine.info();
  const std::string capacity =
      info.kv_blocks > 0 ? str_cat(" The KV cache holds ", info.kv_blocks * info.block_tokens, " tokens (",
                                   info.kv_slots, " state slots).")
                         : std::string();
  if (prompt_tokens >= max_len || prompt_tokens + want > max_len)
    throw ApiError(400,
                   str_cat("This model's maximum context length is ", max_len,
                           " tokens. However, you requested ", prompt_tokens + want, " tokens (",
                           prompt_tokens, " in the ", param, ", ", want,
                           " in the completion). Please reduce the length of the ", param,
                           " or completion.", capacity),
                   param, "context_length_exceeded");
  if (g->stop.max_tokens < 0) g->stop.max_tokens = max_len - prompt_tokens;
}

bool Server::Core::engine_wedged() const {
  const EngineStats st = engine.stats();
  std::lock_guard<std::mutex> l(health_mu);
  const auto now = std::chrono::steady_clock::now();
  if (st.steps != last_steps || st.running + st.waiting == 0) {
    last_steps = st.steps;
    last_progress = now;
    return false;
  }
  return std::chrono::duration<double>(now - last_progress).count() > opts.health_stall_s;
}

void Server::Core::admit(int n) const {
  if (opts.max_concurrent <= 0 || !opts.reject_overload) return;
  // Racy by a few requests under contention; the limit is a load-shedding threshold, not a
  // resource bound (the engine queues whatever gets through).
  if (metrics.in_flight() + n > opts.max_concurrent)
    throw ApiError(429, str_cat("server is at capacity (", opts.max_concurrent,
                                " concurrent generations); retry later"),
                   "", "rate_limit_exceeded", "rate_limit_error");
}

int Server::Core::dp_rank(const http::Request& req) const {
  static constexpr const char* kHeader = "X-Data-Parallel-Rank";
  if (!req.has_header(kHeader)) return -1;
  const std::string v = req.get_header_value(kHeader);
  const int n = engine.info().dp_size;
  int r = -1;
  size_t used = 0;
  try {
    r = std::stoi(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size() || r < 0 || r >= n)
    throw ApiError(400, str_cat("header ", kHeader, " must be a data-parallel rank in [0, ", n, "), got '", v, "'"),
                   kHeader);
  return r;
}

void Server::Core::drain() {
  draining = true;
  std::fprintf(stderr, "serve: draining: new requests get 503; waiting up to %.0f s for %lld running\n",
               opts.shutdown_timeout_s, (long long)metrics.in_flight());
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::milliseconds(int64_t(opts.shutdown_timeout_s * 1000));
  while (metrics.in_flight() > 0 && Clock::now() < deadline && !stopped)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (stopped) return;
  if (const auto ids = live.ids(); !ids.empty()) {
    std::fprintf(stderr, "serve: shutdown timeout: aborting %zu running generation(s)\n", ids.size());
    for (const auto& id : ids) engine.cancel(id);
    // Their handlers write the aborted answers (finish_reason "abort"); the engine frees them
    // at its next step.
    const auto grace = Clock::now() + std::chrono::seconds(10);
    while (metrics.in_flight() > 0 && Clock::now() < grace && !stopped)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  http.stop();
}

Server::Server(Engine& engine, const tok::Tokenizer& tok, tok::PromptFormat format, ServerOptions o)
    : core_(std::make_unique<Core>(engine, tok, format, std::move(o))) {
  Core& c = *core_;
  auto& h = c.http;
  h.set_pre_routing([&c](const http::Request& req, http::Response& res) {
    // Echo the caller's request id so client and server logs can be joined.
    if (req.has_header("X-Request-Id")) res.set_header("X-Request-Id", req.get_header_value("X-Request-Id"));
    if (c.draining && req.path != "/metrics") {
      send_error(res, ApiError(503, "the server is shutting down", "", "shutting_down", "server_error"));
      res.close = true;
      return true;
    }
    if (c.opts.api_key.empty() || !needs_auth(req.path)) return false;
    if (req.get_header_value("Authorization") == "Bearer " + c.opts.api_key) return false;
    send_error(res, ApiError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'.",
                             "", "invalid_api_key", "authentication_error"));
    return true;
  });
  h.set_error_body([](int status, const std::string& message, http::Response& res) {
    send_error(res, status_error(status, message));
  });
  h.set_logger([&c](const http::Request& req, const http::Response& res, size_t bytes, double seconds) {
    c.metrics.http_response(res.status);
    if (!c.opts.access_log) return;
    // One write per line, so concurrent handlers do not interleave inside a line.
    const std::string line =
        str_cat(req.remote.empty() ? "-" : req.remote, " \"", req.method.empty() ? "-" : req.method, " ",
                req.target.empty() ? "-" : req.target, " HTTP/1.", req.minor, "\" ", res.status, " ", bytes, " ",
                int64_t(seconds * 1e6) / 1e3, "ms\n");
    std::fputs(line.c_str(), stderr);
  });

  h.get("/health", guarded([&c](const http::Request&, http::Response& res) {
    if (c.engine_wedged())
      send_error(res, ApiError(503, "the engine has made no progress on queued work", "", "engine_stalled", "server_error"));
    else
      send_json(res, 200, Json{{"status", "ok"}});
  }));
  h.get("/metrics", guarded([&c](const http::Request&, http::Response& res) {
    const HttpGauges g{c.http.open_connections(), c.http.worker_threads(), c.draining.load()};
    res.set_content(c.metrics.render(c.engine.stats(), g), "text/plain; version=0.0.4; charset=utf-8");
  }));
  h.get("/v1/models", guarded([&c](const http::Request&, http::Response& res) {
    Json m{{"id", c.opts.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "deepinfer-lab"},
           {"root", c.opts.model_dir}, {"max_model_len", c.engine.info().max_model_len}};
    send_json(res, 200, Json{{"object", "list"}, {"data", Json::array({m})}});
  }));
  h.post("/v1/chat/completions", guarded([&c](const http::Request& q, http::Response& r) { c.chat(q, r); }));
  h.post("/v1/completions", guarded([&c](const http::Request& q, http::Response& r) { c.completions(q, r); }));
  h.post("/tokenize", guarded([&c](const http::Request& q, http::Response& r) { c.tokenize(q, r); }));
  h.post("/detokenize", guarded([&c](const http::Request& q, http::Response& r) { c.detokenize(q, r); }));
}

Server::~Server() {
  stop();
  if (core_->drainer.joinable()) core_->drainer.join();
}

int Server::bind() { return core_->http.bind(); }

void Server::run() { core_->http.run(); }

void Server::stop() {
  core_->stopped = true;
  core_->http.stop();
}

void Server::shutdown() {
  Core& c = *core_;
  std::call_once(c.drain_once, [&c] { c.drainer = std::thread([&c] { c.drain(); }); });
}

}  // namespace dil::server
