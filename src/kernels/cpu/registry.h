// The CPU backend's kernel registry (backend/plan.h): the reference of every op family, which
// runs every site in every numerics mode (f32 or bf16 activations).
#pragma once
#include <vector>

#include "backend/plan.h"

namespace dil {

const std::vector<KernelImpl>& cpu_kernel_registry();

}  // namespace dil
