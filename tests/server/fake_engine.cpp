#include "fake_engine.h"

#include <algorithm>

namespace dil::server::testing {

class FakeEngine::Stream final : public RequestStream {
 public:
  explicit Stream(std::string id) : id_(std::move(id)) {}
  bool next(GenOutput* out, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> l(mu_);
    if (!cv_.wait_for(l, timeout, [&] { return !q_.empty(); })) return false;
    *out = std::move(q_.front());
    q_.pop_front();
    return true;
  }
  const std::string& id() const override { return id_; }
  void push(GenOutput o) {
    {
      std::lock_guard<std::mutex> l(mu_);
      q_.push_back(std::move(o));
    }
    cv_.notify_all();
  }

 private:
  std::string id_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GenOutput> q_;
};

struct FakeEngine::Req {
  GenRequest req;
  std::shared_ptr<Stream> stream;
  int produced = 0;
  uint64_t seed = 0;
};

int32_t FakeEngine::token_at(uint64_t seed, int pos, int vocab) {
  // splitmix64 of (seed, pos): a fixed function, so seeded outputs are reproducible.
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + uint64_t(pos) + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return int32_t(3 + z % uint64_t(vocab - 3));  // never BOS/EOS/PAD
}

FakeEngine::FakeEngine(int vocab, int max_model_len, std::vector<int32_t> script, std::chrono::microseconds step)
    : script_(std::move(script)), step_(step) {
  info_.model_name = "fake";
  info_.vocab_size = vocab;
  info_.max_model_len = max_model_len;
  thread_ = std::thread([this] { loop(); });
}

FakeEngine::~FakeEngine() { shutdown(); }

void FakeEngine::shutdown() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<RequestStream> FakeEngine::submit(GenRequest req) {
  auto r = std::make_shared<Req>();
  r->stream = std::make_shared<Stream>(req.id);
  r->seed = req.sampling.seed.value_or(uint64_t(std::hash<std::string>()(req.id)));
  auto s = r->stream;
  if (int(req.prompt.size()) + req.stop.max_tokens > info_.max_model_len) {
    GenOutput o;
    o.finish = FinishReason::Error;
    o.error = "prompt too long";
    s->push(std::move(o));
    return s;
  }
  r->req = std::move(req);
  {
    std::lock_guard<std::mutex> l(mu_);
    prompt_total_ += int64_t(r->req.prompt.size());
    live_[r->req.id] = r;
  }
  cv_.notify_all();
  return s;
}

void FakeEngine::cancel(const std::string& id) {
  std::shared_ptr<Req> r;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = live_.find(id);
    if (it == live_.end()) return;
    r = it->second;
    live_.erase(it);
  }
  GenOutput o;
  o.finish = FinishReason::Cancelled;
  r->stream->push(std::move(o));
}

EngineStats FakeEngine::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  EngineStats s;
  s.running = int(live_.size());
  s.steps = steps_;
  s.prompt_tokens_total = prompt_total_;
  s.generation_tokens_total = gen_total_;
  return s;
}

void FakeEngine::loop() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    if (live_.empty()) {
      cv_.wait(l, [&] { return stop_ || !live_.empty(); });
      continue;
    }
    ++steps_;
    std::vector<std::string> done;
    for (auto& [id, r] : live_) {
      GenOutput o;
      const int pos = r->produced;
      int32_t tok;
      if (!script_.empty()) tok = pos < int(script_.size()) ? script_[size_t(pos)] : info_.eos_token_id;
      else tok = token_at(r->seed, pos, info_.vocab_size);
      const auto& stops = r->req.stop.stop_token_ids;
      if ((tok == info_.eos_token_id && !r->req.stop.ignore_eos) ||
          std::find(stops.begin(), stops.end(), tok) != stops.end()) {
        o.finish = FinishReason::Stop;
        o.stop_token = tok;
      } else {
        GenToken g;
        g.token = tok;
        g.logprob = -float(1 + tok % 7) / 8.0f;
        for (int k = 0; k < r->req.sampling.logprobs; ++k)
          g.top.push_back({int32_t(3 + (tok + k) % (info_.vocab_size - 3)), -float(k + 1) / 4.0f});
        o.tokens.push_back(g);
        ++r->produced;
        ++gen_total_;
        if (r->produced >= r->req.stop.max_tokens) o.finish = FinishReason::Length;
      }
      o.prompt_tokens = int(r->req.prompt.size());
      o.completion_tokens = r->produced;
      if (o.finish != FinishReason::None) done.push_back(id);
      r->stream->push(std::move(o));
    }
    for (const auto& id : done) live_.erase(id);
    l.unlock();
    std::this_thread::sleep_for(step_);
    l.lock();
  }
}

}  // namespace dil::server::testing
