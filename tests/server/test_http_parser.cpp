// The HTTP/1.x request parser: framing, limits enforced while reading, pipelining, and the
// errors that make the server answer and close.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "server/http_parser.h"
#include "server/worker_pool.h"

namespace dil::server::http {
namespace {

using State = RequestParser::State;

ParseLimits small_limits() {
  ParseLimits l;
  l.max_body_bytes = 100;
  l.max_header_bytes = 512;
  l.max_target_bytes = 64;
  l.max_headers = 8;
  return l;
}

struct Fed {
  State state;
  size_t used;
  int status;
  std::string message;
};

Fed feed_all(RequestParser& p, const std::string& s) {
  const size_t used = p.feed(s.data(), s.size());
  return {p.state(), used, p.error_status(), p.error_message()};
}

int status_of(const std::string& s, ParseLimits l = small_limits()) {
  RequestParser p(l);
  const Fed f = feed_all(p, s);
  return f.state == State::Error ? f.status : f.state == State::Done ? 200 : 0;
}

TEST(HttpParser, SimpleGetAndPost) {
  RequestParser p(small_limits());
  const std::string get = "GET /health?x=1 HTTP/1.1\r\nHost: a\r\nX-Thing:  v  \r\n\r\n";
  Fed f = feed_all(p, get);
  ASSERT_EQ(f.state, State::Done);
  EXPECT_EQ(f.used, get.size());
  Request r = p.take();
  EXPECT_EQ(r.method, "GET");
  EXPECT_EQ(r.path, "/health");
  EXPECT_EQ(r.query, "x=1");
  EXPECT_EQ(r.minor, 1);
  EXPECT_EQ(r.get_header_value("x-thing"), "v");
  EXPECT_EQ(p.state(), State::Idle);

  f = feed_all(p, "POST /v1/completions HTTP/1.0\r\nContent-Length: 5\r\n\r\nhello");
  ASSERT_EQ(f.state, State::Done);
  r = p.take();
  EXPECT_EQ(r.minor, 0);
  EXPECT_EQ(r.body, "hello");
}

TEST(HttpParser, PipelinedRequestsStopAtEachEnd) {
  const std::string a = "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc";
  const std::string b = "GET /b HTTP/1.1\r\nHost: h\r\n\r\n";
  const std::string both = a + b;
  RequestParser p(small_limits());
  size_t used = p.feed(both.data(), both.size());
  ASSERT_EQ(p.state(), State::Done);
  EXPECT_EQ(used, a.size());  // the next request's bytes stay with the caller
  EXPECT_EQ(p.take().body, "abc");
  used += p.feed(both.data() + used, both.size() - used);
  ASSERT_EQ(p.state(), State::Done);
  EXPECT_EQ(used, both.size());
  EXPECT_EQ(p.take().path, "/b");
}

TEST(HttpParser, ByteByByteEqualsWhole) {
  const std::string s =
      "\r\nPOST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
      "3;ext=1\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\nTrailer-Field: t\r\n\r\n";
  RequestParser p(small_limits());
  for (size_t i = 0; i < s.size(); ++i) {
    ASSERT_NE(p.state(), State::Error) << i << " " << p.error_message();
    ASSERT_NE(p.state(), State::Done) << i;
    EXPECT_EQ(p.feed(s.data() + i, 1), 1u);
  }
  ASSERT_EQ(p.state(), State::Done) << p.error_message();
  const Request r = p.take();
  EXPECT_EQ(r.body, "abc0123456789abcdef");
  EXPECT_FALSE(r.has_header("Trailer-Field"));  // trailers are checked and dropped
}

TEST(HttpParser, BareLfLineEndsAreAccepted) {
  EXPECT_EQ(status_of("GET / HTTP/1.1\nHost: h\n\n"), 200);
}

TEST(HttpParser, ContentLengthIsValidatedBeforeTheBody) {
  const std::string head = "POST / HTTP/1.1\r\nHost: h\r\n";
  EXPECT_EQ(status_of(head + "Content-Length: -1\r\n\r\n"), 400);
  EXPECT_EQ(status_of(head + "Content-Length: abc\r\n\r\n"), 400);
  EXPECT_EQ(status_of(head + "Content-Length: +5\r\n\r\n"), 400);
  EXPECT_EQ(status_of(head + "Content-Length: 1 2\r\n\r\n"), 400);
  EXPECT_EQ(status_of(head + "Content-Length: ,\r\n\r\n"), 400);
  EXPECT_EQ(status_of(head + "Content-Length:\r\n\r\n"), 400);
  EXPECT_EQ(status_of(head + "Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"), 400);
  EXPECT_EQ(status_of(head + "Content-Length: 99999999999999999999999\r\n\r\n"), 400);
  // Larger than the limit: 413 with no body byte sent.
  EXPECT_EQ(status_of(head + "Content-Length: 101\r\n\r\n"), 413);
  EXPECT_EQ(status_of(head + "Content-Length: 9223372036854775807\r\n\r\n"), 413);
  // Equal duplicates are one length (RFC 9110 §8.6).
  EXPECT_EQ(status_of(head + "Content-Length: 3, 3\r\nContent-Length: 003\r\n\r\nabc"), 200);
  EXPECT_EQ(status_of(head + "Content-Length: 100\r\n\r\n" + std::string(100, 'x')), 200);
}

TEST(HttpParser, ChunkedBodiesHaveTheSameLimitWhileReading) {
  const std::string head = "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n";
  // A chunk that would pass the limit is refused at its size line, before its data.
  RequestParser p(small_limits());
  Fed f = feed_all(p, head + "65\r\n");
  EXPECT_EQ(f.state, State::Error);
  EXPECT_EQ(f.status, 413);
  // Many small chunks: refused as soon as the total passes the limit.
  std::string many = head;
  for (int i = 0; i < 60; ++i) many += "2\r\nab\r\n";
  RequestParser q(small_limits());
  f = feed_all(q, many);
  EXPECT_EQ(f.status, 413);
  EXPECT_LT(f.used, many.size());
  EXPECT_EQ(status_of(head + "64\r\n" + std::string(100, 'x') + "\r\n0\r\n\r\n"), 200);
  EXPECT_EQ(status_of(head + "ffffffffffffffffffff\r\n"), 413);
  EXPECT_EQ(status_of(head + "zz\r\n"), 400);
  EXPECT_EQ(status_of(head + "3\r\nabcd\r\n"), 400);  // data longer than its size
  EXPECT_EQ(status_of(head + "3 ;e\r\nabc\r\n0\r\n\r\n"), 200);
}

TEST(HttpParser, TransferEncodingRules) {
  const std::string head = "POST / HTTP/1.1\r\nHost: h\r\n";
  EXPECT_EQ(status_of(head + "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"), 400);
  EXPECT_EQ(status_of(head + "Transfer-Encoding: gzip\r\n\r\n"), 501);
  EXPECT_EQ(status_of(head + "Transfer-Encoding: gzip, chunked\r\n\r\n"), 501);
  EXPECT_EQ(status_of(head + "Transfer-Encoding: chunked, chunked\r\n\r\n"), 400);
  EXPECT_EQ(status_of(head + "Transfer-Encoding: Chunked\r\n\r\n0\r\n\r\n"), 200);
  EXPECT_EQ(status_of("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"), 400);
}

TEST(HttpParser, RequestLineAndHeaderErrors) {
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\n\r\n"), 400);                         // no Host
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"), 400);  // two Hosts
  EXPECT_EQ(status_of("GET / HTTP/1.0\r\n\r\n"), 200);                         // 1.0 needs none
  EXPECT_EQ(status_of("GET / HTTP/2.0\r\nHost: h\r\n\r\n"), 505);
  EXPECT_EQ(status_of("GET / HTTP/1.9\r\nHost: h\r\n\r\n"), 200);
  EXPECT_EQ(status_of("GET / http/1.1\r\nHost: h\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET  / HTTP/1.1\r\nHost: h\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET x HTTP/1.1\r\nHost: h\r\n\r\n"), 400);
  EXPECT_EQ(status_of("G(T / HTTP/1.1\r\nHost: h\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET /" + std::string(100, 'a') + " HTTP/1.1\r\nHost: h\r\n\r\n"), 414);
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost: h\r\n folded\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost : h\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost: h\rx\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost: h\r\nX: " + std::string(600, 'v') + "\r\n\r\n"), 431);
  std::string many = "GET / HTTP/1.1\r\nHost: h\r\n";
  for (int i = 0; i < 9; ++i) many += "X" + std::to_string(i) + ": 1\r\n";
  EXPECT_EQ(status_of(many + "\r\n"), 431);
  EXPECT_EQ(status_of("POST / HTTP/1.1\r\nHost: h\r\nExpect: 200-ok\r\n\r\n"), 417);
  EXPECT_EQ(status_of(std::string(600, '\n')), 400);
}

TEST(HttpParser, HeaderBlockLimitHoldsBeforeItsEnd) {
  // 431 while the headers are still arriving: no unbounded buffer for a never-ending line.
  RequestParser p(small_limits());
  const Fed f = feed_all(p, "GET / HTTP/1.1\r\nX: " + std::string(1000, 'v'));
  EXPECT_EQ(f.state, State::Error);
  EXPECT_EQ(f.status, 431);
}

TEST(HttpParser, AbsoluteFormAndExpectContinue) {
  RequestParser p(small_limits());
  ASSERT_EQ(feed_all(p, "GET http://example.com:80/v1/models?a HTTP/1.1\r\nHost: h\r\n\r\n").state, State::Done);
  Request r = p.take();
  EXPECT_EQ(r.path, "/v1/models");
  EXPECT_EQ(r.query, "a");
  ASSERT_EQ(feed_all(p, "GET http://example.com HTTP/1.1\r\nHost: h\r\n\r\n").state, State::Done);
  EXPECT_EQ(p.take().path, "/");
  feed_all(p, "POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n");
  EXPECT_TRUE(p.wants_continue());
  p.expect_continue_sent();
  EXPECT_FALSE(p.wants_continue());
  ASSERT_EQ(feed_all(p, "ok").state, State::Done);
  EXPECT_EQ(p.take().body, "ok");
}

TEST(WorkerPool, GrowsToTheBoundAndShrinksWhenIdle) {
  WorkerPool pool(4, 1, std::chrono::milliseconds(100));
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::atomic<int> ran{0};
  for (int i = 0; i < 10; ++i)
    pool.submit([&] {
      std::unique_lock<std::mutex> l(mu);
      cv.wait(l, [&] { return release; });
      ++ran;
    });
  for (int i = 0; i < 100 && pool.queued() > 6; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(pool.threads(), 4);  // bounded: the other 6 wait in order
  EXPECT_EQ(pool.queued(), 6u);
  {
    std::lock_guard<std::mutex> l(mu);
    release = true;
  }
  cv.notify_all();
  for (int i = 0; i < 200 && (ran < 10 || pool.threads() > 1); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(ran, 10);
  EXPECT_EQ(pool.threads(), 1);  // idle threads left, down to keep_idle
  pool.submit([&] { ++ran; });
  for (int i = 0; i < 100 && ran < 11; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(ran, 11);
}

}  // namespace
}  // namespace dil::server::http
