// The HTTP/1.1 connection layer: one event-loop thread (epoll) owns every connection while it
// is idle or being read; a complete request goes to a WorkerPool thread, which runs the
// handler and writes the response (a stream holds its thread while it streams), then hands
// the connection back. So an idle keep-alive connection costs a few hundred bytes, not a
// thread, and a slow client costs nothing until its request is complete.
//
// Why not cpp-httplib (0.11.4, Debian) any more: it runs each connection's whole keep-alive
// life on a pool thread that polls every ~11 ms, builds a fresh 4 KiB-buffered stream per
// request (bytes of a pipelined request that arrived with the previous one are dropped),
// treats a half-closed client as gone before it writes the response, reads chunked bodies
// without a limit, times out each read but never a whole request, and sets SO_REUSEPORT.
// None of that can be changed through its hooks. docs/architecture.md has the details.
//
// Behaviour (RFC 9112): persistent connections and pipelining (requests answered in order);
// a client that half-closes after sending gets its responses, then the connection closes;
// HTTP/1.0 requests get close-delimited, unchunked responses and the connection closes after
// each; a request with broken framing gets its 4xx with `Connection: close`. Every response
// on a kept connection announces `Keep-Alive: timeout=<idle_timeout_s>`.
#pragma once
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "server/http_message.h"
#include "server/http_parser.h"
#include "server/worker_pool.h"

namespace dil::server::http {

struct HttpConfig {
  std::string host = "127.0.0.1";
  int port = 8000;                 // 0: any free port
  ParseLimits limits;
  double idle_timeout_s = 75;      // keep-alive: an idle connection is closed after this long
  double request_timeout_s = 60;   // first byte of a request to its last: longer -> 408
  double write_timeout_s = 30;     // a response write that makes no progress this long fails
  double linger_s = 5;             // after an error response: input drained this long, so the
                                   // client reads the response instead of a reset
  int max_connections = 16384;     // open connections; more are answered 503 and closed
  int max_workers = 512;           // requests handled at once (a stream holds one)
  int keep_idle_workers = 4;       // idle handler threads kept beyond worker_idle_s
  double worker_idle_s = 10;
};

class HttpServer {
 public:
  using Handler = std::function<void(const Request&, Response&)>;
  // Runs before routing; returns true when it answered the request (auth, shutdown).
  using PreRouting = std::function<bool(const Request&, Response&)>;
  // Fills an error response (status set, body empty) with the API's error body.
  using ErrorBody = std::function<void(int status, const std::string& message, Response&)>;
  // After each response: `req` is empty for requests that never parsed.
  using Logger = std::function<void(const Request& req, const Response& res, size_t body_bytes, double seconds)>;

  explicit HttpServer(HttpConfig c);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  void get(const std::string& path, Handler h);   // also answers HEAD
  void post(const std::string& path, Handler h);
  void set_pre_routing(PreRouting f) { pre_routing_ = std::move(f); }
  void set_error_body(ErrorBody f) { error_body_ = std::move(f); }
  void set_logger(Logger f) { logger_ = std::move(f); }

  // Binds and listens (exclusive: no SO_REUSEPORT, so a second server on the port fails here
  // instead of sharing its traffic). Returns the port. dil::Error when it cannot.
  int bind();
  void run();   // the event loop, until stop(); returns when no handler holds a connection
  void stop();  // thread-safe; handlers still running get `stop_grace_s` to finish their writes

  int open_connections() const { return n_conns_.load(); }
  int worker_threads() const { return pool_.threads(); }
  const HttpConfig& config() const { return cfg_; }

  struct Conn;  // http_server.cpp

 private:
  friend struct Loop;
  void handle(Conn* c, Request req);  // on a worker thread
  void dispatch(Request& req, Response& res);
  void give_back(Conn* c);            // worker -> loop

  HttpConfig cfg_;
  std::map<std::string, Handler> get_, post_;
  PreRouting pre_routing_;
  ErrorBody error_body_;
  Logger logger_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<int> n_conns_{0};
  std::mutex back_mu_;
  std::vector<Conn*> back_;  // connections handed back by workers
  WorkerPool pool_;
};

// Serialises a response head (status line + headers + blank line). `keep_alive_s` < 0: the
// connection closes after this response. `chunked`: Transfer-Encoding: chunked;
// `content_length` < 0: none (close-delimited). Exposed for tests.
std::string response_head(const Response& res, int minor, bool chunked, long long content_length,
                          double keep_alive_s);

}  // namespace dil::server::http
