#include "trace/hooks.h"

#include <algorithm>
#include <cctype>

#include "trace/compare.h"

namespace dil::trace {

namespace {
bool is_layer(const std::string& s) { return s.rfind("layer:", 0) == 0; }
}  // namespace

void ScopeTracker::begin(const char* module) {
  stack_.emplace_back(module);
  if (is_layer(stack_.back())) ++layers_seen_;
}

void ScopeTracker::end() {
  DIL_CHECK(!stack_.empty(), "trace: a profiler scope ends that never began");
  stack_.pop_back();
}

int ScopeTracker::layer_ordinal() const {
  for (const std::string& s : stack_)
    if (is_layer(s)) return layers_seen_ - 1;
  return -1;
}

std::string ScopeTracker::layer_kind() const {
  for (auto it = stack_.rbegin(); it != stack_.rend(); ++it)
    if (is_layer(*it)) return it->substr(6);
  return "";
}

std::string ScopeTracker::module() const {
  for (auto it = stack_.rbegin(); it != stack_.rend(); ++it)
    if (!is_layer(*it)) return *it;
  return "";
}

std::string ScopeTracker::path() const {
  std::string p;
  for (const std::string& s : stack_) p += (p.empty() ? "" : "/") + s;
  return p;
}

int64_t Snapshot::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool usable(const Arg& a) { return a.t && !a.t->empty() && a.t->numel() > 0; }

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Snapshot snapshot(Backend& be, const Arg& a) {
  Snapshot s;
  s.name = a.name;
  s.dtype = a.t->dtype;
  s.shape.assign(a.t->shape.begin(), a.t->shape.begin() + a.t->ndim);
  s.bytes.resize(a.t->nbytes());
  be.download(s.bytes.data(), *a.t);
  s.state = a.state;
  s.rows = a.rows;
  return s;
}

void RecordHook::around(Backend& inner, Call& c, const std::function<void()>& op) {
  Record r;
  r.op = c.op;
  r.path = scopes_.path();
  r.module = scopes_.module();
  r.kind = scopes_.layer_kind();
  r.layer_ordinal = scopes_.layer_ordinal();
  r.impl = implementation(inner, c);
  r.round_bf16 = c.round_bf16;
  for (const Arg& a : c.args)
    if (usable(a) && a.role != Role::Out) r.before.push_back(snapshot(inner, a));
  op();
  for (const Arg& a : c.args)
    if (usable(a) && a.role != Role::In && a.written) r.after.push_back(snapshot(inner, a));
  records_.push_back(std::move(r));
}

void ReplayHook::begin_step(int step, std::vector<Record> records, int first_index) {
  step_ = step;
  records_ = std::move(records);
  next_ = 0;
  first_index_ = first_index;
}

void ReplayHook::end_step() const {
  if (next_ != records_.size())
    DIL_FAIL("trace: in step ", step_, " B's model called ", next_, " ops, A's ", records_.size(),
             " (the first not replayed: ", records_[next_].op, " in ", records_[next_].path, ")");
}

namespace {
// "f32", "bf16", "i32" (the CLI's spelling of dtypes).
std::string lower_name(DType t) {
  std::string s(dtype_name(t));
  for (char& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

const Snapshot* find(const std::vector<Snapshot>& v, const std::string& name) {
  for (const Snapshot& s : v)
    if (s.name == name) return &s;
  return nullptr;
}
}  // namespace

void ReplayHook::around(Backend& inner, Call& c, const std::function<void()>& op) {
  if (next_ >= records_.size())
    DIL_FAIL("trace: in step ", step_, " B's model calls ", c.op, " in ", scopes_.path(), " after all ",
             records_.size(), " ops of A's");
  const Record& r = records_[next_++];
  if (r.op != c.op || r.path != scopes_.path())
    DIL_FAIL("trace: op ", next_index() - 1, " of step ", step_, ": A's model called ", r.op, " in ", r.path,
             ", B's calls ", c.op, " in ", scopes_.path(), " (the two runs must call the same ops)");
  // Teacher forcing: every tensor the op reads gets A's values, in B's dtype.
  bool inputs_exact = true;
  double rows_max = 0;
  size_t forced = 0;
  for (const Arg& a : c.args) {
    if (!usable(a) || a.role == Role::Out) continue;
    const Snapshot* s = find(r.before, a.name);
    if (!s || s->numel() != a.t->numel())
      DIL_FAIL("trace: ", c.op, " in ", r.path, ": input ", a.name, " is ", a.t->shape_str(), " on B but ",
               s ? shape_str(s->shape) : std::string("absent"), " on A");
    const std::vector<uint8_t> bytes = convert(*s, a.t->dtype, &inputs_exact);
    inner.upload(*a.t, bytes.data());
    if (a.rows) rows_max = std::max(rows_max, max_abs_value(*s));
    ++forced;
  }
  if (forced != r.before.size())
    DIL_FAIL("trace: ", c.op, " in ", r.path, ": A's call read ", r.before.size(), " tensors, B's ", forced);
  op();

  const ImplInfo impl_b = implementation(inner, c);
  const bool mode_pair = na_ != nb_;
  // In a mode pair the CPU's two modes compute the same function of the same inputs, each
  // output rounded once to its mode's dtype (fast = official rounded to bf16), except where
  // the arithmetic itself differs (the internal BF16 roundings of the MoE and of the fused mHC
  // pre). So a call whose inputs
  // converted exactly and whose arithmetic agrees is held to the implementations' tolerances;
  // the others show the mode difference.
  const bool mode = mode_pair && (!inputs_exact || r.round_bf16 != c.round_bf16);
  const int index = next_index() - 1;
  for (const Arg& a : c.args) {
    if (!usable(a) || a.role == Role::In || !a.written) continue;
    const Snapshot* sa = find(r.after, a.name);
    DIL_CHECK(sa != nullptr, "trace: ", c.op, " output ", a.name, " was not recorded on A");
    const Snapshot sb = snapshot(inner, a);
    Check k;
    k.index = index;
    k.step = step_;
    k.layer = r.layer_ordinal >= 0 && r.layer_ordinal < int(layers_.size()) ? layers_[size_t(r.layer_ordinal)]
                                                                           : r.layer_ordinal;
    k.kind = r.kind;
    k.module = r.module;
    k.op = c.op;
    k.output = a.name;
    k.shape = shape_str(sb.shape);
    k.dtype = sa->dtype == sb.dtype ? lower_name(sb.dtype) : lower_name(sa->dtype) + "->" + lower_name(sb.dtype);
    k.impl_a = r.impl.name;
    k.impl_b = impl_b.name;
    const bool integer = sb.dtype == DType::I32;
    if (mode) {
      k.gate = "mode";
      k.tol = combine(r.impl.tol, impl_b.tol);
    } else if (a.state || integer) {
      k.gate = "exact";
      k.tol = exact_tolerance();
    } else {
      k.gate = "kernel";
      k.tol = combine(r.impl.tol, impl_b.tol);
    }
    compare(*sa, sb, rows_max, &k);
    out_->push_back(std::move(k));
  }
}

Perturbation parse_perturbation(const std::string& s) {
  Perturbation p;
  const size_t colon = s.find(':');
  p.op = s.substr(0, colon);
  if (p.op.empty()) DIL_FAIL("perturbation '", s, "': expected OP or OP:N (e.g. sparse_attention:2)");
  if (colon != std::string::npos) {
    const std::string n = s.substr(colon + 1);
    if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos || std::stoll(n) < 1 ||
        std::stoll(n) > 1000000)
      DIL_FAIL("perturbation '", s, "': N must be a positive call number");
    p.nth = int(std::stoll(n));
  }
  return p;
}

void PerturbHook::around(Backend& inner, Call& c, const std::function<void()>& op) {
  op();
  if (c.op != p_.op || ++seen_ != p_.nth) return;
  for (const Arg& a : c.args) {
    if (!usable(a) || a.role == Role::In || !a.written) continue;
    if (a.t->dtype != DType::F32 && a.t->dtype != DType::BF16) continue;
    Snapshot s = snapshot(inner, a);
    std::vector<float> v = float_values(s, false);
    for (float& f : v) f = float(double(f) + p_.delta);
    Snapshot w = s;
    w.dtype = DType::F32;
    w.bytes.assign(reinterpret_cast<const uint8_t*>(v.data()), reinterpret_cast<const uint8_t*>(v.data() + v.size()));
    bool exact = true;
    const std::vector<uint8_t> bytes = convert(w, a.t->dtype, &exact);
    inner.upload(*a.t, bytes.data());
    fired_ = true;
    return;
  }
}

std::unique_ptr<PerturbedBackend> make_perturbed(Backend& inner, const Perturbation& p) {
  return std::make_unique<PerturbedBackend>(inner, std::make_unique<PerturbHook>(p));
}

}  // namespace dil::trace
