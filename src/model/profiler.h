// Per-module timing of a forward step for the benchmarks. The model brackets its sections with
// ProfileScope; with no profiler attached a scope costs nothing. Times come from backend events
// (backend.h), so a device backend is not synchronized inside the step when it overrides them.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace dil {

class StepProfiler {
 public:
  explicit StepProfiler(Backend& be) : be_(be) {}
  virtual ~StepProfiler() = default;
  // Virtual so that a tool can follow the scopes instead of timing them (src/trace names each
  // op after the layer and module it runs in).
  virtual void begin(const char* module) { open_.push_back({module, be_.record_event(), -1}); }
  virtual void end() { open_.back().to = be_.record_event(); done_.push_back(open_.back()); open_.pop_back(); }
  // Milliseconds per module over the recorded intervals (nested intervals count in both).
  std::map<std::string, double> totals_ms() const {
    std::map<std::string, double> t;
    for (const auto& i : done_) t[i.name] += be_.elapsed_ms(i.from, i.to);
    return t;
  }
  void reset() { done_.clear(); open_.clear(); be_.clear_events(); }

 private:
  struct Interval { std::string name; int from; int to; };
  Backend& be_;
  std::vector<Interval> open_, done_;
};

class ProfileScope {
 public:
  ProfileScope(StepProfiler* p, const char* module) : p_(p) { if (p_) p_->begin(module); }
  ~ProfileScope() { if (p_) p_->end(); }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  StepProfiler* p_;
};

}  // namespace dil
