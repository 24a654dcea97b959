#include "server/server.h"

#include <sys/socket.h>

#include <chrono>

#include "core/check.h"
#include "server/server_core.h"

namespace dil::server {
namespace {

// Every handler runs inside this: user errors become OpenAI error bodies, and nothing a
// client sends can escape as an exception (a broken invariant would still abort).
template <typename F>
httplib::Server::Handler guarded(F f) {
  return [f](const httplib::Request& req, httplib::Response& res) {
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

ApiError status_error(int status) {
  switch (status) {
    case 400: return ApiError(400, "malformed HTTP request");
    case 404: return ApiError(404, "no such endpoint", "", "not_found");
    case 405: return ApiError(405, "method not allowed");
    case 413: return ApiError(413, "request body too large", "", "request_too_large");
    case 414: return ApiError(414, "request URI too long");
    case 431: return ApiError(431, "request headers too large");
    default: return ApiError(status, "HTTP error " + std::to_string(status), "", "",
                             status >= 500 ? "server_error" : "invalid_request_error");
  }
}

bool needs_auth(const std::string& path) {
  return path.rfind("/v1/", 0) == 0 || path == "/tokenize" || path == "/detokenize";
}

}  // namespace

void send_json(httplib::Response& res, int status, const Json& j) {
  res.status = status;
  res.set_content(j.dump(-1, ' ', false, Json::error_handler_t::replace), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  if (e.status == 429) res.set_header("Retry-After", "1");
  send_json(res, e.status, error_body(e));
}

Server::Core::Core(Engine& e, const tok::Tokenizer& t, tok::PromptFormat f, ServerOptions o)
    : engine(e), tok(t), format(f), opts(std::move(o)), metrics(opts.model_name),
      // Masks cover the model's logits row: as many ids as the engine has.
      grammars(t, e.info().vocab_size > 0 ? e.info().vocab_size : t.vocab_size()) {
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
  if (prompt_tokens >= max_len || prompt_tokens + want > max_len)
    throw ApiError(400,
                   str_cat("This model's maximum context length is ", max_len,
                           " tokens. However, you requested ", prompt_tokens + want, " tokens (",
                           prompt_tokens, " in the ", param, ", ", want,
                           " in the completion). Please reduce the length of the ", param,
                           " or completion."),
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

int Server::Core::dp_rank(const httplib::Request& req) const {
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

Server::Server(Engine& engine, const tok::Tokenizer& tok, tok::PromptFormat format, ServerOptions o)
    : core_(std::make_unique<Core>(engine, tok, format, std::move(o))) {
  Core& c = *core_;
  auto& h = c.http;
  const int threads = std::max(c.opts.threads, 8);
  h.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  h.set_tcp_nodelay(true);
  h.set_keep_alive_max_count(100000);
  h.set_keep_alive_timeout(5);
  h.set_read_timeout(30);
  h.set_write_timeout(30);
  h.set_payload_max_length(c.opts.max_body_bytes);
  // Debian's compiled cpp-httplib listens with a backlog of 5: a burst of new connections
  // overflows it and clients see resets. Remember the socket so bind() can raise the backlog.
  h.set_socket_options([&c](socket_t sock) {
    httplib::default_socket_options(sock);
    if (c.listen_fd < 0) c.listen_fd = sock;
  });

  h.set_pre_routing_handler([&c](const httplib::Request& req, httplib::Response& res) {
    // Echo the caller's request id so client and server logs can be joined.
    if (req.has_header("X-Request-Id")) res.set_header("X-Request-Id", req.get_header_value("X-Request-Id"));
    if (c.opts.api_key.empty() || !needs_auth(req.path)) return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") == "Bearer " + c.opts.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, ApiError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'.",
                             "", "invalid_api_key", "authentication_error"));
    return httplib::Server::HandlerResponse::Handled;
  });
  h.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (res.body.empty() && !res.content_provider_) send_error(res, status_error(res.status));
  });
  h.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    send_error(res, ApiError(500, "internal error", "", "", "server_error"));
  });
  h.set_logger([&c](const httplib::Request&, const httplib::Response& res) { c.metrics.http_response(res.status); });

  h.Get("/health", guarded([&c](const httplib::Request&, httplib::Response& res) {
    if (c.engine_wedged())
      send_error(res, ApiError(503, "the engine has made no progress on queued work", "", "engine_stalled", "server_error"));
    else
      send_json(res, 200, Json{{"status", "ok"}});
  }));
  h.Get("/metrics", guarded([&c](const httplib::Request&, httplib::Response& res) {
    res.set_content(c.metrics.render(c.engine.stats()), "text/plain; version=0.0.4; charset=utf-8");
  }));
  h.Get("/v1/models", guarded([&c](const httplib::Request&, httplib::Response& res) {
    Json m{{"id", c.opts.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "deepinfer-lab"},
           {"root", c.opts.model_dir}, {"max_model_len", c.engine.info().max_model_len}};
    send_json(res, 200, Json{{"object", "list"}, {"data", Json::array({m})}});
  }));
  h.Post("/v1/chat/completions", guarded([&c](const httplib::Request& q, httplib::Response& r) { c.chat(q, r); }));
  h.Post("/v1/completions", guarded([&c](const httplib::Request& q, httplib::Response& r) { c.completions(q, r); }));
  h.Post("/tokenize", guarded([&c](const httplib::Request& q, httplib::Response& r) { c.tokenize(q, r); }));
  h.Post("/detokenize", guarded([&c](const httplib::Request& q, httplib::Response& r) { c.detokenize(q, r); }));
}

Server::~Server() { stop(); }

int Server::bind() {
  auto& c = *core_;
  int port = c.opts.port;
  if (port == 0) {
    port = c.http.bind_to_any_port(c.opts.host.c_str());
    if (port <= 0) DIL_FAIL("cannot bind ", c.opts.host);
  } else if (!c.http.bind_to_port(c.opts.host.c_str(), port)) {
    DIL_FAIL("cannot bind ", c.opts.host, ":", port, " (in use?)");
  }
  // Listening again on a listening socket only updates its backlog (Linux); the kernel caps
  // it at net.core.somaxconn.
  if (c.listen_fd >= 0 && ::listen(c.listen_fd, 4096) != 0) DIL_FAIL("listen(backlog 4096) failed");
  return port;
}

void Server::run() { core_->http.listen_after_bind(); }

void Server::stop() {
  if (core_ && core_->http.is_running()) core_->http.stop();
}

}  // namespace dil::server
