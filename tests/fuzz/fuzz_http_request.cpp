// The request path a client controls: bytes on a connection -> the HTTP parser (fed in
// input-chosen chunks, pipelined requests included) -> the JSON body -> OpenAI validation and
// mapping for the endpoint the request line names -> the prompt encoder for chat requests.
// Everything a client can send must end in a request or an ApiError, never a crash.
#include <cstdint>
#include <string>

#include "core/check.h"
#include "fuzz_util.h"
#include "server/http_parser.h"
#include "server/protocol.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace dil;
using namespace dil::server;

void map_body(const std::string& path, const std::string& body, tok::PromptFormat f) {
  try {
    const Json j = parse_body(body);
    ServerDefaults d;
    d.format = f;
    if (path == "/v1/completions") {
      (void)parse_completion_request(j, 1024);
      return;
    }
    const ChatRequest r = parse_chat_request(j, d, 1024);
    (void)tok::render_chat(f, r.messages, r.chat);
  } catch (const ApiError& e) {
    DIL_CHECK(e.status >= 400 && e.status < 500, "status ", e.status, ": ", e.message);
  } catch (const dil::Error&) {
    // The encoder's own checks (the server answers 400 param messages).
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Choices ch(data, size);
  const uint8_t mode = ch.byte();
  const tok::PromptFormat f = (mode & 1) ? tok::PromptFormat::V41 : tok::PromptFormat::V4;
  if (mode & 2) {
    // The input is a JSON body for the chat or completions endpoint.
    map_body((mode & 4) ? "/v1/completions" : "/v1/chat/completions", std::string(ch.rest()), f);
    return 0;
  }
  http::ParseLimits lim;
  lim.max_body_bytes = 1 << 16;
  lim.max_header_bytes = 1 << 12;
  lim.max_target_bytes = 1 << 10;
  http::RequestParser p(lim);
  const uint8_t step = ch.byte();
  const std::string_view in = ch.rest();
  size_t i = 0;
  while (i < in.size()) {
    const size_t n = std::min<size_t>(in.size() - i, size_t(step % 64) + 1);
    size_t used = 0;
    while (used < n) {
      const size_t k = p.feed(in.data() + i + used, n - used);
      DIL_CHECK(k <= n - used, "parser consumed more than it was given");
      used += k;
      if (p.state() == http::RequestParser::State::Error) {
        DIL_CHECK(p.error_status() >= 400 && p.error_status() < 600, "error status ", p.error_status());
        return 0;  // the server answers and closes
      }
      if (p.state() == http::RequestParser::State::Done) {
        const http::Request r = p.take();
        DIL_CHECK(r.body.size() <= lim.max_body_bytes, "body over the limit");
        map_body(r.path, r.body, f);
      } else if (k == 0) {
        break;
      }
    }
    i += n;
  }
  return 0;
}
