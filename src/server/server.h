// The OpenAI-compatible HTTP server: /v1/chat/completions, /v1/completions, /v1/models,
// /health, /metrics, /tokenize, /detokenize, on the connection layer of http_server.h (one
// event-loop thread for every connection, an elastic pool of handler threads; a stream holds
// a handler thread while it streams).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "dil/engine.h"
#include "server/protocol.h"
#include "tokenizer/tokenizer.h"

namespace dil::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                 // 0: any free port (see Server::bind)
  std::string api_key;             // non-empty: /v1/* and /tokenize need "Bearer <key>"
  std::string model_name;          // the id clients send as "model"
  std::string model_dir;           // shown as "root" in /v1/models
  size_t max_body_bytes = 4u << 20;  // larger bodies (any transfer encoding) -> 413
  int threads = 512;               // handler threads at most (>= concurrent streams); idle ones exit
  int64_t max_concurrent = 0;      // generations held at once; 0 = no limit
  bool reject_overload = true;     // over max_concurrent: 429 (true) or queue in the engine (false)
  double health_stall_s = 60.0;    // /health says 503 when queued work sees no step this long
  double keep_alive_timeout_s = 75.0;  // idle keep-alive connections close after this long
                                       // (announced as Keep-Alive: timeout=N; pooled clients
                                       // reuse connections after gaps of seconds)
  double request_timeout_s = 60.0;     // a request must arrive completely within this long
  double shutdown_timeout_s = 30.0;    // graceful shutdown: running requests finish this long
  bool access_log = false;             // one line per response on stderr
  ServerDefaults defaults;
};

class Server {
 public:
  Server(Engine& engine, const tok::Tokenizer& tok, tok::PromptFormat format, ServerOptions o);
  ~Server();
  int bind();   // binds host:port exclusively, returns the port; dil::Error if it cannot
  void run();   // serves until stop() or the end of a graceful shutdown
  void stop();  // at once: running requests lose their connections
  // Graceful: from now on new requests get 503 and /health is not ready; running requests
  // finish for up to shutdown_timeout_s, the rest are aborted (finish_reason "abort"), then
  // run() returns. Idempotent, returns at once; safe from any thread.
  void shutdown();

  struct Core;  // shared by the route files (server_core.h)

 private:
  std::unique_ptr<Core> core_;
};

}  // namespace dil::server
