#include "dist/launch.h"

#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "core/check.h"

namespace dil {

namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int env_int(const char* name, int def) {
  const char* v = env(name);
  if (!v) return def;
  try {
    return std::stoi(v);
  } catch (...) {
    DIL_FAIL("environment variable ", name, " is not an integer: '", v, "'");
  }
}

// A port nobody listens on now (the kernel's choice); rank 0 binds it a moment later.
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  if (port == 0) DIL_FAIL("dist: could not find a free TCP port (pass --master-port)");
  return port;
}

}  // namespace

LaunchPlan plan_launch(const LaunchRequest& req) {
  if (req.nproc < 1 || req.nnodes < 1 || req.node_rank < 0 || req.node_rank >= req.nnodes)
    DIL_FAIL("bad launch: --nproc ", req.nproc, " --nnodes ", req.nnodes, " --node-rank ", req.node_rank);
  LaunchPlan p;
  p.dist.timeout_s = req.timeout_s;
  p.dist.master_addr = !req.master_addr.empty() ? req.master_addr : env("MASTER_ADDR") ? env("MASTER_ADDR") : "127.0.0.1";
  p.dist.master_port = req.master_port > 0 ? req.master_port : env_int("MASTER_PORT", 0);
  // A rank of a job started by spawn_ranks, mpirun or SLURM.
  struct Source { const char *rank, *size, *local; };
  for (Source s : {Source{"DIL_RANK", "DIL_WORLD_SIZE", "DIL_LOCAL_RANK"},
                   Source{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
                   Source{"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"}}) {
    if (!env(s.rank) || !env(s.size)) continue;
    p.dist.rank = env_int(s.rank, 0);
    p.dist.size = env_int(s.size, 1);
    p.local_rank = env_int(s.local, p.dist.rank);
    if (p.dist.size > 1 && p.dist.master_port == 0) p.dist.master_port = 29500;
    return p;
  }
  const int world = req.nproc * req.nnodes;
  if (world == 1) return p;
  p.spawn = true;
  p.dist.size = world;
  if (p.dist.master_port == 0) {
    if (req.nnodes > 1) DIL_FAIL("several machines need --master-port (and --master-addr)");
    p.dist.master_port = free_port();
  }
  return p;
}

int spawn_ranks(const LaunchPlan& plan, const LaunchRequest& req, int argc, char** argv) {
  // SIGINT/SIGTERM/SIGHUP to the launcher go on to every rank (a server's ranks then stop
  // cleanly); they are taken synchronously below, so no handler and no shared flag.
  sigset_t fwd, old_mask;
  sigemptyset(&fwd);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&fwd, sig);
  pthread_sigmask(SIG_BLOCK, &fwd, &old_mask);
  std::vector<pid_t> kids;
  std::vector<std::string> args(argv, argv + argc);
  for (int i = 0; i < req.nproc; ++i) {
    const int rank = req.node_rank * req.nproc + i;
    pid_t pid = ::fork();
    if (pid < 0) DIL_FAIL("dist: fork failed");
    if (pid == 0) {
      setenv("DIL_RANK", std::to_string(rank).c_str(), 1);
      setenv("DIL_WORLD_SIZE", std::to_string(plan.dist.size).c_str(), 1);
      setenv("DIL_LOCAL_RANK", std::to_string(i).c_str(), 1);
      setenv("MASTER_ADDR", plan.dist.master_addr.c_str(), 1);
      setenv("MASTER_PORT", std::to_string(plan.dist.master_port).c_str(), 1);
      setenv("NCCL_NVLS_ENABLE", "0", 0);  // never NVLink multicast (KINDS.md)
      pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);  // the rank gets the caller's mask
      std::vector<char*> cargv;
      for (std::string& a : args) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      ::execv("/proc/self/exe", cargv.data());
      std::fprintf(stderr, "error: dist: could not start rank %d\n", rank);
      std::_Exit(127);
    }
    kids.push_back(pid);
  }
  int status_out = 0;
  size_t alive = kids.size();
  bool failed = false;
  auto first_failure = std::chrono::steady_clock::now();
  while (alive > 0) {
    int st = 0;
    pid_t pid = ::waitpid(-1, &st, WNOHANG);
    if (pid > 0) {
      for (size_t i = 0; i < kids.size(); ++i) {
        if (kids[i] != pid) continue;
        kids[i] = -1;
        --alive;
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (code != 0 && status_out == 0) {
          status_out = code;
          failed = true;
          first_failure = std::chrono::steady_clock::now();
          std::fprintf(stderr, "error: dist: local rank %zu exited with status %d\n", i, code);
        }
      }
      continue;
    }
    if (pid < 0) break;
    // The survivors of a failure exit through their watchdog; a rank stuck before it joined
    // (still connecting) is killed after a grace period.
    if (failed && std::chrono::steady_clock::now() - first_failure > std::chrono::seconds(10)) {
      for (pid_t k : kids)
        if (k > 0) ::kill(k, SIGKILL);
    }
    const timespec wait{0, 20 * 1000 * 1000};
    const int sig = sigtimedwait(&fwd, nullptr, &wait);
    if (sig > 0) {
      std::fprintf(stderr, "dist: launcher got signal %d, passing it to the ranks\n", sig);
      for (pid_t k : kids)
        if (k > 0) ::kill(k, sig);
    }
  }
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  return status_out;
}

}  // namespace dil
