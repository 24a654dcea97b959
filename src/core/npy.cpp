#include "core/npy.h"

#include <cstring>
#include <fstream>

#include "core/check.h"

namespace dil {

void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    dict += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
    if (i + 1 < shape.size()) dict += " ";
    n *= shape[i];
  }
  dict += "), }";
  size_t total = 10 + dict.size() + 1;
  dict += std::string((64 - total % 64) % 64, ' ') + "\n";
  std::ofstream out(path, std::ios::binary);
  if (!out) DIL_FAIL("cannot write ", path);
  out.write("\x93NUMPY\x01\x00", 8);
  uint16_t hl = uint16_t(dict.size());
  out.write(reinterpret_cast<const char*>(&hl), 2);
  out.write(dict.data(), std::streamsize(dict.size()));
  out.write(reinterpret_cast<const char*>(data), std::streamsize(n * 4));
}

std::vector<float> read_npy_f32(const std::string& path, std::vector<int64_t>* shape) {
  std::ifstream in(path, std::ios::binary);
  if (!in) DIL_FAIL("cannot read ", path);
  char magic[8];
  in.read(magic, 8);
  if (std::memcmp(magic, "\x93NUMPY", 6) != 0) DIL_FAIL(path, ": not a .npy file");
  uint16_t hl;
  in.read(reinterpret_cast<char*>(&hl), 2);
  std::string dict(hl, ' ');
  in.read(dict.data(), hl);
  if (dict.find("'<f4'") == std::string::npos) DIL_FAIL(path, ": only float32 .npy is supported");
  shape->clear();
  auto l = dict.find('('), r = dict.find(')');
  std::string s = dict.substr(l + 1, r - l - 1);
  int64_t n = 1;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t c = s.find(',', pos);
    std::string tok = s.substr(pos, c == std::string::npos ? std::string::npos : c - pos);
    if (tok.find_first_of("0123456789") != std::string::npos) {
      shape->push_back(std::stoll(tok));
      n *= shape->back();
    }
    if (c == std::string::npos) break;
    pos = c + 1;
  }
  std::vector<float> v(static_cast<size_t>(n));
  in.read(reinterpret_cast<char*>(v.data()), std::streamsize(n * 4));
  return v;
}

}  // namespace dil
