// Helpers shared by the engine tests (fake model and the real v4-tiny model): a fixed mix of
// requests, and drivers that run them alone or all at once and collect every stream.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dil/engine.h"

namespace dil::testing {

struct Result {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<TokenLogprob>> top;
  FinishReason finish = FinishReason::None;
  int32_t stop_token = -1;
  std::string error;
  int completion_tokens = 0;
  int cached_tokens = 0;  // not compared: a prefix-cache hit must not change anything else
  bool operator==(const Result& o) const {
    if (top.size() != o.top.size()) return false;
    for (size_t i = 0; i < top.size(); ++i) {
      if (top[i].size() != o.top[i].size()) return false;
      for (size_t j = 0; j < top[i].size(); ++j)
        if (top[i][j].token != o.top[i][j].token || top[i][j].logprob != o.top[i][j].logprob) return false;
    }
    return tokens == o.tokens && logprobs == o.logprobs && finish == o.finish && stop_token == o.stop_token &&
           error == o.error && completion_tokens == o.completion_tokens;
  }
};

inline std::ostream& operator<<(std::ostream& os, const Result& r) {
  os << "finish=" << int(r.finish) << " stop=" << r.stop_token << " err='" << r.error << "' tokens=[";
  for (int32_t t : r.tokens) os << t << ",";
  return os << "]";
}

// Reads `s` to its end (fails the test after `limit`).
inline Result drain(RequestStream& s, std::chrono::seconds limit = std::chrono::seconds(120)) {
  Result r;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  GenOutput o;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!s.next(&o, std::chrono::milliseconds(100))) continue;
    for (const GenToken& t : o.tokens) {
      r.tokens.push_back(t.token);
      r.logprobs.push_back(t.logprob);
      r.top.push_back(t.top);
    }
    if (o.finish != FinishReason::None) {
      r.finish = o.finish;
      r.stop_token = o.stop_token;
      r.error = o.error;
      r.completion_tokens = o.completion_tokens;
      r.cached_tokens = o.cached_tokens;
      return r;
    }
  }
  ADD_FAILURE() << "stream " << s.id() << " did not finish in time";
  return r;
}

// Submits every request at once, then reads every stream.
inline std::vector<Result> run_together(Engine& e, const std::vector<GenRequest>& reqs) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const GenRequest& r : reqs) streams.push_back(e.submit(r));
  std::vector<Result> out;
  for (auto& s : streams) out.push_back(drain(*s));
  return out;
}

// Every request in one hand-off (Engine::submit_all: same prompts are prefilled once).
inline std::vector<Result> run_all(Engine& e, const std::vector<GenRequest>& reqs) {
  auto streams = e.submit_all(reqs);
  std::vector<Result> out;
  for (auto& s : streams) out.push_back(drain(*s));
  return out;
}

// One request at a time: each runs alone in the engine.
inline std::vector<Result> run_alone(Engine& e, const std::vector<GenRequest>& reqs) {
  std::vector<Result> out;
  for (const GenRequest& r : reqs) out.push_back(drain(*e.submit(r)));
  return out;
}

// Polls stats() until `pred` holds (false after `limit`).
inline bool wait_stats(const Engine& e, const std::function<bool(const EngineStats&)>& pred,
                       std::chrono::milliseconds limit = std::chrono::milliseconds(120000)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred(e.stats())) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return pred(e.stats());
}

// 16 requests of different lengths (across the 128-token block boundaries) and sampling
// settings: greedy, seeded temperature + top-k/top-p, seeded min-p + penalties + bias + logprobs.
// `lens`: the 16 prompt lengths.
inline const std::vector<int> kLongMix = {1, 5, 17, 64, 127, 128, 129, 200, 255, 256, 257, 300, 3, 90, 150, 33};
inline std::vector<GenRequest> mixed_requests(int vocab, const std::vector<int>& lens = kLongMix) {
  std::vector<GenRequest> reqs;
  for (int i = 0; i < int(lens.size()); ++i) {
    GenRequest r;
    r.id = "r" + std::to_string(i);
    const int len = lens[size_t(i)];
    for (int p = 0; p < len; ++p) r.prompt.push_back(int32_t((p * 7 + i * 13 + 3) % vocab));
    r.stop.max_tokens = 4 + (i * 5) % 13;
    r.stop.ignore_eos = i % 4 != 0;
    switch (i % 3) {
      case 0:
        r.sampling.temperature = 0.0f;
        r.sampling.logprobs = i % 2 ? 0 : 2;
        break;
      case 1:
        r.sampling.temperature = 0.8f;
        r.sampling.top_k = 20;
        r.sampling.top_p = 0.9f;
        r.sampling.seed = 1000 + i;
        break;
      default:
        r.sampling.temperature = 1.2f;
        r.sampling.min_p = 0.02f;
        r.sampling.presence_penalty = 0.5f;
        r.sampling.frequency_penalty = 0.3f;
        r.sampling.repetition_penalty = 1.2f;
        r.sampling.logit_bias = {{int32_t(5 % vocab), 1.5f}, {int32_t(9 % vocab), -2.0f}};
        r.sampling.logprobs = 3;
        r.sampling.seed = 77 * i;
        break;
    }
    reqs.push_back(std::move(r));
  }
  return reqs;
}

}  // namespace dil::testing
