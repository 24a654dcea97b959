#include "runtime/dp_engine.h"

#include <cstdio>
#include <cstdlib>
#include <iterator>

#include "core/check.h"

namespace dil::runtime {

DpEngine::DpEngine(const EngineOptions& opts, std::unique_ptr<Model> model, std::unique_ptr<Backend> backend,
                   Communicator& comm, Backend* memory)
    : comm_(comm), rank_(comm.rank()), size_(comm.size()) {
  outbox_.resize(size_t(size_));
  sent_.assign(size_t(size_), 0);
  seen_.assign(size_t(size_), 0);
  rank_stats_.resize(size_t(size_));
  // The engine thread starts inside and calls round() at once: every member above is ready.
  local_ = make_engine_with_model(opts, std::move(model), std::move(backend), this, memory);
  info_ = local_->info();
  info_.dp_size = size_;
}

DpEngine::~DpEngine() { shutdown(); }

std::shared_ptr<Stream> DpEngine::failed(const std::string& id, const std::string& error, int prompt_tokens) {
  auto s = std::make_shared<Stream>(id);
  GenOutput o;
  o.finish = FinishReason::Error;
  o.error = error;
  o.prompt_tokens = prompt_tokens;
  s->push(std::move(o));
  return s;
}

std::shared_ptr<RequestStream> DpEngine::submit(GenRequest req) {
  std::vector<GenRequest> one;
  one.push_back(std::move(req));
  return submit_all(std::move(one))[0];
}

// All on one rank (the first request's, else the least loaded) in one command list, so that the
// rank's engine sees them in the same step and prefills a shared prompt once.
std::vector<std::shared_ptr<RequestStream>> DpEngine::submit_all(std::vector<GenRequest> reqs) {
  std::vector<std::shared_ptr<RequestStream>> out;
  for (GenRequest& req : reqs)
    if (req.id.empty()) req.id = "req-" + std::to_string(auto_id_.fetch_add(1));
  std::lock_guard<std::mutex> lk(fmu_);
  // route_locked keeps constrained requests on rank 0 whatever is chosen here.
  int r = reqs.empty() ? -1 : reqs[0].dp_rank;
  if (r < 0 || r >= size_) {
    r = 0;
    for (int i = 1; i < size_; ++i)
      if (load_locked(i) < load_locked(r)) r = i;
  }
  for (GenRequest& req : reqs) out.push_back(route_locked(std::move(req), r));
  fcv_.notify_one();
  return out;
}

std::shared_ptr<RequestStream> DpEngine::route_locked(GenRequest req, int r) {
  const int n_prompt = int(req.prompt.size());
  if (rank_ != 0) return failed(req.id, str_cat("rank ", rank_, " of a data-parallel job takes no requests"), n_prompt);
  if (req.dp_rank < -1 || req.dp_rank >= size_)
    return failed(req.id, str_cat("dp_rank ", req.dp_rank, " is outside [0, ", size_, ")"), n_prompt);
  if (front_closed_ || stop_requested_) return failed(req.id, "engine shut down", n_prompt);
  if (owners_.count(req.id)) return failed(req.id, str_cat("request id '", req.id, "' is already in flight"), n_prompt);
  if (req.constraint && req.dp_rank > 0)
    return failed(req.id, str_cat("structured output runs on data-parallel rank 0 only; X-Data-Parallel-Rank ",
                                  req.dp_rank, " cannot take it"), n_prompt);
  // A constraint (structured output) is an object of this process: it cannot travel to
  // another rank, so constrained requests run here, on rank 0.
  if (req.constraint) r = 0;
  else if (req.dp_rank >= 0) r = req.dp_rank;
  auto stream = std::make_shared<Stream>(req.id);
  owners_[req.id] = {r, stream};
  ++sent_[size_t(r)];
  DpCommand c;
  c.kind = DpCommand::Kind::Submit;
  c.req = std::move(req);
  outbox_[size_t(r)].push_back(std::move(c));
  return stream;
}

void DpEngine::cancel(const std::string& id) {
  if (rank_ != 0) return;
  std::lock_guard<std::mutex> lk(fmu_);
  auto it = owners_.find(id);
  if (it == owners_.end()) return;
  DpCommand c;
  c.kind = DpCommand::Kind::Cancel;
  c.id = id;
  outbox_[size_t(it->second.rank)].push_back(std::move(c));
  fcv_.notify_one();
}

int64_t DpEngine::load_locked(int r) const {
  const EngineStats& s = rank_stats_[size_t(r)];
  return int64_t(s.running) + s.waiting + (sent_[size_t(r)] - seen_[size_t(r)]);
}

bool DpEngine::quiet_locked() const {
  if (stop_requested_) return false;
  for (int r = 0; r < size_; ++r)
    if (load_locked(r) > 0 || !outbox_[size_t(r)].empty()) return false;
  return true;
}

EngineStats DpEngine::stats() const {
  if (rank_ != 0) return local_ ? local_->stats() : EngineStats{};
  std::lock_guard<std::mutex> lk(fmu_);
  EngineStats t;
  for (int r = 0; r < size_; ++r) {
    const EngineStats& s = rank_stats_[size_t(r)];
    const int unacked = int(sent_[size_t(r)] - seen_[size_t(r)]);
    t.dp_ranks.push_back({s.running, s.waiting + unacked});
    t.running += s.running;
    t.waiting += s.waiting + unacked;
    t.swapped += s.swapped;
    t.preemptions += s.preemptions;
    t.prompt_tokens_total += s.prompt_tokens_total;
    t.generation_tokens_total += s.generation_tokens_total;
    t.steps += s.steps;
    t.kv_blocks_total += s.kv_blocks_total;
    t.kv_blocks_used += s.kv_blocks_used;
    t.kv_slots_total += s.kv_slots_total;
    t.kv_slots_used += s.kv_slots_used;
    t.kv_bytes_total += s.kv_bytes_total;
    t.kv_bytes_used += s.kv_bytes_used;
    t.prefix_cache_queries += s.prefix_cache_queries;
    t.prefix_cache_hits += s.prefix_cache_hits;
    t.prompt_tokens_computed += s.prompt_tokens_computed;
    t.prompt_tokens_cached += s.prompt_tokens_cached;
    t.forks += s.forks;
    t.prefix_cache_blocks += s.prefix_cache_blocks;
    t.prefix_cache_snapshots += s.prefix_cache_snapshots;
    t.prefix_cache_evictions += s.prefix_cache_evictions;
    t.mask_seconds_total += s.mask_seconds_total;
    t.mask_wait_seconds_total += s.mask_wait_seconds_total;
  }
  t.kv_usage = t.kv_blocks_total ? double(t.kv_blocks_used) / double(t.kv_blocks_total) : 0.0;
  return t;
}

void DpEngine::request_stop() {
  stop_requested_ = true;
  std::lock_guard<std::mutex> lk(fmu_);
  fcv_.notify_all();
}

void DpEngine::shutdown() {
  request_stop();
  // Joins the engine thread, whose loop ends after the round that carries the stop.
  if (local_) local_->shutdown();
  close_front("engine shut down");
}

void DpEngine::wait() {
  std::unique_lock<std::mutex> lk(done_mu_);
  done_cv_.wait(lk, [&] { return done_; });
}

bool DpEngine::stopped() {
  std::lock_guard<std::mutex> lk(done_mu_);
  return done_;
}

void DpEngine::close_front(const std::string& why) {
  std::unordered_map<std::string, Owned> left;
  {
    std::lock_guard<std::mutex> lk(fmu_);
    front_closed_ = true;
    left.swap(owners_);
    for (auto& o : outbox_) o.clear();
  }
  for (auto& [id, o] : left) {
    GenOutput out;
    out.finish = FinishReason::Error;
    out.error = why;
    o.stream->push(std::move(out));
  }
}

DpReport DpEngine::make_report(Engine& self) {
  DpReport r;
  for (auto it = local_streams_.begin(); it != local_streams_.end();) {
    GenOutput o;
    bool finished = false;
    if (it->second->next(&o, std::chrono::milliseconds(0))) {
      finished = o.finish != FinishReason::None;
      r.outputs.push_back({it->first, std::move(o)});
    }
    it = finished ? local_streams_.erase(it) : std::next(it);
  }
  r.stats = self.stats();
  r.submits_seen = submits_seen_;
  r.stop_requested = stop_requested_;
  return r;
}

void DpEngine::apply(Engine& self, const DpCommands& c) {
  for (const DpCommand& d : c.cmds) {
    if (d.kind == DpCommand::Kind::Submit) {
      ++submits_seen_;
      // The front never has two requests of one id in flight, and an id leaves it only
      // after its final output came through here.
      local_streams_[d.req.id] = self.submit(d.req);
    } else {
      self.cancel(d.id);
    }
  }
}

bool DpEngine::round(Engine& self, bool idle) {
  bool stop = false;
  try {
    DpReport mine;
    if (rank_ == 0) {
      {
        // Pacing: with nothing to do anywhere, wait (briefly) for a request or a stop.
        std::unique_lock<std::mutex> lk(fmu_);
        if (idle && quiet_locked())
          fcv_.wait_for(lk, kIdlePoll, [&] {
            if (stop_requested_) return true;
            for (const auto& o : outbox_)
              if (!o.empty()) return true;
            return false;
          });
      }
      stop = front_round(self, idle, make_report(self));
    } else {
      comm_.gather_bytes(encode_report(make_report(self)));
      const DpCommands c = decode_commands(comm_.scatter_bytes({}));
      apply(self, c);
      stop = c.shutdown;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: dp rank %d: lost a peer in the host round (%s); exiting\n", rank_, e.what());
    std::fflush(stderr);
    std::_Exit(kPeerLostExit);
  }
  if (stop) {
    if (rank_ == 0) close_front("engine shut down");
    std::lock_guard<std::mutex> lk(done_mu_);
    done_ = true;
    done_cv_.notify_all();
  }
  return stop;
}

bool DpEngine::front_round(Engine& self, bool /*idle*/, const DpReport& mine) {
  const auto parts = comm_.gather_bytes(encode_report(mine));
  std::vector<DpReport> reports(static_cast<size_t>(size_));
  for (int r = 1; r < size_; ++r) reports[size_t(r)] = decode_report(parts[size_t(r)]);
  reports[0] = mine;
  // Relay outputs and take the commands under one lock; push outside it (streams lock too).
  std::vector<std::pair<std::shared_ptr<Stream>, GenOutput>> deliver;
  std::vector<std::vector<char>> out(static_cast<size_t>(size_));
  DpCommands own;
  {
    std::lock_guard<std::mutex> lk(fmu_);
    bool stop = stop_requested_;
    for (int r = 0; r < size_; ++r) {
      DpReport& rep = reports[size_t(r)];
      seen_[size_t(r)] = rep.submits_seen;
      rank_stats_[size_t(r)] = rep.stats;
      stop = stop || rep.stop_requested;
      for (DpOutput& o : rep.outputs) {
        auto it = owners_.find(o.id);
        if (it == owners_.end()) continue;  // closed meanwhile
        const bool final = o.out.finish != FinishReason::None;
        deliver.emplace_back(it->second.stream, std::move(o.out));
        if (final) owners_.erase(it);
      }
    }
    if (stop) stop_requested_ = true;
    for (int r = 0; r < size_; ++r) {
      DpCommands c;
      c.shutdown = stop;
      c.cmds.swap(outbox_[size_t(r)]);
      if (r == 0)
        own = std::move(c);
      else
        out[size_t(r)] = encode_commands(c);
    }
  }
  for (auto& [s, o] : deliver) s->push(std::move(o));
  comm_.scatter_bytes(out);
  apply(self, own);
  return own.shutdown;
}

std::vector<int64_t> DpEngine::agree(int64_t n_tokens) {
  try {
    return comm_.exchange({n_tokens});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: dp rank %d: lost a peer in the step agreement (%s); exiting\n", rank_, e.what());
    std::fflush(stderr);
    std::_Exit(kPeerLostExit);
  }
}

void DpEngine::fatal(const std::string& what) {
  std::fprintf(stderr, "error: dp rank %d: %s; the ranks are out of step, exiting\n", rank_, what.c_str());
  std::fflush(stderr);
  std::_Exit(kDpStepFailedExit);
}

std::unique_ptr<DpEngine> make_dp_engine(const EngineOptions& opts, Backend& be, Communicator& comm) {
  if (opts.model_dir.empty()) DIL_FAIL("make_dp_engine: no model_dir");
  ModelOptions mo;
  mo.numerics = parse_numerics(opts.numerics);
  mo.load_mtp = false;
  mo.comm = &comm;
  mo.on_progress = opts.on_load_progress;
  mo.load_format = opts.load_format;
  mo.layers = opts.layers;
  auto model = load_model(opts.model_dir, be, mo);
  return std::make_unique<DpEngine>(opts, std::move(model), nullptr, comm, &be);
}

}  // namespace dil::runtime
