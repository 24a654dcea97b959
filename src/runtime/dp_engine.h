// The data-parallel engine (DeepSeek's DEP: attention data-parallel, MoE expert-parallel over
// the same ranks; serving-notes §2.7, docs/architecture.md "Data-parallel engine").
//
// One process per rank. Every rank runs its own engine (scheduler, KV state, sequences) over a
// model built with ModelOptions::comm, so the MoE layers span all ranks. Rank 0 is also the
// job's front end: its DpEngine is the one `Engine` the HTTP server sees. submit() routes each
// request to a rank (GenRequest::dp_rank, else the least loaded: running + waiting + routed
// but not yet acknowledged, ties to the lowest rank), cancel() goes to the owning rank,
// stats() sum every rank's.
//
// Every engine-loop iteration, on every rank, in lockstep (StepHook):
//  1. host round over the communicator's bootstrap sockets: every rank sends rank 0 a
//     DpReport (outputs and stats since the last round); rank 0 relays the outputs to the
//     front streams and sends each rank a DpCommands (its new submits/cancels, shutdown);
//  2. each rank drains its commands and schedules locally;
//  3. `exchange` of the ranks' token counts; if all are zero nobody runs a forward, otherwise
//     every rank does (an empty batch with rank_tokens when it has no tokens), so the MoE
//     collectives never wait on the host inside the step.
// When every rank is idle, rank 0 waits up to kIdlePoll on its command queue before the next
// round: an idle job costs a few tiny messages per poll, and the other ranks' host reads
// never come near their timeout.
//
// Shutdown: rank 0's shutdown() (or a stop requested by any rank, e.g. its SIGTERM) goes out
// in the next round; every rank leaves its loop after that same round. A dead rank ends the
// others through the communicator's watchdog; a failed host round or model step ends this
// rank with a message (fatal: the collectives are out of step and cannot recover).
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "dist/communicator.h"
#include "runtime/dp_wire.h"
#include "runtime/engine_internal.h"
#include "runtime/stream.h"

namespace dil::runtime {

// Exit status of a rank whose model step failed (the host round's failures exit with
// kPeerLostExit, like the watchdog).
constexpr int kDpStepFailedExit = 70;

class DpEngine final : public Engine, private StepHook {
 public:
  static constexpr std::chrono::milliseconds kIdlePoll{10};

  // Starts this rank's engine over `model` (built with ModelOptions::comm = &comm). `backend`
  // may be null when the caller keeps it (it then outlives the engine); `comm` outlives it.
  // `memory`: the backend whose memory sizes an automatic pool (null: `backend`).
  DpEngine(const EngineOptions& opts, std::unique_ptr<Model> model, std::unique_ptr<Backend> backend,
           Communicator& comm, Backend* memory = nullptr);
  ~DpEngine() override;

  // Rank 0: the job's front end. Other ranks take no requests (submit answers an Error).
  std::shared_ptr<RequestStream> submit(GenRequest req) override;
  std::vector<std::shared_ptr<RequestStream>> submit_all(std::vector<GenRequest> reqs) override;
  void cancel(const std::string& id) override;
  // Rank 0: every rank's stats summed (as of the last round), dp_ranks per rank; waiting
  // includes requests routed but not yet received. Other ranks: their own.
  EngineStats stats() const override;
  const EngineInfo& info() const override { return info_; }
  // Rank 0: stops the job. Other ranks: asks rank 0 to stop the job. Returns once this rank's
  // engine loop has ended; unfinished requests end with Error ("engine shut down").
  void shutdown() override;
  // shutdown() without waiting (safe from any thread, e.g. a signal watcher).
  void request_stop();
  // Blocks until the job has stopped (whoever stopped it); stopped() polls the same.
  void wait();
  bool stopped();
  int rank() const { return rank_; }

 private:
  struct Owned {
    int rank = 0;
    std::shared_ptr<Stream> stream;
  };

  // StepHook (engine thread).
  bool round(Engine& self, bool idle) override;
  std::vector<int64_t> agree(int64_t n_tokens) override;
  [[noreturn]] void fatal(const std::string& what) override;

  std::shared_ptr<RequestStream> route_locked(GenRequest req, int rank);  // fmu_ held
  DpReport make_report(Engine& self);           // drains the local streams
  void apply(Engine& self, const DpCommands& c);  // into the local engine's queue
  bool front_round(Engine& self, bool idle, const DpReport& mine);
  bool quiet_locked() const;  // rank 0: nothing queued, routed or running anywhere
  int64_t load_locked(int r) const;
  void close_front(const std::string& why);
  static std::shared_ptr<Stream> failed(const std::string& id, const std::string& error, int prompt_tokens);

  Communicator& comm_;
  const int rank_, size_;
  EngineInfo info_;
  std::atomic<bool> stop_requested_{false};
  std::atomic<int64_t> auto_id_{0};

  // Engine thread: the requests this rank runs, by id (streams of the local engine).
  std::unordered_map<std::string, std::shared_ptr<RequestStream>> local_streams_;
  int64_t submits_seen_ = 0;

  // Rank 0's front end, shared by the HTTP threads and the engine thread.
  mutable std::mutex fmu_;
  std::condition_variable fcv_;
  bool front_closed_ = false;
  std::vector<std::vector<DpCommand>> outbox_;  // [size] commands not yet sent
  std::vector<int64_t> sent_, seen_;             // [size] submits routed / acknowledged
  std::vector<EngineStats> rank_stats_;          // [size] as of the last round
  std::unordered_map<std::string, Owned> owners_;  // unfinished requests

  // The job has stopped (this rank left its loop).
  std::mutex done_mu_;
  std::condition_variable done_cv_;
  bool done_ = false;

  std::unique_ptr<Engine> local_;  // last: its thread calls the hook, so it goes first
};

// This rank's engine: loads the model from opts.model_dir on `be` with expert parallelism
// over `comm`. `be` and `comm` outlive the engine.
std::unique_ptr<DpEngine> make_dp_engine(const EngineOptions& opts, Backend& be, Communicator& comm);

}  // namespace dil::runtime
