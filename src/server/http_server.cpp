#include "server/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <unordered_map>

#include "core/check.h"

namespace dil::server::http {

using Clock = std::chrono::steady_clock;

namespace {

constexpr uint64_t kListenTag = ~uint64_t(0);
constexpr uint64_t kWakeTag = ~uint64_t(0) - 1;
constexpr size_t kReadChunk = 64u << 10;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string peer_name(const sockaddr_storage& a) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (a.ss_family == AF_INET) {
    const auto* s = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &s->sin_addr, host, sizeof host);
    port = ntohs(s->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* s = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &s->sin6_addr, host, sizeof host);
    port = ntohs(s->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

// Writes all of data[0, n) to a non-blocking socket, waiting for room up to `timeout_s` at a
// time (a peer that reads nothing for that long is given up).
bool write_all(int fd, const char* data, size_t n, double timeout_s) {
  while (n > 0) {
    const ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
    if (w > 0) {
      data += w;
      n -= size_t(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      const int r = ::poll(&p, 1, int(timeout_s * 1000));
      if (r > 0 && !(p.revents & (POLLERR | POLLHUP | POLLNVAL))) continue;
      if (r < 0 && errno == EINTR) continue;
    }
    return false;
  }
  return true;
}

std::string http_date() {
  char buf[64];
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, "%a, %d %b %Y %H:%M:%S GMT", &tm);
  return buf;
}

bool wants_close(const Request& r) {
  for (const auto& [name, value] : r.headers) {
    if (!iequals(name, "Connection")) continue;
    size_t i = 0;
    while (i <= value.size()) {
      size_t j = value.find(',', i);
      if (j == std::string::npos) j = value.size();
      std::string_view tok(value.data() + i, j - i);
      while (!tok.empty() && (tok.front() == ' ' || tok.front() == '\t')) tok.remove_prefix(1);
      while (!tok.empty() && (tok.back() == ' ' || tok.back() == '\t')) tok.remove_suffix(1);
      if (iequals(tok, "close")) return true;
      i = j + 1;
    }
  }
  return false;
}

}  // namespace

std::string response_head(const Response& res, int minor, bool chunked, long long content_length,
                          double keep_alive_s) {
  std::string h = "HTTP/1.1 " + std::to_string(res.status) + " " + reason_phrase(res.status) + "\r\n";
  h += "Date: " + http_date() + "\r\n";
  if (!res.content_type.empty()) h += "Content-Type: " + res.content_type + "\r\n";
  for (const auto& [name, value] : res.headers) {
    if (iequals(name, "Content-Length") || iequals(name, "Transfer-Encoding") || iequals(name, "Connection") ||
        iequals(name, "Keep-Alive"))
      continue;  // framing is the server's
    h += name + ": " + value + "\r\n";
  }
  if (chunked) h += "Transfer-Encoding: chunked\r\n";
  else if (content_length >= 0) h += "Content-Length: " + std::to_string(content_length) + "\r\n";
  if (keep_alive_s >= 0) {
    // HTTP/1.1 keeps connections by default; saying so (and for how long) lets pooled
    // clients drop a connection before the server does instead of racing its close.
    h += "Connection: keep-alive\r\nKeep-Alive: timeout=" + std::to_string(int(keep_alive_s)) + "\r\n";
  } else {
    h += "Connection: close\r\n";
  }
  (void)minor;
  h += "\r\n";
  return h;
}

struct HttpServer::Conn {
  enum class St { Reading, Busy, Lingering };
  uint64_t id = 0;
  int fd = -1;
  std::string peer;
  RequestParser parser;
  std::string in;  // read, not yet parsed: the start of a pipelined request
  St st = St::Reading;
  Clock::time_point idle_since = Clock::now(), request_start, linger_until;
  bool eof = false;          // the peer shut down its sending side
  bool close_after = false;  // set by the worker: do not read another request
  bool write_failed = false;
  bool watched = false;      // registered with epoll (loop thread only)
  bool dead = false;         // closed; erased at the end of the loop iteration
  explicit Conn(const ParseLimits& l) : parser(l) {}
};

namespace {

// The link a handler polls while it computes the response (before anything is written).
class SocketLink final : public ClientLink {
 public:
  SocketLink(int fd, bool http11) : fd_(fd), http11_(http11) {}
  bool gone() override {
    if (gone_) return true;
    pollfd p{fd_, POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return gone_ = true;
    if (!(p.revents & POLLRDHUP)) return false;
    // The client shut down its sending side: it closed (gone) or half-closed (still reads).
    // Only a write tells them apart, and the only bytes HTTP allows before the final response
    // are interim 1xx responses, which HTTP/1.1 clients must skip (RFC 9110 §15.2): a closed
    // socket answers one with a reset. HTTP/1.0 clients get no 1xx; their EOF means gone.
    if (!http11_) return gone_ = true;
    const auto now = Clock::now();
    if (now - last_probe_ < std::chrono::seconds(1)) return false;
    last_probe_ = now;
    static constexpr char kProbe[] = "HTTP/1.1 100 Continue\r\n\r\n";
    if (::send(fd_, kProbe, sizeof kProbe - 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN) return gone_ = true;
    // A reset comes back within a round trip; wait a little for it so that the common case
    // (a client that closed) is known now rather than a second later.
    pollfd q{fd_, 0, 0};  // no events asked: returns on error/hang-up only, or after 20 ms
    if (::poll(&q, 1, 20) > 0 && (q.revents & (POLLERR | POLLHUP))) return gone_ = true;
    return false;
  }

 private:
  int fd_;
  bool http11_;
  bool gone_ = false;
  Clock::time_point last_probe_{};
};

class SocketSink final : public DataSink {
 public:
  SocketSink(int fd, bool chunked, double timeout_s) : fd_(fd), chunked_(chunked), timeout_s_(timeout_s) {}
  bool write(const char* data, size_t n) override {
    if (failed_) return false;
    if (n == 0) return true;
    bool ok;
    if (chunked_) {
      char size[32];
      const int k = std::snprintf(size, sizeof size, "%zx\r\n", n);
      std::string frame;
      frame.reserve(size_t(k) + n + 2);
      frame.append(size, size_t(k)).append(data, n).append("\r\n");
      ok = write_all(fd_, frame.data(), frame.size(), timeout_s_);
    } else {
      ok = write_all(fd_, data, n, timeout_s_);
    }
    if (ok) bytes_ += n;
    failed_ = !ok;
    return ok;
  }
  void done() override { done_ = true; }
  bool peer_shut_down() override {
    pollfd p{fd_, POLLRDHUP, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
  }
  bool is_done() const { return done_; }
  bool failed() const { return failed_; }
  size_t bytes() const { return bytes_; }

 private:
  int fd_;
  bool chunked_;
  double timeout_s_;
  bool done_ = false, failed_ = false;
  size_t bytes_ = 0;
};

}  // namespace

// The event loop's state (one thread; workers only touch a Conn while it is Busy).
struct Loop {
  explicit Loop(HttpServer& server) : s(server), cfg(server.cfg_) {}
  HttpServer& s;
  const HttpConfig& cfg;
  std::unordered_map<uint64_t, std::unique_ptr<HttpServer::Conn>> conns;
  uint64_t next_id = 1;
  int busy = 0;
  int reserve_fd = -1;  // spare descriptor, freed to accept-and-close when out of descriptors
  bool listening = true;

  using Conn = HttpServer::Conn;

  std::vector<uint64_t> graveyard;  // closed this iteration: callers may still hold the pointer

  void close_conn(Conn* c) {
    if (c->dead) return;
    unwatch(c);
    ::close(c->fd);
    c->dead = true;
    --s.n_conns_;
    graveyard.push_back(c->id);
  }

  void bury() {
    for (uint64_t id : graveyard) conns.erase(id);
    graveyard.clear();
  }

  void watch(Conn* c) {
    if (c->watched) return;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = c->id;
    ::epoll_ctl(s.epoll_fd_, EPOLL_CTL_ADD, c->fd, &ev);
    c->watched = true;
  }

  void unwatch(Conn* c) {
    if (!c->watched) return;
    ::epoll_ctl(s.epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
    c->watched = false;
  }

  // A response the loop writes itself (framing errors, timeouts, overload): best effort,
  // never blocking, then the connection closes after draining what the client still sends.
  void answer_and_linger(Conn* c, int status, const std::string& message) {
    Response res;
    res.status = status;
    if (s.error_body_) s.error_body_(status, message, res);
    const std::string out = response_head(res, 1, false, (long long)res.body.size(), -1) + res.body;
    (void)::send(c->fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (s.logger_) s.logger_(Request{}, res, res.body.size(), 0.0);
    linger(c);
  }

  // Closes our sending side and reads (discarding) until the client closes or linger_s
  // passes: closing with unread input would make the kernel send a reset, which can destroy
  // the response before the client reads it.
  void linger(Conn* c) {
    ::shutdown(c->fd, SHUT_WR);
    c->st = Conn::St::Lingering;
    c->linger_until = Clock::now() + std::chrono::milliseconds(int64_t(cfg.linger_s * 1000));
    c->in.clear();
    if (c->eof) close_conn(c);
    else watch(c);
  }

  void accept_all() {
    for (;;) {
      sockaddr_storage addr{};
      socklen_t len = sizeof addr;
      const int fd = ::accept4(s.listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if ((errno == EMFILE || errno == ENFILE) && reserve_fd >= 0) {
          // Out of descriptors: the pending connection would keep the listener readable
          // forever. Accept it with the spare descriptor and close it at once.
          ::close(reserve_fd);
          const int x = ::accept4(s.listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
          if (x >= 0) ::close(x);
          reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
          continue;
        }
        return;  // EAGAIN: no more pending
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      auto c = std::make_unique<Conn>(cfg.limits);
      c->id = next_id++;
      c->fd = fd;
      c->peer = peer_name(addr);
      Conn* p = c.get();
      conns.emplace(p->id, std::move(c));
      ++s.n_conns_;
      watch(p);
      if (s.n_conns_ > cfg.max_connections) answer_and_linger(p, 503, "too many open connections");
    }
  }

  void on_readable(Conn* c) {
    char buf[kReadChunk];
    const ssize_t r = ::recv(c->fd, buf, sizeof buf, 0);
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      close_conn(c);
      return;
    }
    if (c->st == Conn::St::Lingering) {
      if (r == 0) close_conn(c);  // discard: the client has its response
      return;
    }
    if (r == 0) {
      c->eof = true;
      unwatch(c);  // nothing more to read
      process(c);
      if (!c->dead && c->st == Conn::St::Reading) {
        if (c->parser.started()) answer_and_linger(c, 400, "the connection ended inside a request");
        else close_conn(c);
      }
      return;
    }
    c->in.append(buf, size_t(r));
    process(c);
  }

  // Parses buffered input: dispatches a complete request, answers a broken one.
  void process(Conn* c) {
    while (c->st == Conn::St::Reading && !c->in.empty()) {
      const bool was_started = c->parser.started();
      const size_t used = c->parser.feed(c->in.data(), c->in.size());
      c->in.erase(0, used);
      if (!was_started && c->parser.started()) c->request_start = Clock::now();
      switch (c->parser.state()) {
        case RequestParser::State::Error:
          answer_and_linger(c, c->parser.error_status(), c->parser.error_message());
          return;
        case RequestParser::State::Done: start(c); return;
        default: break;
      }
    }
    if (c->st == Conn::St::Reading && c->parser.wants_continue()) {
      static constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
      (void)::send(c->fd, kContinue, sizeof kContinue - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      c->parser.expect_continue_sent();
    }
  }

  void start(Conn* c) {
    Request req = c->parser.take();
    req.remote = c->peer;
    c->st = Conn::St::Busy;
    ++busy;
    unwatch(c);
    if (c->in.capacity() > kReadChunk && c->in.empty()) std::string().swap(c->in);
    s.pool_.submit([this, c, r = std::move(req)]() mutable { s.handle(c, std::move(r)); });
  }

  void on_back(Conn* c) {
    --busy;
    if (c->write_failed) {
      close_conn(c);
      return;
    }
    if (c->close_after || s.stopping_) {
      linger(c);
      return;
    }
    c->st = Conn::St::Reading;
    c->idle_since = Clock::now();
    if (!c->eof) watch(c);
    process(c);  // a pipelined request may be complete already
    if (!c->dead && c->st == Conn::St::Reading && c->eof) {
      // Half-closed: every request it sent is answered.
      if (c->parser.started()) answer_and_linger(c, 400, "the connection ended inside a request");
      else close_conn(c);
    }
  }

  void sweep() {
    const auto now = Clock::now();
    std::vector<Conn*> expired_idle, expired_req, expired_linger;
    for (auto& [id, c] : conns) {
      if (c->dead) continue;
      if (c->st == Conn::St::Reading) {
        if (c->parser.started()) {
          if (std::chrono::duration<double>(now - c->request_start).count() > cfg.request_timeout_s)
            expired_req.push_back(c.get());
        } else if (std::chrono::duration<double>(now - c->idle_since).count() > cfg.idle_timeout_s) {
          expired_idle.push_back(c.get());
        }
      } else if (c->st == Conn::St::Lingering && now > c->linger_until) {
        expired_linger.push_back(c.get());
      }
    }
    for (Conn* c : expired_idle) close_conn(c);
    for (Conn* c : expired_linger) close_conn(c);
    for (Conn* c : expired_req)
      answer_and_linger(c, 408, str_cat("the request was not complete within ", cfg.request_timeout_s, " s"));
  }

  void stop_listening() {
    if (!listening) return;
    listening = false;
    ::epoll_ctl(s.epoll_fd_, EPOLL_CTL_DEL, s.listen_fd_, nullptr);
    ::close(s.listen_fd_);
    s.listen_fd_ = -1;
    std::vector<Conn*> idle;
    for (auto& [id, c] : conns)
      if (!c->dead && c->st != Conn::St::Busy) idle.push_back(c.get());
    for (Conn* c : idle) close_conn(c);
  }
};

HttpServer::HttpServer(HttpConfig c)
    : cfg_(std::move(c)),
      pool_(cfg_.max_workers, cfg_.keep_idle_workers,
            std::chrono::milliseconds(int64_t(cfg_.worker_idle_s * 1000))) {}

HttpServer::~HttpServer() {
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void HttpServer::get(const std::string& path, Handler h) { get_[path] = std::move(h); }
void HttpServer::post(const std::string& path, Handler h) { post_[path] = std::move(h); }

int HttpServer::bind() {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(cfg_.port);
  if (const int e = ::getaddrinfo(cfg_.host.empty() ? nullptr : cfg_.host.c_str(), port.c_str(), &hints, &res))
    DIL_FAIL("cannot listen on ", cfg_.host, ":", cfg_.port, ": ", gai_strerror(e));
  std::string why = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    // SO_REUSEADDR only lets the port be reused while old connections sit in TIME_WAIT; two
    // listeners still cannot share it (that would take SO_REUSEPORT, which is never set).
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 4096) == 0) {
      listen_fd_ = fd;
      break;
    }
    why = errno == EADDRINUSE ? "the address is already in use (is another server running on this port?)"
                              : std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (listen_fd_ < 0) DIL_FAIL("cannot listen on ", cfg_.host, ":", cfg_.port, ": ", why);
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
  const int bound = a.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port)
                                            : ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  DIL_CHECK(epoll_fd_ >= 0 && wake_fd_ >= 0, "epoll/eventfd: ", std::strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenTag;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  ev.data.u64 = kWakeTag;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  return bound;
}

void HttpServer::stop() {
  stopping_ = true;
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof one);
  }
}

void HttpServer::give_back(Conn* c) {
  {
    std::lock_guard<std::mutex> l(back_mu_);
    back_.push_back(c);
  }
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
}

void HttpServer::run() {
  DIL_CHECK(epoll_fd_ >= 0, "HttpServer::run() before bind()");
  Loop loop(*this);
  loop.reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  std::vector<epoll_event> events(256);
  auto last_sweep = Clock::now();
  Clock::time_point stop_deadline{};
  bool forced = false;
  for (;;) {
    const int n = ::epoll_wait(epoll_fd_, events.data(), int(events.size()), 200);
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[size_t(i)].data.u64;
      if (tag == kListenTag) {
        loop.accept_all();
      } else if (tag == kWakeTag) {
        uint64_t v;
        (void)!::read(wake_fd_, &v, sizeof v);
        std::vector<Conn*> back;
        {
          std::lock_guard<std::mutex> l(back_mu_);
          back.swap(back_);
        }
        for (Conn* c : back) loop.on_back(c);
      } else if (auto it = loop.conns.find(tag);
                 it != loop.conns.end() && !it->second->dead && it->second->st != Conn::St::Busy) {
        loop.on_readable(it->second.get());
      }
    }
    loop.bury();
    if (seconds_since(last_sweep) > 0.2) {
      loop.sweep();
      loop.bury();
      last_sweep = Clock::now();
    }
    if (stopping_) {
      if (loop.listening) {
        loop.stop_listening();
        loop.bury();
        stop_deadline = Clock::now() + std::chrono::seconds(5);
      }
      if (loop.busy == 0) break;
      if (!forced && Clock::now() > stop_deadline) {
        // Handlers still writing after the grace period: make their writes fail.
        for (auto& [id, c] : loop.conns)
          if (c->st == Conn::St::Busy) ::shutdown(c->fd, SHUT_RDWR);
        forced = true;
      }
    }
  }
  std::vector<Conn*> rest;
  for (auto& [id, c] : loop.conns) rest.push_back(c.get());
  for (Conn* c : rest) loop.close_conn(c);
  loop.bury();
  if (loop.reserve_fd >= 0) ::close(loop.reserve_fd);
}

void HttpServer::dispatch(Request& req, Response& res) {
  if (pre_routing_ && pre_routing_(req, res)) return;
  const bool head = req.method == "HEAD";
  const auto& table = req.method == "GET" || head ? get_ : post_;
  const bool known_method = head || req.method == "GET" || req.method == "POST";
  if (known_method) {
    if (auto it = table.find(req.path); it != table.end()) {
      it->second(req, res);
      if (res.status < 0) res.status = 200;
      return;
    }
  }
  const bool other = get_.count(req.path) || post_.count(req.path);
  if (other) {
    res.status = 405;
    res.set_header("Allow", get_.count(req.path) ? "GET, HEAD" : "POST");
  } else {
    res.status = 404;
  }
}

void HttpServer::handle(Conn* c, Request req) {
  const auto t0 = Clock::now();
  SocketLink link(c->fd, req.minor == 1);
  req.link = &link;
  Response res;
  try {
    dispatch(req, res);
  } catch (const std::exception& e) {
    res = Response{};
    res.status = 500;
    if (error_body_) error_body_(500, std::string("internal error: ") + e.what(), res);
  }
  if (res.status < 0) res.status = 500;
  if (res.status >= 400 && res.body.empty() && !res.provider && error_body_)
    error_body_(res.status, reason_phrase(res.status), res);
  req.link = nullptr;

  const bool keep = !res.close && !stopping_ && req.minor == 1 && !wants_close(req);
  const bool head = req.method == "HEAD";
  const double ka = keep ? cfg_.idle_timeout_s : -1;
  bool ok;
  size_t bytes = 0;
  if (res.provider && !head) {
    // HTTP/1.0 has no chunked coding: the body ends when the connection does.
    const bool chunked = req.minor == 1;
    const std::string h = response_head(res, req.minor, chunked, -1, chunked ? ka : -1);
    ok = write_all(c->fd, h.data(), h.size(), cfg_.write_timeout_s);
    SocketSink sink(c->fd, chunked, cfg_.write_timeout_s);
    size_t offset = 0;
    while (ok && !sink.is_done()) {
      if (!res.provider(offset, sink) || sink.failed()) ok = false;
      offset = sink.bytes();
    }
    if (ok && chunked) ok = write_all(c->fd, "0\r\n\r\n", 5, cfg_.write_timeout_s);
    bytes = sink.bytes();
    if (res.releaser) res.releaser(ok);
    if (!chunked) c->close_after = true;
  } else {
    if (res.releaser) res.releaser(true);
    std::string out = response_head(res, req.minor, false, (long long)res.body.size(), ka);
    if (!head) out += res.body;
    ok = write_all(c->fd, out.data(), out.size(), cfg_.write_timeout_s);
    bytes = head ? 0 : res.body.size();
  }
  if (logger_) logger_(req, res, bytes, seconds_since(t0));
  c->write_failed = !ok;
  c->close_after = c->close_after || !keep;
  give_back(c);
}

}  // namespace dil::server::http
