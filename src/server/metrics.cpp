#include "server/metrics.h"

#include <cmath>
#include <cstdio>

namespace dil::server {
namespace {

std::string fmt(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// Label values in the text format escape backslash, double quote and newline.
std::string escape_label(const std::string& v) {
  std::string o;
  for (char c : v) {
    if (c == '\\') o += "\\\\";
    else if (c == '"') o += "\\\"";
    else if (c == '\n') o += "\\n";
    else o += c;
  }
  return o;
}

void header(std::string* out, const std::string& name, const char* type, const char* help) {
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void sample(std::string* out, const std::string& name, const std::string& labels, double v) {
  *out += name + "{" + labels + "} " + fmt(v) + "\n";
}

// Bucket bounds close to vLLM's, so dashboards' quantile queries look alike.
const std::vector<double> kTtft = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                   0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kItl = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
                                  0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kE2e = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0,
                                  20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0};
const std::vector<double> kTokens = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000,
                                     10000, 20000, 50000, 100000, 200000, 500000, 1000000};

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(std::string* out, const std::string& name, const std::string& labels) const {
  const std::string sep = labels.empty() ? "" : ",";
  uint64_t cum = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cum += counts_[i];
    const std::string le = i < bounds_.size() ? fmt(bounds_[i]) : "+Inf";
    *out += name + "_bucket{" + labels + sep + "le=\"" + le + "\"} " + std::to_string(cum) + "\n";
  }
  *out += name + "_sum{" + labels + "} " + fmt(sum_) + "\n";
  *out += name + "_count{" + labels + "} " + std::to_string(count_) + "\n";
}

Metrics::Metrics(std::string model_name)
    : labels_("model_name=\"" + escape_label(model_name) + "\""),
      ttft_(kTtft), itl_(kItl), e2e_(kE2e), prompt_len_(kTokens), gen_len_(kTokens) {}

void Metrics::request_started() {
  std::lock_guard<std::mutex> l(mu_);
  ++in_flight_;
}

void Metrics::request_finished(const std::string& reason, int prompt_tokens, int generation_tokens,
                               double e2e_s) {
  std::lock_guard<std::mutex> l(mu_);
  --in_flight_;
  ++finished_[reason];
  prompt_tokens_ += prompt_tokens;
  generation_tokens_ += generation_tokens;
  e2e_.observe(e2e_s);
  prompt_len_.observe(prompt_tokens);
  gen_len_.observe(generation_tokens);
}

void Metrics::first_token(double ttft_s) {
  std::lock_guard<std::mutex> l(mu_);
  ttft_.observe(ttft_s);
}

void Metrics::inter_token(double itl_s, int n_tokens) {
  std::lock_guard<std::mutex> l(mu_);
  // Tokens that arrive together share the gap (as vLLM records per-token latency).
  for (int i = 0; i < n_tokens; ++i) itl_.observe(itl_s / n_tokens);
}

void Metrics::http_response(int status) {
  std::lock_guard<std::mutex> l(mu_);
  ++http_[status];
}

int64_t Metrics::in_flight() const {
  std::lock_guard<std::mutex> l(mu_);
  return in_flight_;
}

std::string Metrics::render(const EngineStats& e, const HttpGauges& h) const {
  std::lock_guard<std::mutex> l(mu_);
  std::string o;
  const std::string& L = labels_;
  header(&o, "vllm:num_requests_running", "gauge", "Requests in the engine's running batch.");
  sample(&o, "vllm:num_requests_running", L, e.running);
  header(&o, "vllm:num_requests_waiting", "gauge", "Requests waiting to be scheduled.");
  sample(&o, "vllm:num_requests_waiting", L, e.waiting);
  header(&o, "vllm:kv_cache_usage_perc", "gauge", "Fraction of KV-cache blocks in use (0-1).");
  sample(&o, "vllm:kv_cache_usage_perc", L, e.kv_usage);
  header(&o, "vllm:num_preemptions_total", "counter", "Preemptions by the scheduler.");
  sample(&o, "vllm:num_preemptions_total", L, double(e.preemptions));
  header(&o, "vllm:prefix_cache_queries_total", "counter",
         "Prefix cache queries, in tokens: the tokens of every sequence looked up at admission.");
  sample(&o, "vllm:prefix_cache_queries_total", L, double(e.prefix_cache_queries));
  header(&o, "vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in tokens: queried tokens found cached.");
  sample(&o, "vllm:prefix_cache_hits_total", L, double(e.prefix_cache_hits));
  header(&o, "vllm:prompt_tokens_by_source_total", "counter",
         "Prompt tokens by where their state came from (local_cache_hit: the prefix cache or a fork of "
         "another request's prefill of the same prompt).");
  sample(&o, "vllm:prompt_tokens_by_source_total", L + ",source=\"local_compute\"", double(e.prompt_tokens_computed));
  sample(&o, "vllm:prompt_tokens_by_source_total", L + ",source=\"local_cache_hit\"", double(e.prompt_tokens_cached));
  header(&o, "vllm:prompt_tokens_total", "counter", "Prompt tokens of finished requests.");
  sample(&o, "vllm:prompt_tokens_total", L, double(prompt_tokens_));
  header(&o, "vllm:generation_tokens_total", "counter", "Generated tokens of finished requests.");
  sample(&o, "vllm:generation_tokens_total", L, double(generation_tokens_));
  header(&o, "vllm:request_success_total", "counter", "Finished requests by finish reason.");
  for (const char* r : {"stop", "length", "abort", "error"}) {
    auto it = finished_.find(r);
    sample(&o, "vllm:request_success_total", L + ",finished_reason=\"" + r + "\"",
           double(it == finished_.end() ? 0 : it->second));
  }
  header(&o, "vllm:time_to_first_token_seconds", "histogram", "Time to first token.");
  ttft_.render(&o, "vllm:time_to_first_token_seconds", L);
  header(&o, "vllm:inter_token_latency_seconds", "histogram", "Time between output tokens.");
  itl_.render(&o, "vllm:inter_token_latency_seconds", L);
  header(&o, "vllm:e2e_request_latency_seconds", "histogram", "End-to-end request latency.");
  e2e_.render(&o, "vllm:e2e_request_latency_seconds", L);
  header(&o, "vllm:request_prompt_tokens", "histogram", "Prompt length of finished requests.");
  prompt_len_.render(&o, "vllm:request_prompt_tokens", L);
  header(&o, "vllm:request_generation_tokens", "histogram", "Output length of finished requests.");
  gen_len_.render(&o, "vllm:request_generation_tokens", L);
  // Speculative decoding (vLLM v1's SpecDecodingProm names): verify steps with a draft, draft
  // tokens scored, draft tokens accepted; the mean acceptance length is 1 + accepted / drafts.
  header(&o, "vllm:spec_decode_num_drafts_total", "counter", "Speculative decoding: verify steps that scored a draft.");
  sample(&o, "vllm:spec_decode_num_drafts_total", L, double(e.spec_decode_num_drafts));
  header(&o, "vllm:spec_decode_num_draft_tokens_total", "counter", "Speculative decoding: draft tokens scored.");
  sample(&o, "vllm:spec_decode_num_draft_tokens_total", L, double(e.spec_decode_num_draft_tokens));
  header(&o, "vllm:spec_decode_num_accepted_tokens_total", "counter", "Speculative decoding: draft tokens accepted.");
  sample(&o, "vllm:spec_decode_num_accepted_tokens_total", L, double(e.spec_decode_num_accepted_tokens));
  header(&o, "dil:spec_decode_mean_acceptance_length", "gauge",
         "Speculative decoding: tokens emitted per verify step, 1 + accepted / drafts (0 before any draft).");
  sample(&o, "dil:spec_decode_mean_acceptance_length", L,
         e.spec_decode_num_drafts ? 1.0 + double(e.spec_decode_num_accepted_tokens) / double(e.spec_decode_num_drafts)
                                  : 0.0);
  header(&o, "dil:requests_in_flight", "gauge",
         "Generations holding server state (connection-side), incl. queued ones.");
  sample(&o, "dil:requests_in_flight", L, double(in_flight_));
  header(&o, "dil:kv_blocks_used", "gauge", "KV-cache blocks in use.");
  sample(&o, "dil:kv_blocks_used", L, double(e.kv_blocks_used));
  header(&o, "dil:kv_blocks_total", "gauge", "KV-cache blocks in the pool.");
  sample(&o, "dil:kv_blocks_total", L, double(e.kv_blocks_total));
  header(&o, "dil:prefix_cache_blocks", "gauge", "KV blocks the prefix cache holds (given back on demand).");
  sample(&o, "dil:prefix_cache_blocks", L, double(e.prefix_cache_blocks));
  header(&o, "dil:prefix_cache_snapshots", "gauge", "State slots holding a prefix-cache snapshot.");
  sample(&o, "dil:prefix_cache_snapshots", L, double(e.prefix_cache_snapshots));
  header(&o, "dil:prefix_cache_evictions_total", "counter", "Prefix-cache entries evicted to give memory back.");
  sample(&o, "dil:prefix_cache_evictions_total", L, double(e.prefix_cache_evictions));
  header(&o, "dil:forks_total", "counter", "Requests forked from another request's prefill of the same prompt (n > 1).");
  sample(&o, "dil:forks_total", L, double(e.forks));
  header(&o, "dil:engine_steps_total", "counter", "Engine steps run.");
  sample(&o, "dil:engine_steps_total", L, double(e.steps));
  header(&o, "dil:structured_output_mask_seconds_total", "counter",
         "Time computing structured-output token masks (overlapped with the model's forward).");
  sample(&o, "dil:structured_output_mask_seconds_total", L, e.mask_seconds_total);
  header(&o, "dil:structured_output_wait_seconds_total", "counter",
         "Time the engine waited for structured-output masks after its forward.");
  sample(&o, "dil:structured_output_wait_seconds_total", L, e.mask_wait_seconds_total);
  if (!e.dp_ranks.empty()) {
    header(&o, "dil:dp_rank_requests_running", "gauge", "Requests running on each data-parallel rank.");
    for (size_t r = 0; r < e.dp_ranks.size(); ++r)
      sample(&o, "dil:dp_rank_requests_running", L + ",dp_rank=\"" + std::to_string(r) + "\"",
             double(e.dp_ranks[r].running));
    header(&o, "dil:dp_rank_requests_waiting", "gauge",
           "Requests waiting on each data-parallel rank (incl. routed, not yet received).");
    for (size_t r = 0; r < e.dp_ranks.size(); ++r)
      sample(&o, "dil:dp_rank_requests_waiting", L + ",dp_rank=\"" + std::to_string(r) + "\"",
             double(e.dp_ranks[r].waiting));
  }
  header(&o, "dil:http_connections_open", "gauge", "Open client connections (idle keep-alive ones included).");
  sample(&o, "dil:http_connections_open", L, double(h.open_connections));
  header(&o, "dil:http_handler_threads", "gauge", "Request handler threads alive (the pool grows and shrinks).");
  sample(&o, "dil:http_handler_threads", L, double(h.handler_threads));
  header(&o, "dil:server_draining", "gauge", "1 while a graceful shutdown drains running requests.");
  sample(&o, "dil:server_draining", L, h.draining ? 1.0 : 0.0);
  header(&o, "dil:http_responses_total", "counter", "HTTP responses by status code.");
  for (const auto& [code, n] : http_)
    sample(&o, "dil:http_responses_total", L + ",code=\"" + std::to_string(code) + "\"", double(n));
  return o;
}

}  // namespace dil::server
