#include "dist/communicator.h"

#include "backend/backend.h"
#include "dist/tcp_communicator.h"

namespace dil {

std::unique_ptr<Communicator> make_communicator(Backend& be, const DistOptions& opt) {
  if (be.device() == Device::CPU) return make_tcp_communicator(opt);
#ifdef DIL_WITH_NCCL
  return make_nccl_communicator(be, opt);
#else
  DIL_FAIL("multi-rank runs on '", be.name(), "' need NCCL, and DeepInfer-Lab was built without it");
#endif
}

}  // namespace dil
