// Running R ranks of a job inside one test process (one thread per rank, TCP loopback).
#pragma once
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "dist/communicator.h"

namespace dil::test {

inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

inline DistOptions options(int rank, int size, int port) {
  DistOptions o;
  o.rank = rank;
  o.size = size;
  o.master_port = port;
  o.timeout_s = 60;
  return o;
}

// Runs fn(rank) on `size` threads; rethrows the first exception.
inline void run_ranks(int size, const std::function<void(int)>& fn) {
  std::vector<std::thread> ts;
  std::vector<std::exception_ptr> errs(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r)
    ts.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errs[size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : ts) t.join();
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
}

}  // namespace dil::test
