// The hooks of the trace (trace.h): A's recorder, B's replayer, and the model scopes they name
// each op by. Internal to src/trace (and its tests).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/profiler.h"
#include "trace/interpose.h"
#include "trace/trace.h"

namespace dil::trace {

// The model's profiler scopes followed instead of timed: which layer (the k-th "layer:<kind>"
// scope of the step is the k-th layer of the run) and which module an op runs in.
class ScopeTracker : public StepProfiler {
 public:
  explicit ScopeTracker(Backend& be) : StepProfiler(be) {}
  void begin(const char* module) override;
  void end() override;
  void new_step() { layers_seen_ = 0; }
  int layer_ordinal() const;      // -1 outside a layer
  std::string layer_kind() const;  // "" outside a layer
  std::string module() const;      // innermost scope that is not a layer
  std::string path() const;        // every open scope, "/"-joined (the replay checks it)

 private:
  std::vector<std::string> stack_;
  int layers_seen_ = 0;
};

// Host copy of one tensor argument.
struct Snapshot {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  bool state = false, rows = false;
  int64_t numel() const;
};
Snapshot snapshot(Backend& be, const Arg& a);
bool usable(const Arg& a);  // a tensor with data and elements
std::string shape_str(const std::vector<int64_t>& shape);

// One op of A's run: what it read (before) and wrote (after).
struct Record {
  std::string op, path, module, kind;
  int layer_ordinal = -1;
  ImplInfo impl;
  bool round_bf16 = false;
  std::vector<Snapshot> before, after;
};

class RecordHook : public CallHook {
 public:
  explicit RecordHook(const ScopeTracker& scopes) : scopes_(scopes) {}
  void around(Backend& inner, Call& c, const std::function<void()>& op) override;
  std::vector<Record> take() { return std::move(records_); }

 private:
  const ScopeTracker& scopes_;
  std::vector<Record> records_;
};

// Replays one step's records on B: forces every input, runs, compares every output, appends
// the checks to `out`.
class ReplayHook : public CallHook {
 public:
  ReplayHook(const ScopeTracker& scopes, Numerics a, Numerics b, const std::vector<int>& layers,
             std::vector<Check>* out)
      : scopes_(scopes), na_(a), nb_(b), layers_(layers), out_(out) {}
  void begin_step(int step, std::vector<Record> records, int first_index);
  void around(Backend& inner, Call& c, const std::function<void()>& op) override;
  // Every record of the step was replayed (B called what A called).
  void end_step() const;
  int next_index() const { return first_index_ + int(next_); }

 private:
  const ScopeTracker& scopes_;
  Numerics na_, nb_;
  const std::vector<int>& layers_;
  std::vector<Check>* out_;
  std::vector<Record> records_;
  size_t next_ = 0;
  int step_ = 0, first_index_ = 1;
};

// Adds `delta` to every element of the first float output of the nth call (1-based, counted
// over the whole run) of `op`: a deliberately wrong backend, to see the trace name it.
struct Perturbation {
  std::string op;
  int nth = 1;
  double delta = 1e-3;
};
Perturbation parse_perturbation(const std::string& s);  // "OP" | "OP:N"; throws dil::Error

class PerturbHook : public CallHook {
 public:
  explicit PerturbHook(Perturbation p) : p_(std::move(p)) {}
  void around(Backend& inner, Call& c, const std::function<void()>& op) override;
  bool fired() const { return fired_; }

 private:
  Perturbation p_;
  int seen_ = 0;
  bool fired_ = false;
};

// A backend wrapped by a perturbation (owns its hook).
class PerturbedBackend : public InterposingBackend {
 public:
  PerturbedBackend(Backend& inner, std::unique_ptr<PerturbHook> hook)
      : InterposingBackend(inner, *hook, "perturbed"), hook_(std::move(hook)) {}
  bool fired() const { return hook_->fired(); }

 private:
  std::unique_ptr<PerturbHook> hook_;
};
std::unique_ptr<PerturbedBackend> make_perturbed(Backend& inner, const Perturbation& p);

}  // namespace dil::trace
