// HTTP/1.1 messages as the route handlers see them (src/server/http_server.h serves them).
// The names follow cpp-httplib's (has_header, get_header_value, set_content,
// set_chunked_content_provider, DataSink), which the server used before it had its own
// connection layer, so handlers read the same.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dil::server::http {

using Header = std::pair<std::string, std::string>;  // name as sent, value without surrounding OWS

bool iequals(std::string_view a, std::string_view b);  // ASCII case-insensitive

// What a long-running handler can ask about its connection while the response is not written.
class ClientLink {
 public:
  virtual ~ClientLink() = default;
  // True once the client has certainly gone (reset, or closed without reading). Cheap: a
  // poll() with no wait; call it once per engine step.
  virtual bool gone() = 0;
};

struct Request {
  std::string method;   // as sent (case-sensitive, RFC 9110 §9.1)
  std::string target;   // request-target as sent
  std::string path;     // target without the query; absolute-form targets reduced to the path
  std::string query;    // after '?', undecoded
  int minor = 1;        // HTTP/1.<minor>: 0 or 1
  std::vector<Header> headers;
  std::string body;     // de-chunked
  std::string remote;   // "ip:port" of the peer
  ClientLink* link = nullptr;  // set by the server for the handler's lifetime

  bool has_header(std::string_view name) const;
  std::string get_header_value(std::string_view name) const;  // first value, "" if absent
  bool client_gone() const { return link && link->gone(); }
};

// The writer a streaming response's provider writes through.
class DataSink {
 public:
  virtual ~DataSink() = default;
  virtual bool write(const char* data, size_t n) = 0;  // false: the client is gone
  virtual void done() = 0;                             // the response is complete
  // The client shut down its sending side (it may still read: half-close). A provider that has
  // nothing to write can send an SSE comment then, which a closed socket answers with a reset.
  virtual bool peer_shut_down() = 0;
};

// Called until it calls sink.done() or returns false (abort: the connection is closed).
using ContentProvider = std::function<bool(size_t offset, DataSink& sink)>;
// Called once after the last provider call: success = done() was reached and every write went out.
using ContentReleaser = std::function<void(bool success)>;

struct Response {
  int status = -1;  // -1: no handler set one (the server answers 404 or 500)
  std::vector<Header> headers;
  std::string body;
  std::string content_type;
  ContentProvider provider;   // set: a streamed body (chunked on HTTP/1.1, close-delimited on 1.0)
  ContentReleaser releaser;
  bool close = false;         // close the connection after this response

  void set_header(std::string name, std::string value);
  bool has_header(std::string_view name) const;
  void set_content(std::string b, std::string type);
  void set_chunked_content_provider(std::string type, ContentProvider p, ContentReleaser r = nullptr);
};

const char* reason_phrase(int status);

}  // namespace dil::server::http
