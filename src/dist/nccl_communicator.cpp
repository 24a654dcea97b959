// The GPU communicator: NCCL collectives enqueued on the CUDA backend's stream (so they are
// ordered with the ops around them and never synchronize the host), bootstrapped over the
// TcpStar (rank 0 creates the ncclUniqueId and broadcasts it). The star also carries the
// host-side exchanges and the watchdog, which polls ncclCommGetAsyncError as well as the
// peers' liveness sockets: a kernel waiting for a dead peer's data would otherwise never end.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "backend/backend.h"
#include "core/check.h"
#include "dist/star_communicator.h"
#include "dist/tcp_communicator.h"

// Every NCCL/CUDA call is checked and named.
#define DIL_NCCL(call)                                                                            \
  do {                                                                                            \
    ncclResult_t dil_r_ = (call);                                                                 \
    if (dil_r_ != ncclSuccess && dil_r_ != ncclInProgress)                                        \
      DIL_FAIL("dist: ", #call, " failed: ", ncclGetErrorString(dil_r_), " (", ncclGetLastError(nullptr), ")"); \
  } while (0)
#define DIL_CUDART(call)                                                                          \
  do {                                                                                            \
    cudaError_t dil_e_ = (call);                                                                  \
    if (dil_e_ != cudaSuccess) DIL_FAIL("dist: ", #call, " failed: ", cudaGetErrorString(dil_e_)); \
  } while (0)

namespace dil {

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::I32: return ncclInt32;
    case DType::BF16: return ncclBfloat16;
    default: DIL_FAIL("dist: NCCL collectives take f32, bf16 or i32 tensors, got ", dtype_name(t));
  }
}

class NcclCommunicator : public StarCommunicator {
 public:
  NcclCommunicator(Backend& be, const DistOptions& opt) : StarCommunicator(opt) {
    DIL_CHECK(be.device() == Device::CUDA && be.native_stream(), "NCCL needs the CUDA backend's stream");
    stream_ = static_cast<cudaStream_t>(be.native_stream());
    // NVLink multicast (NVLS) stays off: the device machines forbid it (KINDS.md).
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    ncclUniqueId id{};
    if (opt.rank == 0) DIL_NCCL(ncclGetUniqueId(&id));
    star_.broadcast(&id, sizeof id);
    int dev = 0;
    DIL_CUDART(cudaGetDevice(&dev));  // the backend's device, set by its constructor
    DIL_NCCL(ncclCommInitRank(&comm_, opt.size, id, opt.rank));
    star_.start_watchdog(
        [this]() -> std::string {
          ncclResult_t async = ncclSuccess;
          if (ncclCommGetAsyncError(comm_, &async) != ncclSuccess) return "ncclCommGetAsyncError failed";
          if (async != ncclSuccess && async != ncclInProgress)
            return str_cat("NCCL reported an asynchronous error: ", ncclGetErrorString(async));
          return "";
        });  // no ncclCommAbort before the exit: it can block behind a kernel waiting for the dead
             // peer, and the process exit releases the GPU anyway
    std::fprintf(stderr, "dist: rank %d/%d on cuda:%d, NCCL %d\n", opt.rank, opt.size, dev, NCCL_VERSION_CODE);
  }
  ~NcclCommunicator() override {
    star_.stop_watchdog();
    cudaStreamSynchronize(stream_);
    final_barrier();
    ncclCommDestroy(comm_);
  }

  void all_gather(const Tensor& in, Tensor out) override {
    check_dev(in, "all_gather in");
    check_dev(out, "all_gather out");
    DIL_CHECK(in.dtype == out.dtype && out.numel() == int64_t(size()) * in.numel(), "all_gather: out ",
              out.shape_str(), " for in ", in.shape_str());
    DIL_NCCL(ncclAllGather(in.data, out.data, size_t(in.numel()), nccl_type(in.dtype), comm_, stream_));
  }
  void reduce_scatter(const Tensor& in, Tensor out) override {
    check_dev(in, "reduce_scatter in");
    check_dev(out, "reduce_scatter out");
    DIL_CHECK(in.dtype == DType::F32 && out.dtype == DType::F32 && in.numel() == int64_t(size()) * out.numel(),
              "reduce_scatter: in ", in.shape_str(), " out ", out.shape_str());
    DIL_NCCL(ncclReduceScatter(in.data, out.data, size_t(out.numel()), ncclFloat32, ncclSum, comm_, stream_));
  }
  void all_reduce(Tensor x) override {
    check_dev(x, "all_reduce x");
    DIL_CHECK(x.dtype == DType::F32, "all_reduce: f32 tensor");
    DIL_NCCL(ncclAllReduce(x.data, x.data, size_t(x.numel()), ncclFloat32, ncclSum, comm_, stream_));
  }
 private:
  static void check_dev(const Tensor& t, const char* what) {
    DIL_CHECK(t.device == Device::CUDA, what, ": NCCL collectives take device tensors");
  }
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Backend& be, const DistOptions& opt) {
  return std::make_unique<NcclCommunicator>(be, opt);
}

}  // namespace dil
