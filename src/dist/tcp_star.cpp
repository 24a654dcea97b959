#include "dist/tcp_star.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/check.h"

namespace dil {

namespace {

constexpr uint32_t kMagic = 0x44494c31;  // "DIL1"
enum Channel : int32_t { kData = 0, kLive = 1 };
struct Hello {
  uint32_t magic;
  int32_t rank, size, channel;
};

using Clock = std::chrono::steady_clock;

int ms_left(Clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return ms < 0 ? 0 : int(std::min<int64_t>(ms, 1 << 30));
}

void set_socket_options(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  // Keepalive: a peer machine that vanishes without closing (power, network) is noticed too.
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
}

// One blocking write/read of exactly n bytes with a deadline; `who` names the peer in errors.
void write_exact(int fd, const void* p, size_t n, const std::string& who) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t k = ::send(fd, c, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) DIL_FAIL("dist: sending to ", who, " failed (", std::strerror(errno), "): the process died?");
    c += k;
    n -= size_t(k);
  }
}

void read_exact(int fd, void* p, size_t n, const std::string& who, double timeout_s) {
  char* c = static_cast<char*>(p);
  const auto deadline = Clock::now() + std::chrono::milliseconds(int64_t(timeout_s * 1000));
  while (n > 0) {
    pollfd pf{fd, POLLIN, 0};
    int r = ::poll(&pf, 1, ms_left(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) DIL_FAIL("dist: no message from ", who, " for ", timeout_s, " s (hung or much slower?)");
    ssize_t k = ::recv(fd, c, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0) DIL_FAIL("dist: ", who, " closed its connection: its process exited or was killed");
    if (k < 0) DIL_FAIL("dist: receiving from ", who, " failed: ", std::strerror(errno));
    c += k;
    n -= size_t(k);
  }
}

addrinfo* resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(passive ? nullptr : host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0 || !res) DIL_FAIL("dist: cannot resolve master address '", host, "': ", gai_strerror(rc));
  return res;
}

}  // namespace

TcpStar::TcpStar(const DistOptions& opt) : opt_(opt) {
  if (opt.size < 1 || opt.rank < 0 || opt.rank >= opt.size)
    DIL_FAIL("dist: rank ", opt.rank, " outside a world of size ", opt.size);
  if (opt.master_port <= 0 || opt.master_port > 65535) DIL_FAIL("dist: bad master port ", opt.master_port);
  const auto deadline = Clock::now() + std::chrono::milliseconds(int64_t(opt.timeout_s * 1000));
  if (opt.size == 1) return;
  if (opt.rank == 0) {
    data_fd_.assign(size_t(opt.size), -1);
    live_fd_.assign(size_t(opt.size), -1);
    addrinfo* ai = resolve(opt.master_addr, opt.master_port, true);
    int ls = ::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(ls, ai->ai_addr, ai->ai_addrlen) != 0) {
      int e = errno;
      freeaddrinfo(ai);
      ::close(ls);
      DIL_FAIL("dist: rank 0 cannot listen on port ", opt.master_port, ": ", std::strerror(e));
    }
    freeaddrinfo(ai);
    ::listen(ls, 2 * opt.size);
    int missing = 2 * (opt.size - 1);
    while (missing > 0) {
      pollfd pf{ls, POLLIN, 0};
      int r = ::poll(&pf, 1, ms_left(deadline));
      if (r == 0) {
        ::close(ls);
        DIL_FAIL("dist: rank 0 waited ", opt.timeout_s, " s for ", missing, " connections of ", opt.size - 1,
                 " ranks on port ", opt.master_port);
      }
      if (r < 0) continue;
      int fd = ::accept(ls, nullptr, nullptr);
      if (fd < 0) continue;
      set_socket_options(fd);
      Hello h{};
      try {
        read_exact(fd, &h, sizeof h, "a connecting rank", opt.timeout_s);
      } catch (const Error&) {
        ::close(fd);
        continue;
      }
      std::vector<int>& slot = h.channel == kLive ? live_fd_ : data_fd_;
      if (h.magic != kMagic || h.size != opt.size || h.rank <= 0 || h.rank >= opt.size || slot[size_t(h.rank)] >= 0) {
        ::close(fd);
        ::close(ls);
        DIL_FAIL("dist: rank 0 got a bad hello (rank ", h.rank, ", world size ", h.size, ", expected ", opt.size,
                 "): two jobs on one port, or mismatched --nproc/--nnodes?");
      }
      slot[size_t(h.rank)] = fd;
      --missing;
    }
    ::close(ls);
  } else {
    for (int ch : {kData, kLive}) {
      int fd = -1;
      // Rank 0 may start later than us: retry until the deadline.
      for (;;) {
        addrinfo* ai = resolve(opt.master_addr, opt.master_port, false);
        fd = ::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
        int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
        freeaddrinfo(ai);
        if (rc == 0) break;
        ::close(fd);
        if (ms_left(deadline) == 0)
          DIL_FAIL("dist: rank ", opt.rank, " could not reach rank 0 at ", opt.master_addr, ":", opt.master_port,
                   " within ", opt.timeout_s, " s");
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      set_socket_options(fd);
      Hello h{kMagic, opt.rank, opt.size, ch};
      write_exact(fd, &h, sizeof h, "rank 0");
      (ch == kData ? data_fd_ : live_fd_).push_back(fd);
    }
  }
  barrier();  // every rank is connected once this returns
}

TcpStar::~TcpStar() {
  stop_watchdog();
  for (int fd : data_fd_)
    if (fd >= 0) ::close(fd);
  for (int fd : live_fd_)
    if (fd >= 0) ::close(fd);
}

void TcpStar::send_all(int peer, const void* p, size_t n) {
  write_exact(data_fd_[opt_.rank == 0 ? size_t(peer) : 0], p, n, "rank " + std::to_string(peer));
}

void TcpStar::recv_all(int peer, void* p, size_t n) {
  read_exact(data_fd_[opt_.rank == 0 ? size_t(peer) : 0], p, n, "rank " + std::to_string(peer), opt_.timeout_s);
}

void TcpStar::all_gather(const void* mine, size_t n, void* all) {
  char* out = static_cast<char*>(all);
  std::memmove(out + size_t(opt_.rank) * n, mine, n);
  if (opt_.size == 1) return;
  const size_t total = size_t(opt_.size) * n;
  if (opt_.rank == 0) {
    for (int r = 1; r < opt_.size; ++r) recv_all(r, out + size_t(r) * n, n);
    for (int r = 1; r < opt_.size; ++r) send_all(r, out, total);
  } else {
    send_all(0, mine, n);
    recv_all(0, out, total);
  }
}

void TcpStar::reduce_scatter_f32(const float* in, size_t n, float* out) {
  if (opt_.size == 1) {
    std::memmove(out, in, n * 4);
    return;
  }
  const size_t total = size_t(opt_.size) * n;
  if (opt_.rank == 0) {
    std::vector<float> acc(in, in + total);  // [size * n] running sum, rank order
    tmp_.resize(total * 4);
    const float* t = reinterpret_cast<const float*>(tmp_.data());
    for (int r = 1; r < opt_.size; ++r) {
      recv_all(r, tmp_.data(), total * 4);
      for (size_t i = 0; i < total; ++i) acc[i] += t[i];
    }
    for (int r = 1; r < opt_.size; ++r) send_all(r, acc.data() + size_t(r) * n, n * 4);
    std::memcpy(out, acc.data(), n * 4);
  } else {
    send_all(0, in, total * 4);
    recv_all(0, out, n * 4);
  }
}

std::vector<std::vector<char>> TcpStar::gather_bytes(const std::vector<char>& mine) {
  std::vector<std::vector<char>> all;
  if (opt_.rank != 0) {
    const uint64_t n = mine.size();
    send_all(0, &n, sizeof n);
    if (n) send_all(0, mine.data(), n);
    return all;
  }
  all.resize(size_t(opt_.size));
  all[0] = mine;
  for (int r = 1; r < opt_.size; ++r) {
    uint64_t n = 0;
    recv_all(r, &n, sizeof n);
    DIL_CHECK(n < (uint64_t(1) << 34), "dist: rank ", r, " announced a message of ", n, " bytes");
    all[size_t(r)].resize(n);
    if (n) recv_all(r, all[size_t(r)].data(), n);
  }
  return all;
}

std::vector<char> TcpStar::scatter_bytes(const std::vector<std::vector<char>>& parts) {
  if (opt_.rank == 0) {
    DIL_CHECK(parts.size() == size_t(opt_.size), "scatter_bytes: ", parts.size(), " parts for ", opt_.size, " ranks");
    for (int r = 1; r < opt_.size; ++r) {
      const uint64_t n = parts[size_t(r)].size();
      send_all(r, &n, sizeof n);
      if (n) send_all(r, parts[size_t(r)].data(), n);
    }
    return parts[0];
  }
  uint64_t n = 0;
  recv_all(0, &n, sizeof n);
  DIL_CHECK(n < (uint64_t(1) << 34), "dist: rank 0 announced a message of ", n, " bytes");
  std::vector<char> mine(n);
  if (n) recv_all(0, mine.data(), n);
  return mine;
}

void TcpStar::broadcast(void* buf, size_t n) {
  if (opt_.size == 1) return;
  if (opt_.rank == 0)
    for (int r = 1; r < opt_.size; ++r) send_all(r, buf, n);
  else
    recv_all(0, buf, n);
}

void TcpStar::barrier() {
  if (opt_.size == 1) return;
  char mine = 1;
  std::vector<char> all(size_t(opt_.size));
  all_gather(&mine, 1, all.data());
}

void TcpStar::start_watchdog(std::function<std::string()> check, std::function<void()> abort) {
  if (opt_.size == 1 || watchdog_.joinable()) return;
  stop_ = false;
  watchdog_ = std::thread([this, check = std::move(check), abort = std::move(abort)] { watch(check, abort); });
}

void TcpStar::stop_watchdog() {
  stop_ = true;
  if (watchdog_.joinable()) watchdog_.join();
}

// Runs on its own thread: the main thread may be blocked in a device synchronization that a
// dead peer would never release (an NCCL kernel waiting for its data).
void TcpStar::watch(std::function<std::string()> check, std::function<void()> abort) {
  std::vector<pollfd> pfs;
  std::vector<int> peer;
  for (size_t i = 0; i < live_fd_.size(); ++i) {
    if (live_fd_[i] < 0) continue;
    pfs.push_back({live_fd_[i], POLLIN, 0});
    peer.push_back(opt_.rank == 0 ? int(i) : 0);
  }
  while (!stop_) {
    int r = ::poll(pfs.data(), pfs.size(), 100);
    std::string why;
    if (r > 0) {
      for (size_t i = 0; i < pfs.size() && why.empty(); ++i)
        if (pfs[i].revents) why = str_cat("lost rank ", peer[i], " (its connection closed: the process exited or was killed)");
    }
    if (why.empty() && check) why = check();
    if (why.empty()) continue;
    std::fprintf(stderr, "error: dist rank %d: %s; exiting\n", opt_.rank, why.c_str());
    std::fflush(stderr);
    if (abort) abort();
    std::_Exit(kPeerLostExit);
  }
}

}  // namespace dil
