// Minimal .npy writer/reader for float32/int32 arrays (logits dumps, tests).
#pragma once
#include <string>
#include <vector>
#include <cstdint>

namespace dil {
void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape);
std::vector<float> read_npy_f32(const std::string& path, std::vector<int64_t>* shape);
}  // namespace dil
