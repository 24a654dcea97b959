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
#include <functional>
#include <thread>

#include "cli/commands.h"
#include "core/check.h"
#include "cli/dist_run.h"
#include "cli/load_report.h"
#include "cli/serve_options.h"
#include "dil/engine.h"
#include "runtime/dp_engine.h"
#include "server/server.h"

namespace dil::cli {
namespace {

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

int run_serve(ServeOptions o, const ProgramArgs& prog) {
  // A client that disconnects mid-write must not kill the process (the server sends with
  // MSG_NOSIGNAL; this also covers any other socket write).
  std::signal(SIGPIPE, SIG_IGN);
  // Before any thread starts (they inherit the mask), and before the launcher forks ranks.
  sigset_t stop_sigs;
  sigemptyset(&stop_sigs);
  sigaddset(&stop_sigs, SIGINT);
  sigaddset(&stop_sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_sigs, nullptr);

  finish_serve_options(o);
  const std::string& dir = o.model;
  const int dp = o.dp;
  EngineOptions& eo = o.engine;
  server::ServerOptions& so = o.server;
  if (dp > 1 && eo.speculative != "off")
    DIL_FAIL("--speculative ", eo.speculative, " does not run with --dp ", dp, " yet (the ranks' steps would need ",
             "the same draft lengths); use --speculative off");

  // Several ranks: this process is the launcher (spawns the local ranks and returns their
  // status) or one rank with its backend (its GPU) and communicator.
  std::unique_ptr<DistRun> run;
  if (dp > 1) {
    int launcher_status = 0;
    run = start_dist(o.launch, eo.device, prog, &launcher_status);
    if (!run) return launcher_status;
    if (run->size() != dp)
      DIL_FAIL("this job has ", run->size(), " ranks (launcher environment) but --dp is ", dp);
    eo.device_index = run->plan.local_rank;
  }

  const int rank = run ? run->rank() : 0;
  std::unique_ptr<tok::Tokenizer> tok;
  if (rank == 0) tok = tok::Tokenizer::load(dir + "/tokenizer.json");
  std::fprintf(stderr, "loading %s on %s (rank %d of %d) ...\n", dir.c_str(), eo.device.c_str(), rank, dp);
  LoadPrinter printer = LoadPrinter::for_stderr();
  if (rank == 0) eo.on_load_progress = printer.callback();
  std::unique_ptr<Engine> engine;
  runtime::DpEngine* dpe = nullptr;
  if (run) {
    auto e = runtime::make_dp_engine(eo, *run->be, *run->comm);
    dpe = e.get();
    engine = std::move(e);
  } else {
    engine = make_engine(eo);
  }
  if (rank == 0) std::fprintf(stderr, "%s\n", loaded_line(printer.last(), kv_capacity(engine->info())).c_str());

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

}  // namespace

void add_serve(CLI::App& top, std::vector<Declared>* out) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* c = declare_serve(top, *o, "OpenAI-compatible HTTP server (default: the bundled tiny-v4 model on the CPU)");
  out->push_back({c, [o](const ProgramArgs& prog) { return run_serve(*o, prog); }});
}

}  // namespace dil::cli
