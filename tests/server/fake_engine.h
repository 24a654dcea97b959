// A deterministic stand-in for the engine, for the server's unit tests: no model, one thread,
// one token per request per "step". A request either replays a scripted token list (to drive
// the parser and stop strings with known text) or emits token = f(seed, position).
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "dil/engine.h"

namespace dil::server::testing {

class FakeEngine final : public Engine {
 public:
  // script: when non-empty, every request emits these tokens (then EOS).
  FakeEngine(int vocab, int max_model_len, std::vector<int32_t> script = {},
             std::chrono::microseconds step = std::chrono::microseconds(500));
  ~FakeEngine() override;
  std::shared_ptr<RequestStream> submit(GenRequest req) override;
  void cancel(const std::string& id) override;
  EngineStats stats() const override;
  const EngineInfo& info() const override { return info_; }
  void shutdown() override;

  // The token a seeded request emits at output position `pos` (what tests compare against).
  static int32_t token_at(uint64_t seed, int pos, int vocab);

 private:
  struct Req;
  class Stream;
  void loop();

  EngineInfo info_;
  std::vector<int32_t> script_;
  std::chrono::microseconds step_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::shared_ptr<Req>> live_;
  int64_t steps_ = 0, prompt_total_ = 0, gen_total_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dil::server::testing
