// A rank killed mid-run: the survivor must exit with a clear error within a few seconds,
// never hang in a collective. Each rank is a forked process (a killed thread would take the
// whole test with it); the survivor's stderr goes to a file that the test reads.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <sstream>
#include <thread>

#include "backend/backend.h"
#include "dist_util.h"
#include "model/model.h"
#include "model/single_sequence.h"

using namespace dil;
using namespace dil::test;

static const std::string kDir = std::string(DIL_SOURCE_DIR) + "/tests/data/v4-tiny";

namespace {

// One rank of a 2-rank job: rank 0 decodes a long sequence, rank 1 runs empty steps. The rank
// `victim` SIGKILLs itself after 4 steps. Never returns.
[[noreturn]] void rank_main(int rank, int port, int victim, const std::string& err_path) {
  if (!err_path.empty()) {
    FILE* f = std::freopen(err_path.c_str(), "w", stderr);
    if (!f) std::_Exit(120);
  }
  try {
    auto be = make_backend(BackendKind::CPU);
    auto comm = make_communicator(*be, options(rank, 2, port));
    ModelOptions o;
    o.numerics = Numerics::Reference;
    o.comm = comm.get();
    auto model = load_model(kDir, *be, o);
    SingleSequence seq(*model, 4096);
    for (int step = 0; step < 4000; ++step) {
      if (rank == victim && step == 4) ::raise(SIGKILL);
      std::vector<int32_t> part;
      if (rank == 0) part = {int32_t(1 + step % 100)};
      std::vector<int64_t> counts = comm->exchange({int64_t(part.size())});
      std::vector<float> lg;
      if (part.empty()) {
        StepBatch idle;
        idle.rank_tokens = counts;
        model->forward(idle, &lg);
      } else {
        lg = seq.feed(part, false, counts);
      }
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    std::fflush(stderr);
    std::_Exit(1);
  }
  std::_Exit(0);  // not reached in the test: the peer dies long before 4000 steps
}

void check_survivor(int victim) {
  const int port = free_port(), survivor = 1 - victim;
  const std::string err = ::testing::TempDir() + "dist_survivor_" + std::to_string(::getpid()) + ".txt";
  pid_t pids[2];
  for (int r = 0; r < 2; ++r) {
    pids[r] = ::fork();
    ASSERT_GE(pids[r], 0);
    if (pids[r] == 0) rank_main(r, port, victim, r == survivor ? err : "");
  }
  int st = 0;
  ASSERT_EQ(::waitpid(pids[victim], &st, 0), pids[victim]);
  ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << "the victim was supposed to kill itself";
  const auto killed = std::chrono::steady_clock::now();
  bool exited = false;
  while (std::chrono::steady_clock::now() - killed < std::chrono::seconds(10)) {
    if (::waitpid(pids[survivor], &st, WNOHANG) == pids[survivor]) {
      exited = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!exited) {
    ::kill(pids[survivor], SIGKILL);
    ::waitpid(pids[survivor], &st, 0);
    FAIL() << "rank " << survivor << " still running 10 s after rank " << victim << " died";
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  std::ifstream f(err);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string msg = ss.str();
  std::printf("[rank %d killed] rank %d exited after %.3f s with status %d: %s", victim, survivor, secs,
              WIFEXITED(st) ? WEXITSTATUS(st) : -1, msg.c_str());
  ASSERT_TRUE(WIFEXITED(st));
  // Either the watchdog (kPeerLostExit) or the main thread's read of the dead socket (1)
  // noticed first; both name the lost rank.
  EXPECT_TRUE(WEXITSTATUS(st) == kPeerLostExit || WEXITSTATUS(st) == 1) << WEXITSTATUS(st);
  EXPECT_NE(msg.find("rank " + std::to_string(victim)), std::string::npos) << msg;
  EXPECT_LT(secs, 5.0);
  std::remove(err.c_str());
}

}  // namespace

TEST(PeerLoss, RankOneKilledRankZeroExits) { check_survivor(1); }
TEST(PeerLoss, RankZeroKilledRankOneExits) { check_survivor(0); }
