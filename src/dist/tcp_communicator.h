// Factories of the two communicator implementations (make_communicator picks one).
#pragma once
#include <memory>

#include "dist/communicator.h"

namespace dil {

std::unique_ptr<Communicator> make_tcp_communicator(const DistOptions& opt);
// Defined only in builds with NCCL (DIL_WITH_NCCL).
std::unique_ptr<Communicator> make_nccl_communicator(Backend& be, const DistOptions& opt);

}  // namespace dil
