#include "core/tensor.h"

#include <cstdlib>
#include <cstring>

namespace dil {

std::string Tensor::shape_str() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

Buffer host_alloc(size_t bytes) {
  size_t n = (bytes + 63) / 64 * 64;
  if (n == 0) n = 64;
  void* p = std::aligned_alloc(64, n);
  DIL_CHECK(p, "host allocation of ", bytes, " bytes failed");
  std::memset(p, 0, n);
  return Buffer(p, bytes, Device::CPU, [](void* q) { std::free(q); });
}

}  // namespace dil
