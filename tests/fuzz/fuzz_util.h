// Shared by the libFuzzer targets: cheap deterministic choices drawn from the input's tail, so
// one input both carries the data and steers how it is fed (chunk sizes, modes).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dil::fuzz {

class Choices {
 public:
  Choices(const uint8_t* data, size_t n) : data_(data), n_(n) {}
  // Takes one byte from the end (0 when exhausted); the rest stays the payload.
  uint8_t byte() { return n_ ? data_[--n_] : 0; }
  std::string_view rest() const { return {reinterpret_cast<const char*>(data_), n_}; }

 private:
  const uint8_t* data_;
  size_t n_;
};

// The repository root, for the bundled tokenizer (set by CMake).
inline std::string source_dir() { return DIL_SOURCE_DIR; }

}  // namespace dil::fuzz
