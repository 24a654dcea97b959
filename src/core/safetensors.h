// Memory-mapped safetensors reader: one file, or a sharded checkpoint through
// `model.safetensors.index.json`. Every header is validated against its file (offsets inside
// the data section, byte counts matching dtype x shape, no overlaps) and every problem is a
// dil::Error naming the tensor and the file.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace dil {

struct StEntry {
  std::string name;
  std::string file;  // path of the shard that holds it
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // inside the mapping
  size_t nbytes = 0;

  int64_t numel() const;
  // A CPU view; dims beyond Tensor::kMaxDims are not used by any V4 tensor.
  Tensor tensor() const;
};

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws dil::Error
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

class SafeTensors {
 public:
  // `path` is a .safetensors file or a folder holding model.safetensors(.index.json).
  static SafeTensors open(const std::string& path);
  const StEntry* find(const std::string& name) const;
  const StEntry& at(const std::string& name) const;  // throws naming the tensor
  const std::map<std::string, StEntry>& entries() const { return entries_; }
  size_t total_bytes() const;
  // Registers a tensor held in memory (dummy checkpoints for benchmarks and tests).
  void add_owned(const std::string& name, DType dtype, std::vector<int64_t> shape, Buffer data);

 private:
  void add_file(const std::string& file);
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::vector<Buffer> owned_;
  std::map<std::string, StEntry> entries_;
};

// Writes tensors (F32/I32/...) to a safetensors file; used by tools and tests.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors);

}  // namespace dil
