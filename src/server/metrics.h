// Prometheus metrics of the server, named like vLLM's (`vllm:*`) so existing dashboards and
// routers read them, plus `dil:*` for what is ours. Thread-safe: connection threads record,
// /metrics renders. Engine-side gauges (running, waiting, KV usage) are read from
// Engine::stats() at render time, so they are never stale.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "dil/engine.h"

namespace dil::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);  // ascending; +Inf is implicit
  void observe(double v);
  // Appends `name_bucket{le=...}`, `name_sum`, `name_count` lines with `labels` (no braces).
  void render(std::string* out, const std::string& name, const std::string& labels) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // [bounds_.size() + 1], last is +Inf; not cumulative
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

// The connection layer's state at scrape time.
struct HttpGauges {
  int64_t open_connections = 0;
  int64_t handler_threads = 0;
  bool draining = false;
};

class Metrics {
 public:
  explicit Metrics(std::string model_name);

  void request_started();                         // a generation entered the server
  void request_finished(const std::string& reason, int prompt_tokens, int generation_tokens,
                        double e2e_s);            // reason: stop|length|abort|error
  void first_token(double ttft_s);
  void inter_token(double itl_s, int n_tokens);   // n_tokens arrived together after itl_s
  void http_response(int status);
  int64_t in_flight() const;

  std::string render(const EngineStats& engine, const HttpGauges& http = {}) const;  // text/plain; version=0.0.4

 private:
  mutable std::mutex mu_;
  std::string labels_;  // model_name="..."
  int64_t in_flight_ = 0;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0;
  std::map<std::string, int64_t> finished_;  // finished_reason -> count
  std::map<int, int64_t> http_;              // status -> count
  Histogram ttft_, itl_, e2e_, prompt_len_, gen_len_;
};

}  // namespace dil::server
