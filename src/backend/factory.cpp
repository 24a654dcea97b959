// Backend dispatch: the only #ifdef on CUDA outside CMake (design.md rule 5).
#include "backend/backend.h"
#include "kernels/cpu/cpu_backend.h"
#ifdef DIL_WITH_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace dil {

std::unique_ptr<Backend> make_backend(BackendKind kind, int device_index) {
  switch (kind) {
    case BackendKind::CPU:
      return make_cpu_backend();
    case BackendKind::CUDA:
#ifdef DIL_WITH_CUDA
      return make_cuda_backend(device_index);
#else
      DIL_FAIL("backend 'cuda' requested but DeepInfer-Lab was built without CUDA");
#endif
  }
  DIL_FAIL("unknown backend kind ", int(kind));
}

BackendKind parse_backend_kind(const std::string& s) {
  if (s == "cpu") return BackendKind::CPU;
  if (s == "cuda") return BackendKind::CUDA;
  DIL_FAIL("unknown backend '", s, "' (expected cpu or cuda)");
}

}  // namespace dil
