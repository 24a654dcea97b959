// Internal to src/server: what the route handlers share, and the handlers themselves.
#pragma once
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "core/check.h"
#include "server/generation.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/server.h"
#include "server/structured.h"

namespace dil::server {

struct Server::Core {
  Engine& engine;
  const tok::Tokenizer& tok;
  tok::PromptFormat format;
  ServerOptions opts;
  Metrics metrics;
  LiveRequests live;  // engine ids of running choices (shutdown aborts them)
  http::HttpServer http;
  int64_t vocab = 0;  // ids a client may send: below both the tokenizer's and the model's size
  GrammarCache grammars;  // structured output, by what each grammar depends on

  // Graceful shutdown: new requests get 503 and /health is not ready while running ones
  // finish (up to opts.shutdown_timeout_s); then the rest are aborted.
  std::atomic<bool> draining{false};
  std::atomic<bool> stopped{false};  // stop(): a drain in progress gives up waiting
  std::once_flag drain_once;
  std::thread drainer;
  void drain();

  // /health: a wedged engine (work queued, no step for health_stall_s) answers 503.
  mutable std::mutex health_mu;
  mutable int64_t last_steps = -1;
  mutable std::chrono::steady_clock::time_point last_progress = std::chrono::steady_clock::now();
  bool engine_wedged() const;

  Core(Engine& e, const tok::Tokenizer& t, tok::PromptFormat f, ServerOptions o);

  void check_model(const std::string& model) const;  // 404 for another model's name
  std::vector<int32_t> encode(const std::string& text, const std::string& param) const;
  // Fills max_tokens from the context left, or 400 with the counts when it does not fit.
  void fit_context(GenParams* g, int prompt_tokens, const std::string& param) const;
  void admit(int n) const;  // 429 when over the concurrency limit (reject mode)
  // One fresh constraint per choice of `specs` (none when `s` constrains nothing).
  void constrain(const StructuredSpec& s, std::vector<ChoiceSpec>* specs);
  // The X-Data-Parallel-Rank header (vLLM's name): the rank that must run the request, -1 when
  // absent; 400 when it is not an integer in [0, dp_size).
  int dp_rank(const http::Request& req) const;

  void chat(const http::Request& req, http::Response& res);
  void completions(const http::Request& req, http::Response& res);
  void tokenize(const http::Request& req, http::Response& res);
  void detokenize(const http::Request& req, http::Response& res);
};

void send_json(http::Response& res, int status, const Json& j);
void send_error(http::Response& res, const ApiError& e);

}  // namespace dil::server
