// The TCP star every communicator starts from: rank 0 (the hub) listens on
// master_addr:master_port and every other rank opens two connections to it, one for data
// (bootstrap, host-side exchanges, the CPU backend's collectives) and one for liveness.
// Nothing is ever sent on the liveness connections: the watchdog thread polls them, and a
// readable one means the peer's process is gone (the kernel closed its sockets), whereupon
// this rank reports the lost rank and exits. Rank 0's exit closes its sockets in turn, so a
// death anywhere reaches every rank.
#pragma once
#include <atomic>
#include <cstddef>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "dist/communicator.h"

namespace dil {

class TcpStar {
 public:
  // Connects every rank (throws dil::Error after opt.timeout_s).
  explicit TcpStar(const DistOptions& opt);
  ~TcpStar();
  TcpStar(const TcpStar&) = delete;
  TcpStar& operator=(const TcpStar&) = delete;

  int rank() const { return opt_.rank; }
  int size() const { return opt_.size; }

  // Every rank's `n` bytes, concatenated in rank order into `all` (size * n bytes).
  void all_gather(const void* mine, size_t n, void* all);
  // in: size * n floats; out: n floats = sum over ranks of their chunk `rank`, summed on the
  // hub in rank order (((r0 + r1) + r2) ...), so the result does not depend on arrival order.
  void reduce_scatter_f32(const float* in, size_t n, float* out);
  // Variable-length messages (a length prefix each): gather to rank 0 (others get an empty
  // result) and scatter from rank 0 (parts[r] to rank r; `parts` is read on rank 0 only).
  std::vector<std::vector<char>> gather_bytes(const std::vector<char>& mine);
  std::vector<char> scatter_bytes(const std::vector<std::vector<char>>& parts);
  // Rank 0's n bytes into every rank's `buf`.
  void broadcast(void* buf, size_t n);
  void barrier();

  // Starts the liveness watchdog. `check` (optional) is polled too and returns a non-empty
  // message when the transport itself failed (NCCL's async error); `abort` (optional) runs
  // before the exit (ncclCommAbort).
  void start_watchdog(std::function<std::string()> check = {}, std::function<void()> abort = {});
  void stop_watchdog();

 private:
  void send_all(int peer, const void* p, size_t n);
  void recv_all(int peer, void* p, size_t n);
  void watch(std::function<std::string()> check, std::function<void()> abort);

  DistOptions opt_;
  // Hub: index = peer rank (0 unused). Others: index 0 = the hub.
  std::vector<int> data_fd_, live_fd_;
  std::vector<char> tmp_;
  std::thread watchdog_;
  std::atomic<bool> stop_{false};
};

}  // namespace dil
