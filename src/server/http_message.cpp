#include "server/http_message.h"

namespace dil::server::http {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = char(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = char(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

bool Request::has_header(std::string_view name) const {
  for (const auto& h : headers)
    if (iequals(h.first, name)) return true;
  return false;
}

std::string Request::get_header_value(std::string_view name) const {
  for (const auto& h : headers)
    if (iequals(h.first, name)) return h.second;
  return "";
}

void Response::set_header(std::string name, std::string value) {
  for (auto& h : headers)
    if (iequals(h.first, name)) {
      h.second = std::move(value);
      return;
    }
  headers.emplace_back(std::move(name), std::move(value));
}

bool Response::has_header(std::string_view name) const {
  for (const auto& h : headers)
    if (iequals(h.first, name)) return true;
  return false;
}

void Response::set_content(std::string b, std::string type) {
  body = std::move(b);
  content_type = std::move(type);
  if (status < 0) status = 200;
}

void Response::set_chunked_content_provider(std::string type, ContentProvider p, ContentReleaser r) {
  content_type = std::move(type);
  provider = std::move(p);
  releaser = std::move(r);
  if (status < 0) status = 200;
}

const char* reason_phrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 417: return "Expectation Failed";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return status < 400 ? "OK" : status < 500 ? "Client Error" : "Server Error";
  }
}

}  // namespace dil::server::http
