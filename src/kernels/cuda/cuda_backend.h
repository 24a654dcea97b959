// Factory of the CUDA backend. A plain C++ header (no CUDA types) so that
// src/backend/factory.cpp can call it under #ifdef DIL_WITH_CUDA without nvcc.
#pragma once
#include <memory>

#include "backend/backend.h"

namespace dil {

// Backend on CUDA device `device` (one stream, one caching arena, one cuBLASLt handle).
// Throws dil::Error when no such device exists.
std::unique_ptr<Backend> make_cuda_backend(int device, const BackendOptions& o = {});

// Number of CUDA devices visible to this process (0 when there is no driver or no GPU);
// used by tests to skip cleanly on machines without a GPU.
int cuda_device_count();

}  // namespace dil
