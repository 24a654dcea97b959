// The engine loop. One thread owns the scheduler, the KV manager, every Sequence and the
// model; submit()/cancel() only push commands onto a locked queue.
//
// A step: drain commands -> schedule (token budget, preemption) -> build the StepBatch ->
// [structured output: start the token masks on the mask worker] -> Model::forward -> [wait for
// the masks] -> sample each logits row -> commit (append, stop checks, free) -> push outputs
// to the streams -> publish stats.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <random>
#include <thread>
#include <unordered_map>

#include "core/check.h"
#include "runtime/engine_internal.h"
#include "runtime/kv_manager.h"
#include "runtime/mask_worker.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"
#include "runtime/sequence.h"
#include "runtime/stream.h"

namespace dil::runtime {

PoolPlan plan_pool(const EngineOptions& opts, const CacheSpec& spec) {
  PoolPlan p;
  p.n_slots = opts.kv_slots > 0 ? opts.kv_slots : opts.max_num_seqs;
  if (opts.kv_blocks > 0) {
    p.n_blocks = opts.kv_blocks;
  } else {
    DIL_CHECK(spec.bytes_per_block > 0, "cache spec without bytes_per_block");
    const int64_t slot_bytes = int64_t(p.n_slots) * int64_t(spec.bytes_per_slot);
    if (opts.kv_memory_bytes <= slot_bytes)
      DIL_FAIL("kv_memory_bytes ", opts.kv_memory_bytes, " cannot even hold the ", p.n_slots, " state slots (",
               slot_bytes, " bytes); lower max_num_seqs/kv_slots or raise the KV memory");
    p.n_blocks = (opts.kv_memory_bytes - slot_bytes) / int64_t(spec.bytes_per_block);
  }
  return p;
}

namespace {

struct Command {
  enum class Kind { Submit, Cancel } kind;
  GenRequest req;
  std::shared_ptr<Stream> stream;
  std::string id;
};

class EngineImpl final : public Engine {
 public:
  EngineImpl(const EngineOptions& opts, std::unique_ptr<Model> model, std::unique_ptr<Backend> backend,
             StepHook* hook);
  ~EngineImpl() override { shutdown(); }
  std::shared_ptr<RequestStream> submit(GenRequest req) override;
  void cancel(const std::string& id) override;
  EngineStats stats() const override;
  const EngineInfo& info() const override { return info_; }
  void shutdown() override;

 private:
  void loop();
  void handle(Command& c);
  std::string validate(const GenRequest& r) const;
  bool step();
  // The allowed tokens of a constrained row: the constraint's mask plus EOS/stop tokens when
  // its output is complete. False when nothing is allowed (the sequence is then finished).
  bool finish_mask(Sequence* s, std::vector<uint64_t>& mask);
  void commit(Sequence* s, const SampleResult& r);
  std::vector<int32_t> min_tokens_ban(const Sequence& s) const;
  void finish(Sequence* s, FinishReason why, std::string error = {});
  void publish_stats();

  // Declaration order = destruction order reversed: the model goes before its backend.
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  EngineOptions opts_;
  EngineInfo info_;
  std::unique_ptr<KvManager> kv_;
  std::unique_ptr<Scheduler> sched_;
  StepHook* hook_ = nullptr;  // data-parallel rank: lockstep with the other ranks
  // Engine-thread state.
  std::unordered_map<std::string, std::unique_ptr<Sequence>> live_;  // unfinished, by request id
  std::mt19937_64 seed_gen_;
  int64_t next_seq_id_ = 0;
  int64_t steps_ = 0, prompt_tokens_ = 0, generation_tokens_ = 0;
  double mask_seconds_ = 0.0, mask_wait_seconds_ = 0.0;
  MaskWorker mask_worker_;  // structured output: masks computed while the model runs
  // Shared with other threads.
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Command> cmds_;
  bool stop_ = false;
  std::atomic<int64_t> auto_id_{0};
  mutable std::mutex stats_mu_;
  EngineStats stats_;
  std::thread thread_;
};

EngineImpl::EngineImpl(const EngineOptions& opts, std::unique_ptr<Model> model, std::unique_ptr<Backend> backend,
                       StepHook* hook)
    : backend_(std::move(backend)), model_(std::move(model)), opts_(opts), hook_(hook) {
  const ModelConfig& cfg = model_->config();
  if (opts.block_tokens <= 0 || opts.block_tokens % 128 != 0)
    DIL_FAIL("block_tokens must be a positive multiple of 128, got ", opts.block_tokens);
  for (int r : cfg.compress_ratios)
    if (r > 0 && opts.block_tokens % r != 0)
      DIL_FAIL("block_tokens ", opts.block_tokens, " is not a multiple of compression ratio ", r);
  if (opts.max_num_seqs <= 0 || opts.max_num_batched_tokens <= 0 || opts.max_model_len <= 0)
    DIL_FAIL("max_num_seqs, max_num_batched_tokens and max_model_len must be positive");
  const CacheSpec spec = model_->cache_spec(opts.block_tokens);
  const PoolPlan plan = plan_pool(opts, spec);
  if (plan.n_blocks * opts.block_tokens < opts.max_model_len)
    DIL_FAIL("KV pool of ", plan.n_blocks, " blocks x ", opts.block_tokens, " tokens is smaller than max_model_len ",
             opts.max_model_len, "; raise kv_memory_bytes/kv_blocks or lower max_model_len");
  if (plan.n_blocks > INT32_MAX) DIL_FAIL("too many KV blocks: ", plan.n_blocks);
  model_->allocate_cache(int(plan.n_blocks), plan.n_slots, opts.block_tokens);
  kv_ = std::make_unique<KvManager>(int32_t(plan.n_blocks), plan.n_slots, opts.block_tokens, spec.bytes_per_block,
                                    spec.bytes_per_slot);
  sched_ = std::make_unique<Scheduler>(opts.max_num_seqs, opts.max_num_batched_tokens, *kv_);

  info_.model_name = cfg.model_type.empty() ? "deepseek" : cfg.model_type;
  if (!opts.model_dir.empty()) {
    std::string d = opts.model_dir;
    while (d.size() > 1 && d.back() == '/') d.pop_back();
    info_.model_name = d.substr(d.find_last_of('/') + 1);
  }
  info_.vocab_size = int(cfg.vocab_size);
  info_.max_model_len = opts.max_model_len;
  info_.eos_token_id = cfg.eos_id;
  info_.bos_token_id = cfg.bos_id;
  info_.block_tokens = opts.block_tokens;
  info_.kv_blocks = plan.n_blocks;
  info_.kv_slots = plan.n_slots;
  info_.kv_bytes_per_block = int64_t(spec.bytes_per_block);
  info_.kv_bytes_per_slot = int64_t(spec.bytes_per_slot);
  seed_gen_.seed(opts.seed != 0 ? opts.seed : (uint64_t(std::random_device{}()) << 32 | std::random_device{}()));
  publish_stats();
  thread_ = std::thread([this] { loop(); });
}

std::shared_ptr<RequestStream> EngineImpl::submit(GenRequest req) {
  if (req.id.empty()) req.id = "req-" + std::to_string(auto_id_.fetch_add(1));
  auto stream = std::make_shared<Stream>(req.id);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!stop_) {
      cmds_.push_back({Command::Kind::Submit, std::move(req), stream, {}});
      cv_.notify_one();
      return stream;
    }
  }
  GenOutput o;
  o.finish = FinishReason::Error;
  o.error = "engine shut down";
  stream->push(std::move(o));
  return stream;
}

void EngineImpl::cancel(const std::string& id) {
  std::lock_guard<std::mutex> lk(mu_);
  if (stop_) return;
  cmds_.push_back({Command::Kind::Cancel, {}, nullptr, id});
  cv_.notify_one();
}

EngineStats EngineImpl::stats() const {
  std::lock_guard<std::mutex> lk(stats_mu_);
  return stats_;
}

void EngineImpl::shutdown() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

std::string EngineImpl::validate(const GenRequest& r) const {
  const int64_t vocab = info_.vocab_size;
  if (r.prompt.empty()) return "the prompt is empty";
  for (int32_t t : r.prompt)
    if (t < 0 || t >= vocab) return str_cat("prompt token id ", t, " is outside [0, ", vocab, ")");
  if (r.stop.max_tokens < 1) return "max_tokens must be at least 1";
  if (r.stop.min_tokens < 0 || r.stop.min_tokens > r.stop.max_tokens) return "min_tokens must be in [0, max_tokens]";
  for (int32_t t : r.sampling.allowed_token_ids)
    if (t < 0 || t >= vocab) return str_cat("allowed_token_ids id ", t, " is outside [0, ", vocab, ")");
  if (int64_t(r.prompt.size()) + r.stop.max_tokens > opts_.max_model_len)
    return str_cat("prompt (", r.prompt.size(), " tokens) + max_tokens (", r.stop.max_tokens,
                   ") exceeds the maximum context length ", opts_.max_model_len);
  const SamplingParams& s = r.sampling;
  if (!(s.temperature >= 0.0f)) return "temperature must be >= 0";
  if (s.top_k < 0) return "top_k must be >= 0 (0 = off)";
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f)) return "top_p must be in (0, 1]";
  if (!(s.min_p >= 0.0f && s.min_p <= 1.0f)) return "min_p must be in [0, 1]";
  if (!(s.repetition_penalty > 0.0f)) return "repetition_penalty must be > 0";
  if (s.logprobs > opts_.max_logprobs) return str_cat("logprobs must be at most ", opts_.max_logprobs);
  for (auto [t, b] : s.logit_bias)
    if (t < 0 || t >= vocab) return str_cat("logit_bias token id ", t, " is outside [0, ", vocab, ")");
  return {};
}

void EngineImpl::handle(Command& c) {
  if (c.kind == Command::Kind::Cancel) {
    auto it = live_.find(c.id);
    if (it != live_.end()) finish(it->second.get(), FinishReason::Cancelled);
    return;
  }
  GenRequest& r = c.req;
  std::string err = validate(r);
  if (err.empty() && live_.count(r.id)) err = str_cat("request id '", r.id, "' is already in flight");
  if (!err.empty()) {
    GenOutput o;
    o.finish = FinishReason::Error;
    o.error = std::move(err);
    o.prompt_tokens = int(r.prompt.size());
    c.stream->push(std::move(o));
    return;
  }
  auto s = std::make_unique<Sequence>();
  s->id = next_seq_id_++;
  s->request_id = r.id;
  s->tokens = std::move(r.prompt);
  s->prompt_len = s->len();
  s->sampling = std::move(r.sampling);
  s->stop = std::move(r.stop);
  s->constraint = std::move(r.constraint);
  // Drawn for every request, in arrival order, so the engine's generator state depends only on
  // the order of submissions.
  const uint64_t drawn = seed_gen_();
  s->seed = s->sampling.seed ? *s->sampling.seed : drawn;
  s->stream = std::move(c.stream);
  prompt_tokens_ += s->prompt_len;
  sched_->add(s.get());
  live_.emplace(s->request_id, std::move(s));
}

void EngineImpl::finish(Sequence* s, FinishReason why, std::string error) {
  GenOutput o;
  o.finish = why;
  o.error = std::move(error);
  o.prompt_tokens = s->prompt_len;
  o.completion_tokens = s->num_generated();
  s->stream->push(std::move(o));
  sched_->finish(s);
  live_.erase(s->request_id);  // destroys s
}

void EngineImpl::commit(Sequence* s, const SampleResult& r) {
  s->tokens.push_back(r.token);
  ++generation_tokens_;
  GenOutput o;
  o.prompt_tokens = s->prompt_len;
  o.completion_tokens = s->num_generated();
  const auto& ids = s->stop.stop_token_ids;
  if ((!s->stop.ignore_eos && r.token == info_.eos_token_id) || std::find(ids.begin(), ids.end(), r.token) != ids.end()) {
    o.finish = FinishReason::Stop;
    o.stop_token = r.token;
  } else {
    o.tokens.push_back({r.token, r.logprob, r.top});
    if (s->num_generated() >= s->stop.max_tokens) o.finish = FinishReason::Length;
  }
  const bool done = o.finish != FinishReason::None;
  s->stream->push(std::move(o));
  if (done) {
    sched_->finish(s);
    live_.erase(s->request_id);
  }
}

// Before min_tokens, what would stop the request (EOS unless ignored, stop ids) is masked, as
// vLLM's min-tokens logits processor does; never when it would leave no allowed token.
std::vector<int32_t> EngineImpl::min_tokens_ban(const Sequence& s) const {
  std::vector<int32_t> ban;
  if (s.num_generated() >= s.stop.min_tokens) return ban;
  ban = s.stop.stop_token_ids;
  if (!s.stop.ignore_eos) ban.push_back(info_.eos_token_id);
  const auto& allowed = s.sampling.allowed_token_ids;
  if (!allowed.empty() &&
      std::all_of(allowed.begin(), allowed.end(), [&](int32_t t) { return std::find(ban.begin(), ban.end(), t) != ban.end(); }))
    ban.clear();
  return ban;
}

bool EngineImpl::step() {
  Schedule sch = sched_->schedule();
  if (sch.chunks.empty())
    DIL_CHECK(sched_->n_running() > 0 || sched_->n_waiting() == 0, "waiting requests but nothing schedulable");
  StepBatch batch;
  if (hook_) {
    // Every rank joins the step when any rank has tokens (the MoE collectives need all).
    batch.rank_tokens = hook_->agree(sch.n_tokens);
    bool any = false;
    for (int64_t n : batch.rank_tokens) any = any || n > 0;
    if (!any) return false;
    if (sch.chunks.empty()) {
      std::vector<float> none;
      try {
        model_->forward(batch, &none);
      } catch (const std::exception& e) {
        hook_->fatal(str_cat("empty model step failed: ", e.what()));
      }
      return true;
    }
  } else if (sch.chunks.empty()) {
    return false;
  }
  batch.tokens.reserve(sch.n_tokens);
  for (const ScheduledChunk& c : sch.chunks) {
    SeqChunk sc;
    sc.slot = kv_->slot(c.seq->id);
    sc.start_pos = c.start;
    sc.n_tokens = c.n_tokens;
    sc.blocks = kv_->blocks(c.seq->id);
    sc.want_logits = c.sample;
    batch.seqs.push_back(std::move(sc));
    batch.tokens.insert(batch.tokens.end(), c.seq->tokens.begin() + c.start, c.seq->tokens.begin() + c.start + c.n_tokens);
  }
  // Structured output: each constrained row's mask depends only on the tokens sampled so far,
  // so it is computed on the mask worker while the model runs.
  const size_t vocab = size_t(info_.vocab_size);
  std::vector<std::vector<uint64_t>> masks(sch.chunks.size());  // [chunk][ceil(vocab / 64)]
  std::vector<size_t> constrained;                               // chunk indices
  for (size_t k = 0; k < sch.chunks.size(); ++k)
    if (sch.chunks[k].sample && sch.chunks[k].seq->constraint) {
      constrained.push_back(k);
      masks[k].assign((vocab + 63) / 64, 0);
    }
  double mask_seconds = 0.0;
  if (!constrained.empty())
    mask_worker_.start([&] {
      const auto t0 = std::chrono::steady_clock::now();
      for (size_t k : constrained) {
        Sequence* s = sch.chunks[k].seq;
        s->constraint->fill_mask(masks[k], s->stop.max_tokens - s->num_generated() - 1);
      }
      mask_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
  std::vector<float> logits;  // [rows, vocab] f32
  std::string failure;
  try {
    model_->forward(batch, &logits);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (!constrained.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    mask_worker_.wait();  // before anything returns: the job refers to this frame
    mask_wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    mask_seconds_ += mask_seconds;
  }
  if (!failure.empty()) {
    if (hook_) hook_->fatal(str_cat("model step failed: ", failure));
    for (const ScheduledChunk& c : sch.chunks) finish(c.seq, FinishReason::Error, str_cat("model step failed: ", failure));
    return true;
  }
  ++steps_;
  size_t row = 0;
  for (size_t k = 0; k < sch.chunks.size(); ++k) {
    const ScheduledChunk& c = sch.chunks[k];
    Sequence* s = c.seq;
    s->num_computed += c.n_tokens;
    if (!c.sample) continue;
    DIL_CHECK((row + 1) * vocab <= logits.size(), "model returned ", logits.size(), " logits for row ", row);
    std::span<const float> lrow(logits.data() + row * vocab, vocab);
    ++row;
    if (s->constraint && !finish_mask(s, masks[k])) continue;
    std::span<const int32_t> all(s->tokens);
    // A constrained row's mask already holds allowed_token_ids and the min_tokens ban.
    const std::vector<int32_t> banned = s->constraint ? std::vector<int32_t>{} : min_tokens_ban(*s);
    SampleResult r = sample_token(lrow, s->sampling, all.first(s->prompt_len), all.subspan(s->prompt_len), s->seed,
                                  s->len(), opts_.logprobs_mode, banned, masks[k]);
    const auto& stops = s->stop.stop_token_ids;
    const bool ends = (!s->stop.ignore_eos && r.token == info_.eos_token_id) ||
                      std::find(stops.begin(), stops.end(), r.token) != stops.end();
    if (s->constraint && !ends) s->constraint->advance(r.token);
    commit(s, r);
  }
  return true;
}

bool EngineImpl::finish_mask(Sequence* s, std::vector<uint64_t>& mask) {
  const int32_t vocab = info_.vocab_size;
  auto allow = [&](int32_t t) {
    if (t >= 0 && t < vocab) mask[size_t(t) / 64] |= uint64_t(1) << (t % 64);
  };
  auto forbid = [&](int32_t t) {
    if (t >= 0 && t < vocab) mask[size_t(t) / 64] &= ~(uint64_t(1) << (t % 64));
  };
  // Tokens that end the request end it exactly when the output is complete.
  const bool complete = s->constraint->accepting();
  if (!s->stop.ignore_eos) complete ? allow(info_.eos_token_id) : forbid(info_.eos_token_id);
  for (int32_t t : s->stop.stop_token_ids) complete ? allow(t) : forbid(t);
  // allowed_token_ids and min_tokens narrow the grammar's choice here, so that the sampler
  // never meets an empty intersection.
  const auto& only = s->sampling.allowed_token_ids;
  if (!only.empty()) {
    std::vector<uint64_t> keep(mask.size(), 0);
    for (int32_t t : only)
      if (t >= 0 && t < vocab) keep[size_t(t) / 64] |= uint64_t(1) << (t % 64);
    for (size_t w = 0; w < mask.size(); ++w) mask[w] &= keep[w];
  }
  const auto any = [&] { return std::any_of(mask.begin(), mask.end(), [](uint64_t w) { return w != 0; }); };
  // The ban yields when it would leave nothing (as min_tokens_ban does for allowed_token_ids):
  // then only EOS/stop ids of a complete output remain, and the output cannot grow anyway.
  const std::vector<uint64_t> unbanned = mask;
  for (int32_t t : min_tokens_ban(*s)) forbid(t);
  if (!any()) mask = unbanned;
  if (any()) return true;
  // Nothing may follow: a complete output ends as if stopped; otherwise the grammar is stuck.
  if (complete) finish(s, FinishReason::Stop);
  else finish(s, FinishReason::Error, "structured output: no token of the vocabulary (or of allowed_token_ids) can continue the required format");
  return false;
}

void EngineImpl::publish_stats() {
  EngineStats st;
  st.running = int(sched_->n_running());
  st.waiting = int(sched_->n_waiting());
  st.preemptions = sched_->preemptions();
  st.prompt_tokens_total = prompt_tokens_;
  st.generation_tokens_total = generation_tokens_;
  st.steps = steps_;
  st.kv_blocks_total = kv_->total_blocks();
  st.kv_blocks_used = kv_->total_blocks() - kv_->free_blocks();
  st.kv_usage = st.kv_blocks_total ? double(st.kv_blocks_used) / double(st.kv_blocks_total) : 0.0;
  st.kv_slots_total = kv_->total_slots();
  st.kv_slots_used = kv_->total_slots() - kv_->free_slots();
  st.kv_bytes_total = int64_t(kv_->total_bytes());
  st.kv_bytes_used = int64_t(kv_->used_bytes());
  st.mask_seconds_total = mask_seconds_;
  st.mask_wait_seconds_total = mask_wait_seconds_;
  std::lock_guard<std::mutex> lk(stats_mu_);
  stats_ = st;
}

void EngineImpl::loop() {
  for (;;) {
    std::deque<Command> cmds;
    bool stopping;
    const bool idle = sched_->n_running() == 0 && sched_->n_waiting() == 0;
    if (hook_) {
      // The job's stop comes from the hook (rank 0 decides for every rank); this engine's own
      // stop_ only reaches the others through it.
      stopping = hook_->round(*this, idle);
      std::lock_guard<std::mutex> lk(mu_);
      cmds.swap(cmds_);
    } else {
      std::unique_lock<std::mutex> lk(mu_);
      if (idle) cv_.wait(lk, [&] { return stop_ || !cmds_.empty(); });
      cmds.swap(cmds_);
      stopping = stop_;
    }
    for (Command& c : cmds) {
      if (stopping && c.kind == Command::Kind::Submit) {
        GenOutput o;
        o.finish = FinishReason::Error;
        o.error = "engine shut down";
        c.stream->push(std::move(o));
        continue;
      }
      handle(c);
    }
    if (stopping) break;
    step();
    publish_stats();
  }
  std::vector<Sequence*> left;
  for (auto& [id, s] : live_) left.push_back(s.get());
  for (Sequence* s : left) finish(s, FinishReason::Error, "engine shut down");
  publish_stats();
}

}  // namespace

std::unique_ptr<Engine> make_engine_with_model(const EngineOptions& opts, std::unique_ptr<Model> model,
                                               std::unique_ptr<Backend> backend, StepHook* hook) {
  DIL_CHECK(model != nullptr, "make_engine_with_model without a model");
  return std::make_unique<EngineImpl>(opts, std::move(model), std::move(backend), hook);
}

}  // namespace dil::runtime
