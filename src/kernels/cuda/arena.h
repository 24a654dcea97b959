// The one device allocator of a CUDA backend: a caching arena. Freed blocks go back to a
// per-size free list and are reused; cudaMalloc is called only on a miss, cudaFree only
// when a miss fails (then every cached block is released and the allocation retried) and at
// destruction. All work runs on one stream, so a block freed after its last use was
// enqueued can be handed out again at once: later work on the stream is ordered after it.
#pragma once
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/tensor.h"

namespace dil::cuda {

class Arena : public std::enable_shared_from_this<Arena> {
 public:
  explicit Arena(int device) : device_(device) {}
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Uninitialised device memory of at least `bytes`, 256-byte aligned; owned by the Buffer.
  Buffer get(size_t bytes);
  size_t bytes_reserved() const { return reserved_; }
  // Bytes handed out and not yet given back (rounded sizes), now and at most since
  // reset_peak(); bytes cached in the free lists (reserved, unused). For KV cache sizing: the
  // peak over a profiling step is the scratch a step needs.
  size_t bytes_in_use() const;
  size_t bytes_cached() const;
  size_t peak_in_use() const;
  void reset_peak();

 private:
  static size_t round_size(size_t bytes);
  void put(void* p, size_t rounded);
  void release_cached();

  int device_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;  // rounded size -> block
  size_t reserved_ = 0;
  size_t cached_ = 0;  // sum of free_'s sizes
  size_t in_use_ = 0, peak_ = 0;
};

}  // namespace dil::cuda
