#include "kernels/cuda/arena.h"

#include <algorithm>

#include "kernels/cuda/common.cuh"

namespace dil::cuda {

Arena::~Arena() {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [sz, p] : free_) cudaFree(p);  // best effort at teardown; errors are moot here
  free_.clear();
}

// Small blocks round to 512 B, large ones to 2 MiB, so that step-to-step sizes that differ a
// little still reuse the same blocks.
size_t Arena::round_size(size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (bytes < (size_t(1) << 20)) return (bytes + 511) & ~size_t(511);
  return (bytes + (size_t(2) << 20) - 1) & ~((size_t(2) << 20) - 1);
}

void Arena::release_cached() {
  for (auto& [sz, p] : free_) {
    DIL_CUDA(cudaFree(p));
    reserved_ -= sz;
  }
  free_.clear();
  cached_ = 0;
}

Buffer Arena::get(size_t bytes) {
  size_t rounded = round_size(bytes);
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu_);
    // Exact size first; for large blocks accept up to 1/8 waste.
    auto it = free_.lower_bound(rounded);
    if (it != free_.end() && it->first <= rounded + rounded / 8) {
      p = it->second;
      rounded = it->first;
      cached_ -= rounded;
      free_.erase(it);
    }
    if (!p) {
      DIL_CUDA(cudaSetDevice(device_));
      cudaError_t e = cudaMalloc(&p, rounded);
      if (e != cudaSuccess) {
        cudaGetLastError();  // clear the sticky-free error state of a failed cudaMalloc
        DIL_CUDA(cudaDeviceSynchronize());  // out of memory: only place we wait, then retry
        release_cached();
        DIL_CUDA(cudaMalloc(&p, rounded));
      }
      reserved_ += rounded;
    }
    in_use_ += rounded;
    peak_ = std::max(peak_, in_use_);
  }
  std::weak_ptr<Arena> self = weak_from_this();
  return Buffer(p, bytes, Device::CUDA, [self, rounded](void* q) {
    if (auto a = self.lock()) a->put(q, rounded);
    else cudaFree(q);
  });
}

void Arena::put(void* p, size_t rounded) {
  std::lock_guard<std::mutex> lk(mu_);
  free_.emplace(rounded, p);
  cached_ += rounded;
  in_use_ -= rounded;
}

size_t Arena::bytes_in_use() const {
  std::lock_guard<std::mutex> lk(mu_);
  return in_use_;
}

size_t Arena::bytes_cached() const {
  std::lock_guard<std::mutex> lk(mu_);
  return cached_;
}

size_t Arena::peak_in_use() const {
  std::lock_guard<std::mutex> lk(mu_);
  return peak_;
}

void Arena::reset_peak() {
  std::lock_guard<std::mutex> lk(mu_);
  peak_ = in_use_;
}

}  // namespace dil::cuda
