// The CUDA backend's kernel registry (backend/plan.h), available in every build.
#pragma once
#include <vector>

#include "backend/plan.h"

namespace dil {

const std::vector<KernelImpl>& cuda_kernel_registry();

}  // namespace dil
