// Collectives between the ranks of one job (one process per GPU, design.md "Scale"). The model
// calls them only when the job has more than one rank (ModelOptions::comm non-null, size > 1).
//
// Two implementations, one per backend:
// - NCCL (CUDA builds): collectives run on the CUDA backend's stream, asynchronously, like any
//   other op; the GPU path uses NCCL only.
// - TCP loopback (CPU backend): the same collectives over the bootstrap sockets, so that the
//   multi-rank logic of the model runs in CI on machines without GPUs. It is the CPU backend's
//   transport for tests, not a collective library (docs/architecture.md).
//
// Both bootstrap over TCP: rank 0 listens on master_addr:master_port, the others connect. The
// same sockets carry the host-side exchange (`exchange`, `barrier`) and a liveness watchdog:
// when a peer's process dies, the survivors print which rank was lost and exit (status
// kPeerLostExit) within a fraction of a second, instead of hanging in a collective.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace dil {

class Backend;

// Exit status of a rank that lost a peer (the watchdog's _Exit).
constexpr int kPeerLostExit = 75;

struct DistOptions {
  int rank = 0;
  int size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // Seconds a rank waits for the others to connect, and for any host-side message.
  double timeout_s = 300;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // in [n, ...] on every rank (same n) -> out [size * n, ...], rank r's rows at [r*n, (r+1)*n).
  // f32, bf16 or i32 tensors of the backend's device; contiguous.
  virtual void all_gather(const Tensor& in, Tensor out) = 0;
  // in [size * n, ...] f32 -> out [n, ...] = sum over ranks of their rows [rank*n, (rank+1)*n).
  // Sums in rank order, so every rank computes the same bits.
  virtual void reduce_scatter(const Tensor& in, Tensor out) = 0;
  // x f32, in place: the sum over ranks.
  virtual void all_reduce(Tensor x) = 0;
  // Host side, no device work: every rank's `mine` (same length everywhere), concatenated in
  // rank order. Used to agree on a step's shape before the step runs.
  virtual std::vector<int64_t> exchange(const std::vector<int64_t>& mine) = 0;
  // Host side, variable-length messages through rank 0 (the data-parallel engine's per-step
  // commands and reports, src/runtime/dp_engine.h). gather_bytes: on rank 0 every rank's
  // `mine` in rank order, elsewhere an empty vector. scatter_bytes: rank 0 passes one message
  // per rank (`parts[r]` for rank r; ignored on the other ranks); every rank returns its own.
  virtual std::vector<std::vector<char>> gather_bytes(const std::vector<char>& mine) = 0;
  virtual std::vector<char> scatter_bytes(const std::vector<std::vector<char>>& parts) = 0;
  virtual void barrier() = 0;
};

// The communicator for `be`: NCCL on a CUDA backend, TCP loopback on the CPU backend.
// Blocks until every rank has joined (or throws dil::Error after opt.timeout_s).
std::unique_ptr<Communicator> make_communicator(Backend& be, const DistOptions& opt);

}  // namespace dil
