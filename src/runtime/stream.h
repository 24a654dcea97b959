// RequestStream implementation: the engine thread pushes, the connection thread pops. Outputs
// not yet popped are merged into one (tokens concatenated, the latest finish/counters win), so a
// slow reader costs one pending output, not one per token.
#pragma once
#include <condition_variable>
#include <mutex>
#include <optional>

#include "dil/engine.h"

namespace dil::runtime {

class Stream : public RequestStream {
 public:
  explicit Stream(std::string id) : id_(std::move(id)) {}
  bool next(GenOutput* out, std::chrono::milliseconds timeout) override;
  const std::string& id() const override { return id_; }
  // Engine side. Outputs after a finished one are dropped (a cancel after a natural finish).
  void push(GenOutput o);
  bool finished() const;

 private:
  const std::string id_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<GenOutput> pending_;
  bool finished_ = false;  // an output with finish != None was pushed
};

}  // namespace dil::runtime
