// `deepinfer-lab serve`: the OpenAI-compatible server. With no arguments it serves the bundled
// tiny-v4 model (models/tiny-v4, found next to the binary or the repo root) on the CPU at
// 127.0.0.1:8000. `--dp N --ep N` runs N ranks (attention data-parallel, MoE expert-parallel,
// src/runtime/dp_engine.h): rank 0 serves HTTP, the others run engine steps only.
// SIGINT/SIGTERM stop it gracefully (exit 0): new requests get 503, running ones finish for up
// to --shutdown-timeout seconds, the rest are aborted; a second signal exits at once. Every
// thread blocks the signals and one watcher takes them.
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <thread>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/dist_run.h"
#include "dil/engine.h"
#include "runtime/dp_engine.h"
#include "server/server.h"

namespace dil::cli {
namespace {

namespace fs = std::filesystem;

// The bundled model: models/tiny-v4 beside the binary, one level up (build/ in the repo),
// or under the current directory.
std::string default_model_dir() {
  std::vector<fs::path> roots;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) roots = {exe.parent_path(), exe.parent_path().parent_path()};
  roots.push_back(fs::current_path());
  for (const auto& r : roots)
    if (fs::exists(r / "models" / "tiny-v4" / "config.json")) return (r / "models" / "tiny-v4").string();
  DIL_FAIL("no --model given and the bundled models/tiny-v4 was not found next to the binary or in the current directory");
}

int usage() {
  std::fprintf(stderr,
               "usage: deepinfer-lab serve [--model DIR] [--host H] [--port P] [--api-key KEY]\n"
               "  [--served-model-name NAME] [--device cpu|cuda] [--max-model-len N] [--max-num-seqs N]\n"
               "  [--threads N] [--max-body-bytes N] [--max-concurrent N] [--overload reject|queue]\n"
               "  [--thinking] (thinking mode by default) [--health-stall-s S] [--numerics official|reference]\n"
               "  [--shutdown-timeout S] (30) [--keep-alive-timeout S] (75) [--request-timeout S] (60) [--access-log]\n"
               "  [--dp N --ep N] (N ranks, rank i on GPU i; --ep must equal --dp)\n"
               "  [--nnodes M --node-rank K --master-addr HOST --master-port P] (--dp ranks over M machines)\n");
  return 2;
}

// Takes SIGINT/SIGTERM (blocked in every thread) and calls on_stop, again every 100 ms until
// `done`, so a stop that lands before the server listens is not lost. `ended` (optional),
// polled as often, stops it too (the data-parallel job stopped from another rank). A second
// signal ends the process at once (status 128 + signal), for an operator who will not wait.
class SignalWatcher {
 public:
  SignalWatcher(sigset_t set, std::function<void()> on_stop, std::function<bool()> ended = {})
      : thread_([this, set, f = std::move(on_stop), ended = std::move(ended)] {
          bool stopping = false;
          while (!done_) {
            const timespec wait{0, 100 * 1000 * 1000};
            const int sig = sigtimedwait(&set, nullptr, &wait);
            if (sig > 0 && stopping) {
              std::fprintf(stderr, "serve: second signal %d, exiting now\n", sig);
              std::fflush(stderr);
              std::_Exit(128 + sig);
            }
            if (sig > 0) std::fprintf(stderr, "serve: got signal %d, shutting down (again to exit now)\n", sig);
            if (!stopping && sig <= 0 && ended && ended())
              std::fprintf(stderr, "serve: the data-parallel job was stopped by another rank, shutting down\n");
            stopping = stopping || sig > 0 || (ended && ended());
            if (stopping) f();
          }
        }) {}
  ~SignalWatcher() {
    done_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace

int cmd_serve(int argc, char** argv) {
  Args a(argc, argv, {"thinking", "help", "access-log"});
  if (a.has("help")) return usage();
  // A client that disconnects mid-write must not kill the process (the server sends with
  // MSG_NOSIGNAL; this also covers any other socket write).
  std::signal(SIGPIPE, SIG_IGN);
  // Before any thread starts (they inherit the mask), and before the launcher forks ranks.
  sigset_t stop_sigs;
  sigemptyset(&stop_sigs);
  sigaddset(&stop_sigs, SIGINT);
  sigaddset(&stop_sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_sigs, nullptr);

  const std::string dir = a.has("model") ? a.get("model") : default_model_dir();
  const int dp = int(a.get_int("dp", 1));
  const int ep = int(a.get_int("ep", dp));
  const int nnodes = int(a.get_int("nnodes", 1));
  if (dp < 1) DIL_FAIL("--dp must be at least 1");
  if (ep != dp)
    DIL_FAIL("--ep ", ep, " with --dp ", dp, ": only ep == dp is supported (attention data-parallel and MoE "
             "expert-parallel over the same ranks, DeepSeek's DEP)");
  if (nnodes < 1 || dp % nnodes != 0) DIL_FAIL("--dp ", dp, " does not split evenly over --nnodes ", nnodes);
  if (a.has("nproc")) DIL_FAIL("serve takes --dp (all ranks) rather than --nproc");

  EngineOptions eo;
  eo.model_dir = dir;
  eo.device = a.get("device", "cpu");
  eo.numerics = a.get("numerics", eo.numerics);
  eo.max_model_len = int(a.get_int("max-model-len", eo.max_model_len));
  eo.max_num_seqs = int(a.get_int("max-num-seqs", 256));
  eo.max_num_batched_tokens = int(a.get_int("max-num-batched-tokens", eo.max_num_batched_tokens));
  eo.kv_memory_bytes = a.get_int("kv-memory-mb", eo.kv_memory_bytes >> 20) << 20;

  // Several ranks: this process is the launcher (spawns the local ranks and returns their
  // status) or one rank with its backend (its GPU) and communicator.
  std::unique_ptr<DistRun> run;
  if (dp > 1) {
    int launcher_status = 0;
    run = start_dist(a, argc, argv, &launcher_status, "cpu", dp / nnodes);
    if (!run) return launcher_status;
    if (run->size() != dp)
      DIL_FAIL("this job has ", run->size(), " ranks (launcher environment) but --dp is ", dp);
    eo.device_index = run->plan.local_rank;
  }

  server::ServerOptions so;
  so.host = a.get("host", "127.0.0.1");
  so.port = int(a.get_int("port", 8000));
  so.api_key = a.get("api-key");
  so.model_name = a.get("served-model-name", fs::path(dir).filename().string());
  so.model_dir = dir;
  so.threads = int(a.get_int("threads", so.threads));
  so.max_body_bytes = size_t(a.get_int("max-body-bytes", long(so.max_body_bytes)));
  so.max_concurrent = a.get_int("max-concurrent", 0);
  const std::string overload = a.get("overload", "reject");
  if (overload != "reject" && overload != "queue") DIL_FAIL("--overload must be reject or queue");
  so.reject_overload = overload == "reject";
  so.defaults.thinking = a.has("thinking");
  so.health_stall_s = double(a.get_int("health-stall-s", 60));
  so.shutdown_timeout_s = double(a.get_int("shutdown-timeout", long(so.shutdown_timeout_s)));
  so.keep_alive_timeout_s = double(a.get_int("keep-alive-timeout", long(so.keep_alive_timeout_s)));
  so.request_timeout_s = double(a.get_int("request-timeout", long(so.request_timeout_s)));
  so.access_log = a.has("access-log");
  if (so.shutdown_timeout_s < 0 || so.keep_alive_timeout_s < 1 || so.request_timeout_s < 1)
    DIL_FAIL("--shutdown-timeout must be >= 0, --keep-alive-timeout and --request-timeout >= 1");

  const int rank = run ? run->rank() : 0;
  std::unique_ptr<tok::Tokenizer> tok;
  if (rank == 0) tok = tok::Tokenizer::load(dir + "/tokenizer.json");
  std::fprintf(stderr, "loading %s on %s (rank %d of %d) ...\n", dir.c_str(), eo.device.c_str(), rank, dp);
  std::unique_ptr<Engine> engine;
  runtime::DpEngine* dpe = nullptr;
  if (run) {
    auto e = runtime::make_dp_engine(eo, *run->be, *run->comm);
    dpe = e.get();
    engine = std::move(e);
  } else {
    engine = make_engine(eo);
  }

  if (rank != 0) {
    // Engine steps only, until rank 0 stops the job (or a signal here asks it to).
    {
      SignalWatcher w(stop_sigs, [dpe] { dpe->request_stop(); });
      dpe->wait();
    }
    engine->shutdown();
    engine.reset();
    std::fprintf(stderr, "serve: rank %d stopped\n", rank);
    return 0;
  }
  const auto format = tok::prompt_format_from_config(dir + "/config.json");
  server::Server srv(*engine, *tok, format, so);
  const int port = srv.bind();
  std::fprintf(stderr, "serving '%s' on http://%s:%d (OpenAI API under /v1, %d data-parallel rank%s)\n",
               so.model_name.c_str(), so.host.c_str(), port, dp, dp > 1 ? "s" : "");
  {
    SignalWatcher w(stop_sigs, [&srv] { srv.shutdown(); }, [dpe] { return dpe && dpe->stopped(); });
    srv.run();
  }
  engine->shutdown();
  std::fprintf(stderr, "serve: stopped\n");
  return 0;
}

}  // namespace dil::cli
