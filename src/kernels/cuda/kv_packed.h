// Whole-row launchers of the packed KV formats (kv_packed.cu): a plain C++ header so that the
// parity test (tests/cuda/test_kv_packed.cpp) and host code can call them without nvcc.
#pragma once
#include <cstdint>

#include "core/kv_packed.h"

namespace dil::cuda {

// rows [R, row_bytes] packed from x [R, d] f32; x [R, d] f32 unpacked from rows. On `stream`.
void kv_pack_rows(kvpack::RowShape s, const float* x, int64_t R, uint8_t* rows, void* stream);
void kv_unpack_rows(kvpack::RowShape s, const uint8_t* rows, int64_t R, float* x, void* stream);

}  // namespace dil::cuda
