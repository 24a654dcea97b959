// Tensor: a non-owning, row-major view of device or host memory. Shapes are written in
// comments next to every use, e.g. `// [n_tokens, n_heads, head_dim] f32`.
// Buffer: owned memory, released through the deleter of whoever allocated it (a backend).
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>

#include "core/check.h"
#include "core/dtype.h"

namespace dil {

enum class Device : uint8_t { CPU, CUDA };

struct Tensor {
  static constexpr int kMaxDims = 4;
  void* data = nullptr;
  DType dtype = DType::F32;
  Device device = Device::CPU;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};

  Tensor() = default;
  Tensor(void* d, DType t, std::initializer_list<int64_t> dims, Device dev = Device::CPU)
      : data(d), dtype(t), device(dev) {
    DIL_CHECK(dims.size() <= kMaxDims, "too many dims");
    for (int64_t v : dims) shape[ndim++] = v;
  }
  bool empty() const { return data == nullptr; }
  int64_t size(int i) const { return shape[i < 0 ? i + ndim : i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  template <typename T> T* ptr() const { return static_cast<T*>(data); }
  // Same memory, new shape (element count must match).
  Tensor view(std::initializer_list<int64_t> dims) const {
    Tensor t(data, dtype, dims, device);
    DIL_CHECK(t.numel() == numel(), "view: element count ", t.numel(), " != ", numel());
    return t;
  }
  // Rows [begin, end) of the first dimension.
  Tensor rows(int64_t begin, int64_t end) const {
    DIL_CHECK(ndim >= 1 && begin >= 0 && end <= shape[0] && begin <= end, "rows out of range");
    Tensor t = *this;
    int64_t row = numel() / (shape[0] ? shape[0] : 1);
    t.data = static_cast<char*>(data) + size_t(begin * row) * dtype_size(dtype);
    t.shape[0] = end - begin;
    return t;
  }
  std::string shape_str() const;
};

// Owned allocation. The deleter belongs to the allocator (host malloc, cudaFree, arena).
class Buffer {
 public:
  Buffer() = default;
  Buffer(void* p, size_t n, Device dev, std::function<void(void*)> del)
      : ptr_(p), bytes_(n), device_(dev), del_(std::move(del)) {}
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = o.ptr_; bytes_ = o.bytes_; device_ = o.device_; del_ = std::move(o.del_);
      o.ptr_ = nullptr; o.bytes_ = 0;
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }
  void reset() {
    if (ptr_ && del_) del_(ptr_);
    ptr_ = nullptr; bytes_ = 0;
  }
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  Tensor as(DType t, std::initializer_list<int64_t> dims) const {
    Tensor v(ptr_, t, dims, device_);
    DIL_CHECK(v.nbytes() <= bytes_, "buffer too small: ", v.nbytes(), " > ", bytes_);
    return v;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  Device device_ = Device::CPU;
  std::function<void(void*)> del_;
};

Buffer host_alloc(size_t bytes);  // 64-byte aligned, zero-filled

}  // namespace dil
