// The CPU backend's communicator: collectives over the TcpStar's sockets (through rank 0).
// Tests only (CI has no GPU); the GPU path uses NCCL (nccl_communicator.cpp).
#include "dist/tcp_communicator.h"

#include "dist/star_communicator.h"

namespace dil {

namespace {

class TcpCommunicator : public StarCommunicator {
 public:
  explicit TcpCommunicator(const DistOptions& opt) : StarCommunicator(opt) { star_.start_watchdog(); }
  ~TcpCommunicator() override {
    star_.stop_watchdog();  // from here on a peer closing its sockets is the normal end of the job
    final_barrier();
  }

  void all_gather(const Tensor& in, Tensor out) override {
    check_host(in, "all_gather in");
    check_host(out, "all_gather out");
    DIL_CHECK(in.dtype == out.dtype && (in.dtype == DType::F32 || in.dtype == DType::I32 || in.dtype == DType::BF16),
              "all_gather: f32/i32/bf16 tensors of one dtype");
    DIL_CHECK(out.nbytes() == size_t(size()) * in.nbytes(), "all_gather: out ", out.shape_str(), " for in ",
              in.shape_str(), " and ", size(), " ranks");
    star_.all_gather(in.data, in.nbytes(), out.data);
  }
  void reduce_scatter(const Tensor& in, Tensor out) override {
    check_host(in, "reduce_scatter in");
    check_host(out, "reduce_scatter out");
    DIL_CHECK(in.dtype == DType::F32 && out.dtype == DType::F32, "reduce_scatter: f32 tensors");
    DIL_CHECK(in.numel() == int64_t(size()) * out.numel(), "reduce_scatter: in ", in.shape_str(), " out ",
              out.shape_str(), " for ", size(), " ranks");
    star_.reduce_scatter_f32(in.ptr<float>(), size_t(out.numel()), out.ptr<float>());
  }
  void all_reduce(Tensor x) override {
    check_host(x, "all_reduce x");
    DIL_CHECK(x.dtype == DType::F32, "all_reduce: f32 tensor");
    // Every rank's copy reduced in rank order: a reduce-scatter of the replicated vector gives
    // each rank one chunk; gathering the chunks back keeps one summation order everywhere.
    const size_t n = size_t(x.numel());
    std::vector<float> all(n * size_t(size()));  // [size, n] every rank's x
    star_.all_gather(x.data, n * 4, all.data());
    float* o = x.ptr<float>();
    for (size_t i = 0; i < n; ++i) {
      float acc = all[i];
      for (int r = 1; r < size(); ++r) acc += all[size_t(r) * n + i];
      o[i] = acc;
    }
  }
 private:
  static void check_host(const Tensor& t, const char* what) {
    DIL_CHECK(t.device == Device::CPU, what, ": the TCP communicator serves the CPU backend only");
  }
};

}  // namespace

std::unique_ptr<Communicator> make_tcp_communicator(const DistOptions& opt) {
  return std::make_unique<TcpCommunicator>(opt);
}

}  // namespace dil
