// The OpenAI-compatible HTTP server: /v1/chat/completions, /v1/completions, /v1/models,
// /health, /metrics, /tokenize, /detokenize. HTTP/1.1 keep-alive via cpp-httplib, one pool
// thread per open connection (a stream holds its thread for its whole life, so the pool is
// sized for the number of concurrent streams).
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
  size_t max_body_bytes = 4u << 20;  // larger bodies -> 413
  int threads = 512;               // connection threads (>= concurrent streams + idle keep-alives)
  int64_t max_concurrent = 0;      // generations held at once; 0 = no limit
  bool reject_overload = true;     // over max_concurrent: 429 (true) or queue in the engine (false)
  double health_stall_s = 60.0;    // /health says 503 when queued work sees no step this long
  ServerDefaults defaults;
};

class Server {
 public:
  Server(Engine& engine, const tok::Tokenizer& tok, tok::PromptFormat format, ServerOptions o);
  ~Server();
  int bind();   // binds host:port, returns the port; dil::Error if it cannot
  void run();   // serves until stop()
  void stop();

  struct Core;  // shared by the route files (server_core.h)

 private:
  std::unique_ptr<Core> core_;
};

}  // namespace dil::server
