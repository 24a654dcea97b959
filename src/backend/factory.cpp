// Backend dispatch: the only #ifdef on CUDA outside CMake (design.md rule 5).
#include <cstdlib>
#include <string>

#include "backend/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/registry.h"
#include "kernels/cuda/registry.h"
#ifdef DIL_WITH_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace dil {

std::unique_ptr<Backend> make_backend(BackendKind kind, int device_index, const BackendOptions& opts) {
  BackendOptions o = opts;
  if (const char* p = std::getenv("DIL_POISON_SCRATCH"); p && std::string(p) == "1") o.poison_scratch = true;
  if (const char* p = std::getenv("DIL_PDL"); p && std::string(p) == "0") o.pdl = false;
  switch (kind) {
    case BackendKind::CPU:
      return make_cpu_backend(o);
    case BackendKind::CUDA:
#ifdef DIL_WITH_CUDA
      return make_cuda_backend(device_index, o);
#else
      DIL_FAIL("backend 'cuda' requested but DeepInfer-Lab was built without CUDA");
#endif
  }
  DIL_FAIL("unknown backend kind ", int(kind));
}

const std::vector<KernelImpl>& kernel_registry(BackendKind kind) {
  return kind == BackendKind::CUDA ? cuda_kernel_registry() : cpu_kernel_registry();
}

const char* backend_kind_name(BackendKind kind) { return kind == BackendKind::CUDA ? "cuda" : "cpu"; }

BackendKind parse_backend_kind(const std::string& s) {
  if (s == "cpu") return BackendKind::CPU;
  if (s == "cuda") return BackendKind::CUDA;
  DIL_FAIL("unknown backend '", s, "' (expected cpu or cuda)");
}

}  // namespace dil
