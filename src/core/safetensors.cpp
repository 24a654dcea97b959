#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace dil {

namespace fs = std::filesystem;
using json = nlohmann::json;

int64_t StEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Tensor StEntry::tensor() const {
  Tensor t;
  t.data = const_cast<uint8_t*>(data);
  t.dtype = dtype;
  t.device = Device::CPU;
  DIL_CHECK(shape.size() <= size_t(Tensor::kMaxDims), name, ": too many dims");
  t.ndim = int(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
  return t;
}

MappedFile::MappedFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) DIL_FAIL("cannot open ", path, ": ", std::strerror(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    DIL_FAIL("cannot stat ", path);
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      DIL_FAIL("cannot map ", path, ": ", std::strerror(errno));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

SafeTensors SafeTensors::open(const std::string& path) {
  SafeTensors st;
  fs::path p(path);
  if (fs::is_directory(p)) {
    fs::path index = p / "model.safetensors.index.json";
    if (fs::exists(index)) {
      json j;
      try {
        std::ifstream in(index);
        j = json::parse(in);
      } catch (const std::exception& e) {
        DIL_FAIL(index.string(), ": invalid JSON: ", e.what());
      }
      if (!j.contains("weight_map") || !j["weight_map"].is_object())
        DIL_FAIL(index.string(), ": no weight_map object");
      std::vector<std::string> shards;
      std::map<std::string, std::string> expect;
      for (auto& [name, file] : j["weight_map"].items()) {
        if (!file.is_string()) DIL_FAIL(index.string(), ": weight_map entry ", name, " is not a string");
        expect[name] = file.get<std::string>();
        if (std::find(shards.begin(), shards.end(), expect[name]) == shards.end()) shards.push_back(expect[name]);
      }
      for (const auto& s : shards) st.add_file((p / s).string());
      for (const auto& [name, file] : expect) {
        auto it = st.entries_.find(name);
        if (it == st.entries_.end())
          DIL_FAIL("tensor ", name, " is listed in ", index.string(), " under ", file, " but that shard does not hold it");
        if (fs::path(it->second.file).filename() != fs::path(file).filename())
          DIL_FAIL("tensor ", name, " is listed under ", file, " but found in ", it->second.file);
      }
      return st;
    }
    p = p / "model.safetensors";
  }
  st.add_file(p.string());
  return st;
}

void SafeTensors::add_file(const std::string& file) {
  auto mf = std::make_unique<MappedFile>(file);
  const uint8_t* base = mf->data();
  size_t size = mf->size();
  if (size < 8) DIL_FAIL(file, ": file is ", size, " bytes, shorter than the 8-byte header length");
  uint64_t hlen;
  std::memcpy(&hlen, base, 8);
  if (hlen > size - 8) DIL_FAIL(file, ": header length ", hlen, " exceeds the file size ", size);
  json hdr;
  try {
    hdr = json::parse(base + 8, base + 8 + hlen);
  } catch (const std::exception& e) {
    DIL_FAIL(file, ": header is not valid JSON: ", e.what());
  }
  if (!hdr.is_object()) DIL_FAIL(file, ": header is not a JSON object");
  const uint8_t* data = base + 8 + hlen;
  size_t data_size = size - 8 - hlen;
  std::vector<std::pair<size_t, size_t>> spans;
  for (auto& [name, info] : hdr.items()) {
    if (name == "__metadata__") continue;
    const std::string& tensor = name;  // clang 14 cannot capture a structured binding
    auto bad = [&](const std::string& why) { DIL_FAIL("tensor ", tensor, " in ", file, ": ", why); };
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") || !info.contains("data_offsets"))
      bad("header entry lacks dtype/shape/data_offsets");
    StEntry e;
    e.name = name;
    e.file = file;
    if (!info["dtype"].is_string() || !dtype_from_name(info["dtype"].get<std::string>(), &e.dtype))
      bad("unknown dtype " + info["dtype"].dump());
    if (!info["shape"].is_array()) bad("shape is not an array");
    for (auto& d : info["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) bad("shape has a bad dimension " + d.dump());
      e.shape.push_back(d.get<int64_t>());
    }
    auto& off = info["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      bad("data_offsets must be two unsigned integers");
    size_t a = off[0].get<size_t>(), b = off[1].get<size_t>();
    if (b < a) bad("data_offsets are reversed");
    if (b > data_size)
      bad(str_cat("data ends at byte ", b, " but the file's data section has only ", data_size,
                  " bytes (truncated file?)"));
    size_t want = size_t(e.numel()) * dtype_size(e.dtype);
    if (b - a != want) bad(str_cat("holds ", b - a, " bytes but ", dtype_name(e.dtype), " x shape needs ", want));
    e.data = data + a;
    e.nbytes = b - a;
    spans.emplace_back(a, b);
    if (entries_.count(name)) bad("appears in two shards");
    entries_.emplace(name, std::move(e));
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].first < spans[i - 1].second && spans[i].second > spans[i].first)
      DIL_FAIL(file, ": two tensors overlap in the data section");
  files_.push_back(std::move(mf));
}

const StEntry* SafeTensors::find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

const StEntry& SafeTensors::at(const std::string& name) const {
  const StEntry* e = find(name);
  if (!e) DIL_FAIL("missing tensor ", name);
  return *e;
}

void SafeTensors::add_owned(const std::string& name, DType dtype, std::vector<int64_t> shape, Buffer data) {
  StEntry e;
  e.name = name;
  e.file = "<memory>";
  e.dtype = dtype;
  e.shape = std::move(shape);
  e.nbytes = size_t(e.numel()) * dtype_size(dtype);
  DIL_CHECK(data.bytes() >= e.nbytes, name, ": buffer too small");
  e.data = static_cast<const uint8_t*>(data.data());
  owned_.push_back(std::move(data));
  entries_[name] = std::move(e);
}

size_t SafeTensors::total_bytes() const {
  size_t n = 0;
  for (const auto& [k, e] : entries_) n += e.nbytes;
  return n;
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors) {
  json hdr = json::object();
  size_t off = 0;
  for (const auto& [name, t] : tensors) {
    json shape = json::array();
    for (int i = 0; i < t.ndim; ++i) shape.push_back(t.shape[i]);
    hdr[name] = {{"dtype", std::string(dtype_name(t.dtype))}, {"shape", shape}, {"data_offsets", {off, off + t.nbytes()}}};
    off += t.nbytes();
  }
  std::string h = hdr.dump();
  while (h.size() % 8) h += ' ';
  std::ofstream out(path, std::ios::binary);
  if (!out) DIL_FAIL("cannot write ", path);
  uint64_t n = h.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(h.data(), std::streamsize(h.size()));
  for (const auto& [name, t] : tensors) out.write(static_cast<const char*>(t.data), std::streamsize(t.nbytes()));
}

}  // namespace dil
