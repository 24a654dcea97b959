// Invariant checks and user-facing errors.
// DIL_CHECK aborts with file:line for broken invariants (programming errors).
// dil::Error is thrown for user errors (bad checkpoint, bad arguments) and caught at the
// boundaries (CLI, server) where it becomes a message or an HTTP 4xx.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>

namespace dil {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

namespace detail {
inline void concat(std::ostringstream&) {}
template <typename T, typename... R>
void concat(std::ostringstream& os, const T& v, const R&... rest) {
  os << v;
  concat(os, rest...);
}
}  // namespace detail

template <typename... A>
std::string str_cat(const A&... a) {
  std::ostringstream os;
  detail::concat(os, a...);
  return os.str();
}

[[noreturn]] inline void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  std::fprintf(stderr, "%s:%d: check failed: %s %s\n", file, line, cond, msg.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace dil

#define DIL_CHECK(cond, ...)                                                                  \
  do {                                                                                        \
    if (!(cond)) ::dil::check_failed(__FILE__, __LINE__, #cond, ::dil::str_cat(__VA_ARGS__)); \
  } while (0)

#define DIL_FAIL(...) throw ::dil::Error(::dil::str_cat(__VA_ARGS__))
