// The engine's public API: the only header that src/server and tools include to run a model.
// One engine thread owns all scheduling and cache state; submit()/cancel() are the only
// cross-thread hand-offs (a queue in, a RequestStream out).
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dil/load_progress.h"

namespace dil {

// Sampling follows vLLM v1 (docs: vllm.v1.sample.sampler): logit bias, then penalties
// (repetition on prompt+output tokens, multiplicative; frequency/presence on output tokens,
// OpenAI's subtraction), then greedy or temperature -> min-p -> top-k -> top-p -> draw.
struct SamplingParams {
  float temperature = 1.0f;  // < 1e-5 = greedy (argmax, ties -> lowest id)
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;
  float min_p = 0.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  std::map<int32_t, float> logit_bias;
  std::vector<int32_t> allowed_token_ids;  // non-empty: every other token is masked (vLLM)
  std::optional<uint64_t> seed;  // seeded: draws keyed by (seed, position), batch-independent
  int logprobs = -1;             // -1: none; 0: chosen token only; N: plus top-N (N <= max_logprobs)
};

// Which distribution logprobs describe. Raw (vLLM's default "raw_logprobs"): log_softmax of the
// model's logits before bias, penalties, temperature and filters. Processed: log_softmax of the
// logits the token was drawn from (after all of them; masked tokens -inf).
enum class LogprobsMode { Raw, Processed };

struct StopParams {
  int max_tokens = 16;                  // >= 1; prompt + max_tokens <= max_model_len
  int min_tokens = 0;                   // EOS and stop_token_ids are masked until this many
                                        // tokens are generated (vLLM's min_tokens)
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;  // in addition to the model's EOS
};

// What a request may generate next (structured output: src/server wraps a grammar matcher).
// The engine calls it on its own threads only, one call at a time per request: fill_mask
// before each sampling step (overlapped with the model's forward), advance after it.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets bit t (mask[t / 64] >> t % 64 & 1) of every token id that may come next. `mask` is
  // zeroed and has ceil(vocab_size / 64) words. EOS and the stop tokens are the engine's: it
  // allows them exactly when accepting(). `remaining`: tokens the request may still generate
  // after this one, so the constraint can steer to a complete output before max_tokens.
  virtual void fill_mask(std::span<uint64_t> mask, int remaining) = 0;
  // The sampled token (one that fill_mask allowed; never EOS or a stop token).
  virtual void advance(int32_t token) = 0;
  // The output so far is complete: EOS and the stop tokens may end it.
  virtual bool accepting() const = 0;
};

struct GenRequest {
  std::string id;
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  StopParams stop;
  // Structured output (null: unconstrained). Masked tokens get -inf logits before the
  // sampler's bias, penalties and filters; raw logprobs still describe the model's logits.
  // allowed_token_ids and the min_tokens ban narrow the mask (the ban yields where it would
  // leave nothing). A request whose mask allows no token finishes: Stop when its output is
  // complete, otherwise Error. Data-parallel engines run constrained requests on rank 0 (the
  // constraint lives in its process).
  std::shared_ptr<TokenConstraint> constraint;
  // Data-parallel engines (EngineInfo::dp_size > 1): the rank that must run this request
  // (HTTP header X-Data-Parallel-Rank); -1: the least loaded rank.
  int dp_rank = -1;
};

enum class FinishReason { None, Length, Stop, Cancelled, Error };

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct GenToken {
  int32_t token = 0;
  float logprob = 0.0f;                 // valid when sampling.logprobs >= 0
  std::vector<TokenLogprob> top;        // top-N when sampling.logprobs > 0
};

struct GenOutput {
  std::vector<GenToken> tokens;         // new tokens since the previous output
  FinishReason finish = FinishReason::None;
  int32_t stop_token = -1;              // the stop/EOS token that ended it (not in `tokens`,
                                        // but counted in completion_tokens)
  std::string error;                    // when finish == Error
  int prompt_tokens = 0;
  int completion_tokens = 0;
  // Prompt tokens this request did not compute: found in the prefix cache, or all of them for a
  // choice forked from another request's prefill of the same prompt (n > 1).
  int cached_tokens = 0;
};

// Output side of one request. Thread-safe; the engine pushes, the connection thread pops.
class RequestStream {
 public:
  virtual ~RequestStream() = default;
  // Waits up to `timeout` for output. Returns false on timeout. After an output with
  // finish != None, no further outputs come.
  virtual bool next(GenOutput* out, std::chrono::milliseconds timeout) = 0;
  virtual const std::string& id() const = 0;
};

struct EngineStats {
  int running = 0;
  int waiting = 0;
  int swapped = 0;
  int64_t preemptions = 0;
  int64_t prompt_tokens_total = 0;
  int64_t generation_tokens_total = 0;
  int64_t steps = 0;
  double kv_usage = 0.0;  // fraction of KV blocks in use
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_slots_total = 0;  // per-sequence state slots (SWA rings, compressor state)
  int64_t kv_slots_used = 0;
  int64_t kv_bytes_total = 0;  // blocks * bytes_per_block + slots * bytes_per_slot
  int64_t kv_bytes_used = 0;   // what sequences hold (not the prefix cache: it is given back on demand)
  // Prefix cache, in tokens, over every admission (vLLM's prefix_cache_queries / _hits).
  int64_t prefix_cache_queries = 0;
  int64_t prefix_cache_hits = 0;
  // Prompt tokens by where their state came from, once per request at its first token (vLLM's
  // prompt_tokens_by_source): computed, or not (prefix-cache hit, or forked from another request).
  int64_t prompt_tokens_computed = 0;
  int64_t prompt_tokens_cached = 0;
  int64_t forks = 0;                   // requests forked from another's prefill instead of computing it
  int64_t prefix_cache_blocks = 0;     // blocks the cache holds (some also read by sequences)
  int64_t prefix_cache_snapshots = 0;  // state slots holding a snapshot
  int64_t prefix_cache_evictions = 0;  // entries dropped to give blocks or slots back
  // Structured output: time spent computing token masks (on the mask thread, overlapped with
  // the forward) and time the engine thread waited for them after its forward.
  double mask_seconds_total = 0.0;
  double mask_wait_seconds_total = 0.0;
  // Speculative decoding (vLLM's spec_decode_* counters): verify steps that scored a draft, the
  // draft tokens scored, and those the target accepted. Mean acceptance length (tokens emitted
  // per verify step) = 1 + accepted / drafts.
  int64_t spec_decode_num_drafts = 0;
  int64_t spec_decode_num_draft_tokens = 0;
  int64_t spec_decode_num_accepted_tokens = 0;
  // Data-parallel engines: each rank's queues, in rank order (the fields above sum over ranks).
  // Empty on a single-rank engine.
  struct RankLoad {
    int running = 0;
    int waiting = 0;
  };
  std::vector<RankLoad> dp_ranks;
};

struct EngineInfo {
  std::string model_name;
  int vocab_size = 0;
  int max_model_len = 0;
  int32_t eos_token_id = 1;
  int32_t bos_token_id = 0;
  int block_tokens = 0;            // KV cache geometry chosen at start-up
  int64_t kv_blocks = 0;
  int kv_slots = 0;
  int64_t kv_bytes_per_block = 0;
  int64_t kv_bytes_per_slot = 0;
  std::string kv_sizing;           // how the pool was sized (the budget's source), for the log
  bool prefix_cache = false;       // EngineOptions::enable_prefix_cache
  int prefix_cache_slots = 0;      // slots beyond kv_slots, for prefix-cache snapshots only
  int dp_size = 1;                 // data-parallel ranks behind this engine (GenRequest::dp_rank)
};

class Engine {
 public:
  virtual ~Engine() = default;
  // Never blocks on model work. Invalid requests (too long, bad ids, an id already in flight)
  // finish with Error on their stream. An empty id gets a generated one (stream->id()).
  virtual std::shared_ptr<RequestStream> submit(GenRequest req) = 0;
  // Several requests at once (the n choices of one API request): the engine sees them in the same
  // step, so that requests with the same prompt are prefilled once and forked (each keeps its own
  // sampling and seed, and gives what it would give alone). Streams in request order.
  virtual std::vector<std::shared_ptr<RequestStream>> submit_all(std::vector<GenRequest> reqs) {
    std::vector<std::shared_ptr<RequestStream>> out;
    for (GenRequest& r : reqs) out.push_back(submit(std::move(r)));
    return out;
  }
  // Frees the request's state within one step; its stream ends with Cancelled. Harmless for
  // ids that already finished or never existed.
  virtual void cancel(const std::string& id) = 0;
  virtual EngineStats stats() const = 0;
  virtual const EngineInfo& info() const = 0;
  // Stops the engine thread; unfinished requests end with Error ("engine shut down").
  // Idempotent; the destructor calls it.
  virtual void shutdown() = 0;
};

struct EngineOptions {
  std::string model_dir;
  std::string device = "cpu";        // cpu | cuda
  int device_index = 0;               // which GPU (cuda)
  std::string numerics = "official";  // official | reference
  int max_num_seqs = 256;             // vLLM's default; each running sequence holds a state slot
  int max_num_batched_tokens = 2048;
  int max_model_len = 4096;
  // KV pool size (runtime/pool_sizing.cpp): kv_blocks blocks if > 0; else blocks + slots within
  // kv_memory_bytes if > 0; else automatic: on CUDA gpu_memory_utilization x the device's memory
  // minus what is in use after load and the scratch of a profiling step (vLLM's rule), on the
  // CPU min(gpu_memory_utilization x MemAvailable, what max_num_seqs sequences of max_model_len
  // can use).
  int64_t kv_blocks = 0;
  int64_t kv_memory_bytes = 0;
  double gpu_memory_utilization = 0.90;
  int block_tokens = 128;
  int kv_slots = 0;                   // state slots; 0: max_num_seqs (automatic sizing: fewer if they do not fit)
  // Prefix cache (runtime/prefix_cache.h): reuse the blocks and a snapshot of the state of a
  // cached prefix. Snapshots live in idle state slots and in prefix_cache_slots more (part of
  // kv_memory_bytes); LRU eviction gives blocks and slots back on demand.
  bool enable_prefix_cache = true;
  int prefix_cache_slots = 16;
  uint64_t seed = 0;                  // seeds requests without a seed; 0: from std::random_device
  LogprobsMode logprobs_mode = LogprobsMode::Raw;
  int max_logprobs = 20;              // largest accepted SamplingParams::logprobs
  LoadProgressFn on_load_progress;    // ModelOptions::on_progress of the model's load
  // Speculative decoding (runtime/drafter.h): "off"; "ngram" (prompt lookup: the tokens that
  // followed the latest earlier occurrence of the last 1..4 tokens, vLLM's [ngram]); "mtp" (V4's
  // MTP layer mtp.0); "dspark" (V4.1's DSpark drafter mtp.0..2, at most dspark_block_size tokens).
  // Greedy and seeded outputs are the same with and without it, token for token.
  std::string speculative = "off";
  int num_speculative_tokens = 3;     // most draft tokens per sequence and step (>= 1)
  // dspark: cut each draft before the first position whose prefix survival estimate, the product
  // of sigmoid(confidence logit) over the positions so far, is below this (0: never cut). The
  // head is used uncalibrated (the DSpark paper's temperature scaling is not applied); any cut
  // keeps the outputs, it only changes how many tokens are verified.
  double dspark_min_survival = 0.0;
  // Weights: "safetensors" (the model folder's checkpoint) or "dummy" (random weights in the
  // official formats generated from config.json: serving at real dimensions for timing, the
  // outputs are not the model's). `layers`: the backbone layers built and run (empty: all); a
  // subset times a model that does not fit, as `bench` does (ModelOptions::layers).
  std::string load_format = "safetensors";
  std::vector<int> layers;
};

std::unique_ptr<Engine> make_engine(const EngineOptions& opts);  // throws dil::Error

}  // namespace dil
