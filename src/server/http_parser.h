// Incremental HTTP/1.x request parser (RFC 9112) with the server's limits built in: no
// sockets, no threads, so it is unit-tested and fuzzed on its own (tests/server,
// tests/fuzz). Feed it bytes as they arrive; it stops at the end of one request, so bytes of a
// pipelined next request stay with the caller.
//
// Limits are enforced while reading: a header block over max_header_bytes is 431 before its
// end arrives; a Content-Length over max_body_bytes is 413 before any body byte is read; a
// chunked body is 413 as soon as its decoded size passes max_body_bytes. Every error leaves
// the parser in Error: the connection's framing is unknown from then on, so the server
// answers and closes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "server/http_message.h"

namespace dil::server::http {

struct ParseLimits {
  size_t max_body_bytes = 4u << 20;      // decoded body, any transfer encoding
  size_t max_header_bytes = 64u << 10;   // request line + header lines (and trailers)
  size_t max_target_bytes = 8u << 10;    // request-target: longer -> 414
  size_t max_headers = 128;              // header fields (and trailer fields)
};

class RequestParser {
 public:
  enum class State { Idle, Headers, Body, Done, Error };

  explicit RequestParser(ParseLimits limits) : lim_(limits) {}

  // Consumes bytes of the current request from data[0, n) and returns how many it used
  // (fewer than n once the request is complete or an error occurred).
  size_t feed(const char* data, size_t n);
  State state() const { return state_; }
  bool started() const { return state_ != State::Idle; }   // some byte of a request arrived
  bool headers_complete() const { return state_ == State::Body || state_ == State::Done; }
  // The client sent `Expect: 100-continue` and the body has not started: the server sends
  // "100 Continue" once (expect_continue_sent) before it waits for the body.
  bool wants_continue() const { return expect_continue_ && state_ == State::Body && body_bytes_ == 0; }
  void expect_continue_sent() { expect_continue_ = false; }

  int error_status() const { return error_status_; }
  const std::string& error_message() const { return error_message_; }

  Request take();  // the complete request (state Done); the parser is Idle again

 private:
  enum class Body { None, Length, Chunked };
  enum class Chunk { Size, Data, DataEnd, Trailer };

  size_t feed_line(const char* data, size_t n, bool* line_done);
  bool on_request_line(std::string_view line);
  bool on_header_line(std::string_view line);
  bool on_headers_end();
  bool on_chunk_line(std::string_view line);
  void fail(int status, std::string message);

  ParseLimits lim_;
  State state_ = State::Idle;
  Request req_;
  std::string line_;           // the line being assembled (no CRLF)
  size_t header_bytes_ = 0;    // header block bytes so far (incl. line ends)
  size_t n_fields_ = 0;
  Body body_ = Body::None;
  Chunk chunk_ = Chunk::Size;
  uint64_t remaining_ = 0;     // of the Content-Length body or the current chunk
  size_t body_bytes_ = 0;      // decoded body bytes so far
  bool expect_continue_ = false;
  int error_status_ = 0;
  std::string error_message_;
};

}  // namespace dil::server::http
