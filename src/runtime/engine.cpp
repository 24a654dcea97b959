// The engine loop. One thread owns the scheduler, the KV manager, every Sequence and the
// model; submit()/cancel() only push commands onto a locked queue.
//
// A step: drain commands -> schedule (token budget, preemption, prefix-cache hits) -> copies
// (copy-on-write, snapshot restores) -> build the StepBatch -> [structured output: start the
// token masks on the mask worker] -> Model::forward -> record snapshots, fork the followers of
// prompts just computed (their copies) -> [wait for the masks] -> sample every row in one Backend::sample ->
// commit (append, stop checks, free) -> push outputs to the streams -> publish stats.
//
// Fork: a request whose prompt equals that of a request in flight that has not produced a token
// yet (the n choices of one API request, submitted together) follows it instead of queueing.
// When the leader's prompt is computed, each follower gets the leader's blocks (shared) and a
// copy of its slot, and samples its first token from the leader's logits with its own sampling,
// seed and constraint; from then on it is an ordinary running sequence (copy-on-write of the
// shared partial block at its first write). So the prompt is computed once and each choice gives
// what it would give alone. A follower that cannot be forked (max_num_seqs, slots) just queues.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <random>
#include <span>
#include <thread>
#include <unordered_map>

#include "core/check.h"
#include "runtime/engine_internal.h"
#include "runtime/kv_manager.h"
#include "runtime/prefix_cache.h"
#include "runtime/mask_worker.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"
#include "runtime/sequence.h"
#include "runtime/stream.h"

namespace dil::runtime {

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
             StepHook* hook, Backend* memory, std::unique_ptr<Drafter> drafter);
  ~EngineImpl() override { shutdown(); }
  std::shared_ptr<RequestStream> submit(GenRequest req) override;
  std::vector<std::shared_ptr<RequestStream>> submit_all(std::vector<GenRequest> reqs) override;
  void cancel(const std::string& id) override;
  EngineStats stats() const override;
  const EngineInfo& info() const override { return info_; }
  void shutdown() override;

 private:
  void loop();
  void handle(Command& c);
  std::string validate(const GenRequest& r) const;
  bool step();
  // Adds s's row (sampling logits row `row`) to the step's sample batch. mask: the allowed
  // tokens of a constrained row, computed during the forward; null for an unconstrained row, or
  // for a forked follower, whose first mask is computed here. False when s ended instead (its
  // grammar allows nothing).
  bool prepare_sample(Sequence* s, int32_t row, std::vector<uint64_t>* mask, SampleBatch& batch);
  void commit_sampled(Sequence* s, const SampleResult& r);
  // A verify step's position (speculative decoding): one row sampled on the host from `lrow`
  // [vocab] through the same specification the device runs (the draws are equal).
  void sample_and_commit(Sequence* s, std::span<const float> lrow, std::vector<uint64_t>* mask);
  // Speculative decoding: drafts for the sequences that decode this step (Sequence::draft).
  void propose_drafts();
  // A drafting chunk's rows ([n_tokens, vocab] from `lrows`): samples position by position and
  // stops at the first token that differs from the draft. Returns the drafts accepted, or -1
  // when the sequence finished (it is destroyed then).
  int verify(Sequence* s, const ScheduledChunk& c, std::span<const float> lrows, std::vector<uint64_t>* mask);
  void run_copies(const std::vector<CopyOp>& ops);
  // The allowed tokens of a constrained row: the constraint's mask plus EOS/stop tokens when
  // its output is complete. False when nothing is allowed (the sequence is then finished).
  bool finish_mask(Sequence* s, std::vector<uint64_t>& mask);
  void commit(Sequence* s, const SampleResult& r);
  Sequence* fork_leader(const Sequence& s) const;
  void release(Sequence* s);  // out of the scheduler, the fork links and live_ (destroys s)
  std::vector<int32_t> min_tokens_ban(const Sequence& s) const;
  void finish(Sequence* s, FinishReason why, std::string error = {});
  void publish_stats();

  // Declaration order = destruction order reversed: the model goes before its backend.
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  EngineOptions opts_;
  EngineInfo info_;
  std::unique_ptr<KvManager> kv_;
  std::unique_ptr<PrefixCache> cache_;  // null: --no-prefix-cache
  std::unique_ptr<Scheduler> sched_;
  StepHook* hook_ = nullptr;  // data-parallel rank: lockstep with the other ranks
  std::unique_ptr<Drafter> drafter_;  // null: no speculative decoding
  int spec_slot_base_ = 0;            // model slots [base, base + n_spec_slots_): verify snapshots
  int n_spec_slots_ = 0;              // so at most this many sequences draft in one step
  int64_t spec_drafts_ = 0, spec_draft_tokens_ = 0, spec_accepted_tokens_ = 0;
  // Engine-thread state.
  std::unordered_map<std::string, std::unique_ptr<Sequence>> live_;  // unfinished, by request id
  std::mt19937_64 seed_gen_;
  int64_t next_seq_id_ = 0;
  int64_t steps_ = 0, prompt_tokens_ = 0, generation_tokens_ = 0;
  int64_t prompt_computed_ = 0, prompt_cached_ = 0, forks_ = 0;
  std::vector<Sequence*> open_leaders_;  // no token yet, not a follower: whom a new request may follow
  int n_followers_ = 0;
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
                       StepHook* hook, Backend* memory, std::unique_ptr<Drafter> drafter)
    : backend_(std::move(backend)), model_(std::move(model)), opts_(opts), hook_(hook), drafter_(std::move(drafter)) {
  const ModelConfig& cfg = model_->config();
  if (opts.block_tokens <= 0 || opts.block_tokens % 128 != 0)
    DIL_FAIL("block_tokens must be a positive multiple of 128, got ", opts.block_tokens);
  for (int r : cfg.compress_ratios)
    if (r > 0 && opts.block_tokens % r != 0)
      DIL_FAIL("block_tokens ", opts.block_tokens, " is not a multiple of compression ratio ", r);
  if (opts.max_num_seqs <= 0 || opts.max_num_batched_tokens <= 0 || opts.max_model_len <= 0)
    DIL_FAIL("max_num_seqs, max_num_batched_tokens and max_model_len must be positive");
  const CacheSpec spec = model_->cache_spec(opts.block_tokens);
  const bool automatic = opts.kv_blocks <= 0 && opts.kv_memory_bytes <= 0;
  const KvBudget budget =
      automatic ? auto_kv_budget(opts, spec, *model_, memory ? memory : backend_.get()) : KvBudget{};
  const PoolPlan plan = plan_pool(opts, spec, budget, drafter_ != nullptr);
  // vLLM's rule: a max_model_len the pool cannot hold once is a start-up error, so every
  // request the server admits (prompt + max_tokens <= max_model_len) fits when the pool is free.
  // Plus one block: a sequence whose partial last block is shared (with a prefix-cache entry or
  // a fork) takes a fresh block for its copy-on-write before it gives the shared one back, and
  // the cache cannot give up a block that a sequence still reads.
  if (plan.n_blocks < pool_blocks_needed(opts))
    DIL_FAIL("KV pool of ", plan.n_blocks, " blocks x ", opts.block_tokens, " tokens (", plan.sizing,
             ") cannot hold one sequence of max_model_len ", opts.max_model_len, " (", pool_blocks_needed(opts),
             " blocks with the copy-on-write block); raise --gpu-memory-utilization / --kv-memory-mb or lower "
             "--max-model-len / --max-num-seqs");
  if (plan.n_blocks > INT32_MAX) DIL_FAIL("too many KV blocks: ", plan.n_blocks);
  model_->allocate_cache(int(plan.n_blocks), plan.n_slots + plan.n_extra_slots + plan.n_spec_slots, opts.block_tokens);
  spec_slot_base_ = plan.n_slots + plan.n_extra_slots;
  n_spec_slots_ = plan.n_spec_slots;
  kv_ = std::make_unique<KvManager>(int32_t(plan.n_blocks), plan.n_slots, opts.block_tokens, spec.bytes_per_block,
                                    spec.bytes_per_slot, plan.n_extra_slots);
  if (opts.enable_prefix_cache) {
    // Everything besides the token ids that changes what a prefix leaves in the cache.
    const std::string salt = str_cat(cfg.model_type, "|", opts.model_dir, "|layers=", cfg.n_layers,
                                     "|vocab=", cfg.vocab_size, "|numerics=", opts.numerics,
                                     "|block_tokens=", opts.block_tokens);
    cache_ = std::make_unique<PrefixCache>(*kv_, salt);
    kv_->set_reclaimer(cache_.get());
  }
  sched_ = std::make_unique<Scheduler>(opts.max_num_seqs, opts.max_num_batched_tokens, *kv_, cache_.get());

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
  info_.kv_sizing = plan.sizing;
  info_.prefix_cache = opts.enable_prefix_cache;
  info_.prefix_cache_slots = plan.n_extra_slots;
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

std::vector<std::shared_ptr<RequestStream>> EngineImpl::submit_all(std::vector<GenRequest> reqs) {
  std::vector<std::shared_ptr<Stream>> streams;
  std::vector<Command> cmds;
  for (GenRequest& r : reqs) {
    if (r.id.empty()) r.id = "req-" + std::to_string(auto_id_.fetch_add(1));
    streams.push_back(std::make_shared<Stream>(r.id));
    cmds.push_back({Command::Kind::Submit, std::move(r), streams.back(), {}});
  }
  const std::vector<std::shared_ptr<RequestStream>> out(streams.begin(), streams.end());
  {
    // One hand-off: the engine thread drains them in one go, before any of them runs.
    std::lock_guard<std::mutex> lk(mu_);
    if (!stop_) {
      for (Command& c : cmds) cmds_.push_back(std::move(c));
      cv_.notify_one();
      return out;
    }
  }
  for (auto& st : streams) {
    GenOutput o;
    o.finish = FinishReason::Error;
    o.error = "engine shut down";
    st->push(std::move(o));
  }
  return out;
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
  if (Sequence* leader = fork_leader(*s)) {
    s->leader = leader;
    leader->followers.push_back(s.get());
    ++n_followers_;
  } else {
    sched_->add(s.get());
    open_leaders_.push_back(s.get());
  }
  live_.emplace(s->request_id, std::move(s));
}

Sequence* EngineImpl::fork_leader(const Sequence& s) const {
  for (Sequence* l : open_leaders_)
    if (l->prompt_len == s.prompt_len && l->tokens == s.tokens) return l;
  return nullptr;
}

void EngineImpl::release(Sequence* s) {
  if (s->leader) {
    auto& f = s->leader->followers;
    f.erase(std::find(f.begin(), f.end(), s));
    --n_followers_;
    s->leader = nullptr;
  }
  // Followers of a leader that ends before its prompt is computed queue on their own.
  for (Sequence* f : s->followers) {
    f->leader = nullptr;
    --n_followers_;
    sched_->add(f);
    open_leaders_.push_back(f);
  }
  s->followers.clear();
  auto it = std::find(open_leaders_.begin(), open_leaders_.end(), s);
  if (it != open_leaders_.end()) open_leaders_.erase(it);
  if (drafter_) drafter_->release(s->id);
  sched_->finish(s);
  live_.erase(s->request_id);  // destroys s
}

void EngineImpl::finish(Sequence* s, FinishReason why, std::string error) {
  GenOutput o;
  o.finish = why;
  o.error = std::move(error);
  o.prompt_tokens = s->prompt_len;
  o.completion_tokens = s->num_generated();
  o.cached_tokens = std::max(s->cached_tokens, 0);
  s->stream->push(std::move(o));
  release(s);
}

void EngineImpl::commit(Sequence* s, const SampleResult& r) {
  s->tokens.push_back(r.token);
  ++generation_tokens_;
  GenOutput o;
  o.prompt_tokens = s->prompt_len;
  o.completion_tokens = s->num_generated();
  o.cached_tokens = std::max(s->cached_tokens, 0);
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
  if (done) release(s);
}

bool EngineImpl::prepare_sample(Sequence* s, int32_t row, std::vector<uint64_t>* mask, SampleBatch& batch) {
  if (s->num_generated() == 0) {  // its prompt is done: where its state came from
    prompt_cached_ += std::max(s->cached_tokens, 0);
    prompt_computed_ += s->prompt_len - std::max(s->cached_tokens, 0);
  }
  std::vector<uint64_t> own;  // [ceil(vocab / 64)] a forked follower's first mask
  if (s->constraint && !mask) {
    own.assign((size_t(info_.vocab_size) + 63) / 64, 0);
    s->constraint->fill_mask(own, s->stop.max_tokens - s->num_generated() - 1);
    mask = &own;
  }
  if (s->constraint && !finish_mask(s, *mask)) return false;
  std::span<const int32_t> all(s->tokens);
  // A constrained row's mask already holds allowed_token_ids and the min_tokens ban.
  const std::vector<int32_t> banned = s->constraint ? std::vector<int32_t>{} : min_tokens_ban(*s);
  const std::span<const uint64_t> allowed = mask ? std::span<const uint64_t>(*mask) : std::span<const uint64_t>();
  batch.add(row, s->sampling, all.first(s->prompt_len), all.subspan(s->prompt_len), s->seed, s->len(), banned,
            allowed);
  return true;
}

void EngineImpl::commit_sampled(Sequence* s, const SampleResult& r) {
  if (r.token < 0) {
    finish(s, FinishReason::Error, "no token can be sampled: every logit is NaN or -inf after the masks");
    return;
  }
  const auto& stops = s->stop.stop_token_ids;
  const bool ends = (!s->stop.ignore_eos && r.token == info_.eos_token_id) ||
                    std::find(stops.begin(), stops.end(), r.token) != stops.end();
  if (s->constraint && !ends) s->constraint->advance(r.token);
  commit(s, r);
}

void EngineImpl::sample_and_commit(Sequence* s, std::span<const float> lrow, std::vector<uint64_t>* mask) {
  SampleBatch sb{int64_t(info_.vocab_size)};
  if (!prepare_sample(s, 0, mask, sb)) return;  // ended (its grammar allows nothing)
  commit_sampled(s, sb.run_host(lrow, opts_.logprobs_mode)[0]);
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
  if (drafter_) propose_drafts();
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
  // Speculative decoding: a drafting chunk's slot is copied to a spare slot first, so that the
  // state its rejected drafts leave can be undone (verify()).
  std::vector<int32_t> spec_slot(sch.chunks.size(), -1);
  int n_spec = 0;
  for (size_t k = 0; k < sch.chunks.size(); ++k) {
    const ScheduledChunk& c = sch.chunks[k];
    SeqChunk sc;
    sc.slot = kv_->slot(c.seq->id);
    sc.start_pos = c.start;
    sc.n_tokens = c.n_tokens;
    sc.blocks = kv_->blocks(c.seq->id);
    sc.want_logits = c.sample;
    sc.all_logits = c.n_draft > 0;
    const int known = c.n_tokens - c.n_draft;
    batch.tokens.insert(batch.tokens.end(), c.seq->tokens.begin() + c.start, c.seq->tokens.begin() + c.start + known);
    if (c.n_draft > 0) {
      batch.tokens.insert(batch.tokens.end(), c.seq->draft.begin(), c.seq->draft.begin() + c.n_draft);
      spec_slot[k] = spec_slot_base_ + n_spec++;
      sch.copies.push_back({CopyOp::Kind::Slot, sc.slot, spec_slot[k]});
    }
    batch.seqs.push_back(std::move(sc));
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
  Tensor logits;  // [rows, vocab] f32 where the model's head wrote it (the device)
  std::vector<std::vector<Sequence*>> forked(sch.chunks.size());  // per chunk: followers forked from it
  std::string failure;
  try {
    run_copies(sch.copies);
    logits = model_->forward_device(batch);
    // What the forward left behind: snapshots at the chunks' ends, forks of finished prompts.
    std::vector<CopyOp> post;
    // Drafts count as computed only once verify() accepted them all.
    for (const ScheduledChunk& c : sch.chunks) c.seq->num_computed += c.n_tokens - c.n_draft;
    sched_->after_forward(sch, &post);
    for (size_t i = 0; i < sch.chunks.size(); ++i) {
      Sequence* s = sch.chunks[i].seq;
      if (!sch.chunks[i].sample || s->num_generated() > 0) continue;
      auto it = std::find(open_leaders_.begin(), open_leaders_.end(), s);
      if (it != open_leaders_.end()) open_leaders_.erase(it);
      for (Sequence* f : s->followers) {
        f->leader = nullptr;
        --n_followers_;
        if (sched_->fork(s, f, &post)) {
          f->cached_tokens = f->prompt_len;
          ++forks_;
          forked[i].push_back(f);
        } else {
          sched_->add(f);  // no room to run it now: it queues (and may hit the prefix cache)
        }
      }
      s->followers.clear();
    }
    run_copies(post);
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
    for (auto& fs : forked)
      for (Sequence* f : fs) finish(f, FinishReason::Error, str_cat("model step failed: ", failure));
    return true;
  }
  ++steps_;
  // Every plain row of the step (and the forked followers of a prompt, from its leader's row) in
  // one Backend::sample: only token ids and the requested logprobs come back from the device. A
  // drafting chunk's rows come to the host and are verified position by position there.
  SampleBatch sb{int64_t(vocab)};
  std::vector<Sequence*> sampled;  // sb's rows in order
  const int64_t n_rows = logits.empty() ? 0 : logits.shape[0];
  int32_t row = 0;
  std::vector<CopyOp> restores;  // verify snapshots back into the slots of rejected drafts
  std::vector<Sequence*> restored;
  std::vector<float> host_rows;  // [n_tokens, vocab] a drafting chunk's logits
  for (size_t i = 0; i < sch.chunks.size(); ++i) {
    const ScheduledChunk& c = sch.chunks[i];
    if (!c.sample) continue;
    if (c.n_draft > 0) {
      const int32_t rows = c.n_tokens;
      DIL_CHECK(row + rows <= n_rows, "model returned ", n_rows, " logits rows, rows ", row, "+", rows, " wanted");
      std::span<const float> lrows;
      if (logits.device == Device::CPU) {
        lrows = std::span<const float>(logits.ptr<float>() + size_t(row) * vocab, size_t(rows) * vocab);
      } else {
        host_rows.resize(size_t(rows) * vocab);
        backend_->download(host_rows.data(), logits.rows(row, row + rows));
        lrows = host_rows;
      }
      row += rows;
      Sequence* s = c.seq;
      const int32_t slot = kv_->slot(s->id);
      const int accepted = verify(s, c, lrows, s->constraint ? &masks[i] : nullptr);  // may destroy s
      if (accepted < 0) continue;
      if (accepted == c.n_draft) {
        s->num_computed += c.n_draft;
      } else {
        // The slot holds the state after rejected tokens: back to the state before the chunk,
        // and the accepted tokens are computed again by the next step (without drafts).
        s->num_computed = c.start;
        restores.push_back({CopyOp::Kind::Slot, spec_slot[i], slot});
        restored.push_back(s);
      }
      continue;
    }
    DIL_CHECK(row < n_rows, "model returned ", n_rows, " logits rows, row ", row, " wanted");
    if (prepare_sample(c.seq, row, c.seq->constraint ? &masks[i] : nullptr, sb)) sampled.push_back(c.seq);
    for (Sequence* f : forked[i])
      if (prepare_sample(f, row, nullptr, sb)) sampled.push_back(f);
    ++row;
  }
  if (!restores.empty()) {
    try {
      run_copies(restores);
    } catch (const std::exception& e) {
      if (hook_) hook_->fatal(str_cat("speculative restore failed: ", e.what()));
      for (Sequence* s : restored) finish(s, FinishReason::Error, str_cat("speculative restore failed: ", e.what()));
    }
  }
  if (sampled.empty()) return true;
  const std::vector<SampleResult> res =
      backend_ && logits.device == backend_->device()
          ? sb.run(*backend_, logits, opts_.logprobs_mode)
          : sb.run_host(std::span<const float>(logits.ptr<float>(), size_t(logits.numel())), opts_.logprobs_mode);
  for (size_t k = 0; k < sampled.size(); ++k) commit_sampled(sampled[k], res[k]);  // may destroy sampled[k]
  return true;
}

// Drafts are proposed only for sequences whose every known token but the last is computed
// (plain decode): after a rejection the next step computes the accepted tokens again without a
// draft, so the restored state never falls behind by more than one verify step.
void EngineImpl::propose_drafts() {
  std::vector<Sequence*> seqs;
  for (auto& [id, s] : live_) {
    s->draft.clear();
    if (s->status != Sequence::Status::Running || s->leader || s->num_generated() < 1) continue;
    if (s->num_computed != s->len() - 1 || !s->snapshot_at.empty()) continue;
    if (s->stop.max_tokens - s->num_generated() - 1 < 1) continue;  // the bonus token ends it
    seqs.push_back(s.get());
  }
  if (seqs.empty()) return;
  std::sort(seqs.begin(), seqs.end(), [](const Sequence* a, const Sequence* b) { return a->id < b->id; });
  if (int(seqs.size()) > n_spec_slots_) seqs.resize(size_t(n_spec_slots_));  // the oldest draft
  std::vector<DraftInput> in;
  in.reserve(seqs.size());
  for (Sequence* s : seqs)
    in.push_back({s->id, s->request_id, s->tokens, s->prompt_len,
                  std::min(drafter_->max_draft_tokens(), s->stop.max_tokens - s->num_generated() - 1),
                  kv_->slot(s->id)});
  std::vector<std::vector<int32_t>> out;
  drafter_->propose(in, &out);
  DIL_CHECK(out.size() == in.size(), "drafter returned ", out.size(), " proposals for ", in.size(), " sequences");
  for (size_t k = 0; k < seqs.size(); ++k) {
    std::vector<int32_t>& d = out[k];
    if (int(d.size()) > in[k].max_tokens) d.resize(size_t(in[k].max_tokens));
    for (int32_t t : d) DIL_CHECK(t >= 0 && t < info_.vocab_size, "drafter proposed token ", t);
    seqs[k]->draft = std::move(d);
  }
}

// Every position is sampled exactly as a non-speculative step would sample it (same logits
// row, penalties over the tokens before it, seed keyed by its position, constraint advanced
// token by token), and the loop stops at the first sampled token that is not the draft's.
// So the output is the target's token for token; with temperature > 0 this is speculative
// sampling with the draft as a point proposal: a draft d is kept with probability p(d), and a
// rejected position emits a token of p conditioned on != d, i.e. the residual (p - q)+ of a
// proposal q = one-hot(d), normalized.
int EngineImpl::verify(Sequence* s, const ScheduledChunk& c, std::span<const float> lrows, std::vector<uint64_t>* mask) {
  const size_t vocab = size_t(info_.vocab_size);
  const std::string rid = s->request_id;
  const std::vector<int32_t> draft(s->draft.begin(), s->draft.begin() + c.n_draft);
  s->draft.clear();
  const int first = c.n_tokens - c.n_draft - 1;  // the row of the last known token
  ++spec_drafts_;
  spec_draft_tokens_ += c.n_draft;
  int accepted = 0;
  for (int i = 0; i <= c.n_draft; ++i) {
    sample_and_commit(s, lrows.subspan(size_t(first + i) * vocab, vocab), i == 0 ? mask : nullptr);
    if (!live_.count(rid)) {  // finished (stop, length, grammar): s is gone
      spec_accepted_tokens_ += accepted;
      return -1;
    }
    if (i == c.n_draft || s->tokens.back() != draft[size_t(i)]) break;
    ++accepted;
  }
  spec_accepted_tokens_ += accepted;
  return accepted;
}

void EngineImpl::run_copies(const std::vector<CopyOp>& ops) {
  if (ops.empty()) return;
  std::vector<CacheCopy> cc;
  cc.reserve(ops.size());
  for (const CopyOp& op : ops)
    cc.push_back({op.kind == CopyOp::Kind::Block ? CacheCopy::Kind::Block : CacheCopy::Kind::Slot, op.src, op.dst});
  model_->copy_cache(cc);
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
  st.waiting = int(sched_->n_waiting()) + n_followers_;
  st.preemptions = sched_->preemptions();
  st.prompt_tokens_total = prompt_tokens_;
  st.generation_tokens_total = generation_tokens_;
  st.steps = steps_;
  st.kv_blocks_total = kv_->total_blocks();
  st.kv_blocks_used = kv_->used_blocks();
  st.kv_usage = st.kv_blocks_total ? double(st.kv_blocks_used) / double(st.kv_blocks_total) : 0.0;
  st.kv_slots_total = kv_->total_slots();
  st.kv_slots_used = kv_->seq_slots();
  st.kv_bytes_total = int64_t(kv_->total_bytes());
  st.kv_bytes_used = int64_t(kv_->used_bytes());
  st.prefix_cache_queries = sched_->prefix_counters().queries;
  st.prefix_cache_hits = sched_->prefix_counters().hits;
  st.prompt_tokens_computed = prompt_computed_;
  st.prompt_tokens_cached = prompt_cached_;
  st.forks = forks_;
  st.prefix_cache_blocks = kv_->cached_blocks();
  st.prefix_cache_snapshots = kv_->snapshot_slots();
  st.prefix_cache_evictions = cache_ ? cache_->evictions() : 0;
  st.mask_seconds_total = mask_seconds_;
  st.mask_wait_seconds_total = mask_wait_seconds_;
  st.spec_decode_num_drafts = spec_drafts_;
  st.spec_decode_num_draft_tokens = spec_draft_tokens_;
  st.spec_decode_num_accepted_tokens = spec_accepted_tokens_;
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
                                               std::unique_ptr<Backend> backend, StepHook* hook, Backend* memory,
                                               std::unique_ptr<Drafter> drafter) {
  DIL_CHECK(model != nullptr, "make_engine_with_model without a model");
  return std::make_unique<EngineImpl>(opts, std::move(model), std::move(backend), hook, memory, std::move(drafter));
}

}  // namespace dil::runtime
