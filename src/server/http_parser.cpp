#include "server/http_parser.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "core/check.h"

namespace dil::server::http {
namespace {

constexpr size_t kMaxChunkLine = 1024;  // chunk size + extensions

// tchar of RFC 9110 §5.6.2.
bool is_tchar(unsigned char c) {
  if (c >= '0' && c <= '9') return true;
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return true;
  return std::strchr("!#$%&'*+-.^_`|~", c) != nullptr && c != 0;
}

bool is_token(std::string_view s) {
  if (s.empty()) return false;
  for (unsigned char c : s)
    if (!is_tchar(c)) return false;
  return true;
}

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string lower(std::string_view s) {
  std::string o(s);
  for (char& c : o)
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  return o;
}

// Calls f(item) for each comma-separated list element, trimmed (empty elements skipped, as
// RFC 9110 §5.6.1 asks recipients to).
template <typename F>
bool each_list_item(std::string_view v, F f) {
  while (true) {
    const size_t comma = v.find(',');
    const std::string_view item = trim_ows(v.substr(0, comma));
    if (!item.empty() && !f(item)) return false;
    if (comma == std::string_view::npos) return true;
    v.remove_prefix(comma + 1);
  }
}

}  // namespace

void RequestParser::fail(int status, std::string message) {
  state_ = State::Error;
  error_status_ = status;
  error_message_ = std::move(message);
}

Request RequestParser::take() {
  DIL_CHECK(state_ == State::Done, "take() before the request is complete");
  Request r = std::move(req_);
  *this = RequestParser(lim_);
  return r;
}

// Appends bytes up to and including '\n' to line_ (without the line end); *line_done when the
// line ended. Enforces the length limits of the line being read.
size_t RequestParser::feed_line(const char* data, size_t n, bool* line_done) {
  const void* nl = std::memchr(data, '\n', n);
  const size_t take = nl ? size_t(static_cast<const char*>(nl) - data) + 1 : n;
  const bool in_header_block = state_ == State::Headers || (body_ == Body::Chunked && chunk_ == Chunk::Trailer);
  if (in_header_block) header_bytes_ += take;
  line_.append(data, nl ? take - 1 : take);
  *line_done = nl != nullptr;
  const bool request_line = state_ == State::Headers && req_.method.empty();
  if (request_line && line_.size() > lim_.max_target_bytes + 64) {
    fail(414, str_cat("request line longer than ", lim_.max_target_bytes + 64, " bytes"));
  } else if (in_header_block && header_bytes_ > lim_.max_header_bytes) {
    fail(431, str_cat("request header block larger than ", lim_.max_header_bytes, " bytes"));
  } else if (state_ == State::Body && chunk_ != Chunk::Trailer && line_.size() > kMaxChunkLine) {
    fail(400, "chunk size line too long");
  }
  if (*line_done && !line_.empty() && line_.back() == '\r') line_.pop_back();
  return take;
}

size_t RequestParser::feed(const char* data, size_t n) {
  size_t i = 0;
  while (i < n && state_ != State::Done && state_ != State::Error) {
    if (state_ == State::Idle) {
      // RFC 9112 §2.2: ignore empty lines before a request line (some clients send a CRLF
      // after a POST body). They count against the header budget so they cannot go on forever.
      if (data[i] == '\r' || data[i] == '\n') {
        if (++header_bytes_ > lim_.max_header_bytes) fail(400, "too many empty lines before the request line");
        ++i;
        continue;
      }
      state_ = State::Headers;
      header_bytes_ = 0;
    }
    const bool body_bytes = state_ == State::Body && ((body_ == Body::Length) || chunk_ == Chunk::Data);
    if (body_bytes) {
      const size_t k = size_t(std::min<uint64_t>(remaining_, n - i));
      req_.body.append(data + i, k);
      body_bytes_ += k;
      remaining_ -= k;
      i += k;
      if (remaining_ == 0) {
        if (body_ == Body::Length) state_ = State::Done;
        else chunk_ = Chunk::DataEnd;
      }
      continue;
    }
    bool done = false;
    i += feed_line(data + i, n - i, &done);
    if (!done || state_ == State::Error) continue;
    std::string line = std::move(line_);
    line_.clear();
    if (state_ == State::Headers) {
      if (req_.method.empty()) {
        on_request_line(line);
      } else if (line.empty()) {
        on_headers_end();
      } else {
        on_header_line(line);
      }
    } else {
      on_chunk_line(line);
    }
  }
  return i;
}

bool RequestParser::on_request_line(std::string_view line) {
  const size_t a = line.find(' ');
  const size_t b = a == std::string_view::npos ? a : line.find(' ', a + 1);
  if (b == std::string_view::npos || line.find(' ', b + 1) != std::string_view::npos) {
    fail(400, "malformed request line (expected METHOD SP TARGET SP HTTP-VERSION)");
    return false;
  }
  const std::string_view method = line.substr(0, a), target = line.substr(a + 1, b - a - 1),
                         version = line.substr(b + 1);
  if (!is_token(method) || method.size() > 32) {
    fail(400, "malformed request method");
    return false;
  }
  if (target.size() > lim_.max_target_bytes) {
    fail(414, str_cat("request target longer than ", lim_.max_target_bytes, " bytes"));
    return false;
  }
  for (unsigned char c : target)
    if (c <= 0x20 || c == 0x7f || c == '#') {
      fail(400, "request target contains a control character, a space or '#'");
      return false;
    }
  if (version.size() != 8 || version.substr(0, 5) != "HTTP/" || version[6] != '.' || version[5] < '0' ||
      version[5] > '9' || version[7] < '0' || version[7] > '9') {
    fail(400, "malformed HTTP version");
    return false;
  }
  if (version[5] != '1') {
    fail(505, "only HTTP/1.0 and HTTP/1.1 are supported");
    return false;
  }
  req_.minor = version[7] == '0' ? 0 : 1;  // 1.x with x > 1 is served as 1.1 (RFC 9110 §2.5)
  req_.method = std::string(method);
  req_.target = std::string(target);
  std::string_view path = target;
  if (path.size() > 7 && (lower(path.substr(0, 7)) == "http://" || lower(path.substr(0, 8)) == "https://")) {
    // absolute-form (RFC 9112 §3.2.2): the path starts after the authority.
    path.remove_prefix(path.find("//") + 2);
    const size_t slash = path.find_first_of("/?");
    path = slash == std::string_view::npos ? std::string_view("/") : path.substr(slash);
    req_.path = path.front() == '?' ? "/" : "";
  } else if (path == "*") {
    if (method != "OPTIONS") {
      fail(400, "request target '*' is only valid for OPTIONS");
      return false;
    }
  } else if (path.empty() || path.front() != '/') {
    fail(400, "request target must start with '/'");
    return false;
  }
  const size_t q = path.find('?');
  req_.path += std::string(path.substr(0, q));
  if (q != std::string_view::npos) req_.query = std::string(path.substr(q + 1));
  return true;
}

bool RequestParser::on_header_line(std::string_view line) {
  if (line.front() == ' ' || line.front() == '\t') {
    fail(400, "obsolete header line folding is not accepted");
    return false;
  }
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos || !is_token(line.substr(0, colon))) {
    fail(400, "malformed header field (expected name: value, no space before the colon)");
    return false;
  }
  const std::string_view value = trim_ows(line.substr(colon + 1));
  for (unsigned char c : value)
    if ((c < 0x20 && c != '\t') || c == 0x7f) {
      fail(400, "header value contains a control character");
      return false;
    }
  if (++n_fields_ > lim_.max_headers) {
    fail(431, str_cat("more than ", lim_.max_headers, " header fields"));
    return false;
  }
  if (state_ == State::Headers) req_.headers.emplace_back(std::string(line.substr(0, colon)), std::string(value));
  return true;  // trailer fields are checked and dropped
}

bool RequestParser::on_headers_end() {
  int hosts = 0;
  bool has_te = false, has_cl = false;
  std::string te;
  std::string cl;
  for (const auto& [name, value] : req_.headers) {
    if (iequals(name, "Host")) ++hosts;
    if (iequals(name, "Transfer-Encoding")) {
      te += (has_te ? "," : "") + value;
      has_te = true;
    }
    if (iequals(name, "Content-Length")) {
      // Several fields or a list are only valid when every value is the same (RFC 9110 §8.6).
      bool any = false;
      const bool ok = each_list_item(value, [&](std::string_view v) {
        any = true;
        if (v.size() > 19 || !std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; }))
          return false;
        std::string_view digits = v;
        while (digits.size() > 1 && digits.front() == '0') digits.remove_prefix(1);
        if (has_cl && digits != cl) return false;
        cl = std::string(digits);
        has_cl = true;
        return true;
      });
      if (!ok || !any) {
        fail(400, "invalid Content-Length '" + value + "' (expected one non-negative decimal integer)");
        return false;
      }
    }
    if (iequals(name, "Expect")) {
      if (!iequals(value, "100-continue")) {
        fail(417, "only 'Expect: 100-continue' is supported");
        return false;
      }
      expect_continue_ = req_.minor == 1;
    }
  }
  if (req_.minor == 1 && hosts != 1) {
    fail(400, hosts == 0 ? "HTTP/1.1 request without a Host header" : "more than one Host header");
    return false;
  }
  if (has_te) {
    // Both framings at once is how requests are smuggled past proxies (RFC 9112 §6.1).
    if (has_cl) {
      fail(400, "both Transfer-Encoding and Content-Length");
      return false;
    }
    if (req_.minor == 0) {
      fail(400, "Transfer-Encoding in an HTTP/1.0 request");
      return false;
    }
    std::vector<std::string> codings;
    each_list_item(te, [&](std::string_view c) {
      codings.push_back(lower(c));
      return true;
    });
    if (codings.empty() || codings.back() != "chunked") {
      fail(codings.empty() ? 400 : 501, "Transfer-Encoding '" + te + "' is not supported (only chunked)");
      return false;
    }
    if (codings.size() > 1) {
      fail(codings[0] == "chunked" ? 400 : 501, "Transfer-Encoding '" + te + "' is not supported (only chunked)");
      return false;
    }
    body_ = Body::Chunked;
    chunk_ = Chunk::Size;
    state_ = State::Body;
    return true;
  }
  const uint64_t len = has_cl ? std::stoull(cl) : 0;  // at most 19 digits: fits
  if (len > lim_.max_body_bytes) {
    fail(413, str_cat("request body of ", len, " bytes is larger than the limit of ", lim_.max_body_bytes, " bytes"));
    return false;
  }
  if (len == 0) {
    state_ = State::Done;
    return true;
  }
  body_ = Body::Length;
  remaining_ = len;
  req_.body.reserve(size_t(len));
  state_ = State::Body;
  return true;
}

bool RequestParser::on_chunk_line(std::string_view line) {
  switch (chunk_) {
    case Chunk::Size: {
      size_t k = 0;
      uint64_t size = 0;
      while (k < line.size() && std::isxdigit(static_cast<unsigned char>(line[k]))) {
        if (k >= 15) {  // >= 2^60: larger than any limit
          fail(413, str_cat("chunked request body larger than the limit of ", lim_.max_body_bytes, " bytes"));
          return false;
        }
        const char c = line[k];
        size = size * 16 + uint64_t(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
        ++k;
      }
      std::string_view rest = line.substr(k);
      while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t')) rest.remove_prefix(1);
      if (k == 0 || (!rest.empty() && rest.front() != ';')) {
        fail(400, "malformed chunk size line");
        return false;
      }
      if (size > lim_.max_body_bytes - body_bytes_) {
        fail(413, str_cat("chunked request body larger than the limit of ", lim_.max_body_bytes, " bytes"));
        return false;
      }
      if (size == 0) {
        chunk_ = Chunk::Trailer;
      } else {
        remaining_ = size;
        chunk_ = Chunk::Data;
      }
      return true;
    }
    case Chunk::DataEnd:
      if (!line.empty()) {
        fail(400, "chunk data longer than its size");
        return false;
      }
      chunk_ = Chunk::Size;
      return true;
    case Chunk::Trailer:
      if (line.empty()) {
        state_ = State::Done;
        return true;
      }
      return on_header_line(line);
    case Chunk::Data: break;
  }
  DIL_CHECK(false, "chunk line in the data state");
  return false;
}

}  // namespace dil::server::http
