#include "runtime/stream.h"

namespace dil::runtime {

bool Stream::next(GenOutput* out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!cv_.wait_for(lk, timeout, [&] { return pending_.has_value(); })) return false;
  *out = std::move(*pending_);
  pending_.reset();
  return true;
}

void Stream::push(GenOutput o) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (finished_) return;
    finished_ = o.finish != FinishReason::None;
    if (!pending_) {
      pending_ = std::move(o);
    } else {
      GenOutput& p = *pending_;
      for (auto& t : o.tokens) p.tokens.push_back(std::move(t));
      p.finish = o.finish;
      p.stop_token = o.stop_token;
      p.error = std::move(o.error);
      p.prompt_tokens = o.prompt_tokens;
      p.completion_tokens = o.completion_tokens;
      p.cached_tokens = o.cached_tokens;
    }
  }
  cv_.notify_all();
}

bool Stream::finished() const {
  std::lock_guard<std::mutex> lk(mu_);
  return finished_;
}

}  // namespace dil::runtime
