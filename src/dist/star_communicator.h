// What the two communicators share: the TcpStar every job bootstraps from, which also carries
// the host-side messages (exchange, gather/scatter of bytes, barrier) and the liveness
// watchdog. The NCCL and TCP communicators add their device collectives on top.
#pragma once
#include <cstdio>

#include "core/check.h"
#include "dist/communicator.h"
#include "dist/tcp_star.h"

namespace dil {

class StarCommunicator : public Communicator {
 public:
  explicit StarCommunicator(const DistOptions& opt) : star_(opt) {}
  int rank() const override { return star_.rank(); }
  int size() const override { return star_.size(); }
  std::vector<int64_t> exchange(const std::vector<int64_t>& mine) override {
    std::vector<int64_t> all(mine.size() * size_t(size()));
    star_.all_gather(mine.data(), mine.size() * 8, all.data());
    return all;
  }
  std::vector<std::vector<char>> gather_bytes(const std::vector<char>& mine) override {
    return star_.gather_bytes(mine);
  }
  std::vector<char> scatter_bytes(const std::vector<std::vector<char>>& parts) override {
    return star_.scatter_bytes(parts);
  }
  void barrier() override { star_.barrier(); }

 protected:
  // The job's last barrier, from a destructor (after star_.stop_watchdog(): from then on a
  // peer closing its sockets is the normal end of the job). A failure only warns.
  void final_barrier() {
    try {
      star_.barrier();
    } catch (const Error& e) {
      std::fprintf(stderr, "warning: dist rank %d: final barrier: %s\n", star_.rank(), e.what());
    }
  }
  TcpStar star_;
};

}  // namespace dil
