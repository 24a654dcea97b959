#include "trace/trace.h"

#include <algorithm>
#include <chrono>

#include "model/kv_layout.h"
#include "model/model.h"
#include "trace/hooks.h"

namespace dil::trace {

Side parse_side(const std::string& s) {
  const size_t colon = s.find(':');
  Side side;
  try {
    side.kind = parse_backend_kind(s.substr(0, colon));
    if (colon != std::string::npos) side.numerics = parse_numerics(s.substr(colon + 1));
  } catch (const Error& e) {
    DIL_FAIL("'", s, "': expected DEVICE[:NUMERICS] (cpu|cuda, ", numerics_choices(), "): ", e.what());
  }
  return side;
}

std::string side_name(const Side& s) {
  return std::string(backend_kind_name(s.kind)) + ":" + numerics_name(s.numerics);
}

void check_pair(Numerics a, Numerics b) {
  if ((a == Numerics::Reference) != (b == Numerics::Reference))
    DIL_FAIL("numerics ", numerics_name(a), " vs ", numerics_name(b),
             ": reference numerics has no quantization points, so its forward calls other ops than official and "
             "fast; trace reference against reference, or official against fast");
}

int64_t TraceReport::over() const {
  return std::count_if(checks.begin(), checks.end(), [](const Check& c) { return !c.ok; });
}

const Check* TraceReport::first_over() const {
  for (const Check& c : checks)
    if (!c.ok) return &c;
  return nullptr;
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// One side: the model on an interposing backend whose hook follows the model's scopes.
struct Run {
  std::unique_ptr<ScopeTracker> scopes;
  std::unique_ptr<CallHook> hook;
  std::unique_ptr<InterposingBackend> be;
  std::unique_ptr<Model> model;
};

std::unique_ptr<Model> load(const TraceOptions& o, InterposingBackend& be, Numerics n, ScopeTracker& scopes,
                            int n_blocks, bool plain_kv) {
  ModelOptions mo;
  mo.numerics = n;
  mo.plain_kv = plain_kv;
  mo.load_format = o.load_format;
  mo.seed = o.seed;
  mo.layers = o.layers;
  mo.load_mtp = false;
  mo.on_progress = o.on_progress;
  std::unique_ptr<Model> m = load_model(o.model, be, mo);
  be.sync_plan();
  m->set_profiler(&scopes);
  m->allocate_cache(n_blocks, 1, CacheSpec{}.block_tokens);
  // The same synthesized context on both sides (and, in a mode pair, A's state is what B
  // reads at every op anyway).
  if (o.start_pos > 0) {
    be.set_passthrough(true);
    m->randomize_cache(o.seed + 1);
    be.set_passthrough(false);
  }
  return m;
}

}  // namespace

TraceReport run_trace(const TraceOptions& o, Backend& a, Numerics na, Backend& b, Numerics nb) {
  check_pair(na, nb);
  if (o.decode_steps < 0 || o.start_pos < 0) DIL_FAIL("decode steps and start position must not be negative");
  TraceReport rep;
  rep.model = o.model;
  rep.layers = o.layers;
  const ModelConfig cfg = load_model_config(o.model);
  if (rep.layers.empty())
    for (int L = 0; L < cfg.n_layers; ++L) rep.layers.push_back(L);
  std::sort(rep.layers.begin(), rep.layers.end());
  rep.layers.erase(std::unique(rep.layers.begin(), rep.layers.end()), rep.layers.end());
  for (int L : rep.layers)
    if (L < 0 || L >= cfg.n_layers) DIL_FAIL("layer ", L, " outside [0, ", cfg.n_layers, ")");
  TraceOptions opt = o;
  opt.layers = rep.layers;

  std::vector<int32_t> ids = o.ids;
  if (ids.empty()) {
    if (o.tokens < 1) DIL_FAIL("the prompt needs at least one token");
    uint64_t s = o.seed * 0x2545f4914f6cdd1dull + 7;
    for (int i = 0; i < o.tokens + o.decode_steps; ++i) ids.push_back(int32_t(splitmix(s) % uint64_t(cfg.vocab_size)));
  }
  for (int32_t id : ids)
    if (id < 0 || id >= cfg.vocab_size) DIL_FAIL("token id ", id, " outside [0, ", cfg.vocab_size, ")");
  const int prompt = int(ids.size()) - o.decode_steps;
  if (prompt < 1) DIL_FAIL(ids.size(), " ids for ", o.decode_steps, " decode steps: the prompt needs at least one");
  const int64_t end = int64_t(o.start_pos) + int64_t(ids.size());
  if (end > cfg.max_position) DIL_FAIL("positions up to ", end, " exceed the model's ", cfg.max_position);
  const int bt = CacheSpec{}.block_tokens;
  const int n_blocks = int((end + bt - 1) / bt);

  // Steps: the prompt as one chunk, then one token per step.
  std::vector<std::pair<int, int>> steps = {{o.start_pos, prompt}};  // (start, tokens)
  rep.steps.push_back("prefill " + std::to_string(prompt) + " tokens at position " + std::to_string(o.start_pos));
  for (int i = 0; i < o.decode_steps; ++i) {
    steps.push_back({o.start_pos + prompt + i, 1});
    rep.steps.push_back("decode at position " + std::to_string(o.start_pos + prompt + i));
  }

  rep.a = {BackendKind::CPU, na};
  rep.b = {BackendKind::CPU, nb};
  rep.a.kind = a.device() == Device::CUDA ? BackendKind::CUDA : BackendKind::CPU;
  rep.b.kind = b.device() == Device::CUDA ? BackendKind::CUDA : BackendKind::CPU;

  ScopeTracker scopes_a(a), scopes_b(b);
  RecordHook rec(scopes_a);
  ReplayHook rep_hook(scopes_b, na, nb, rep.layers, &rep.checks);
  InterposingBackend be_a(a, rec, "trace-a"), be_b(b, rep_hook, "trace-b");
  // Both sides hold the same cache layout, so that A's cache bytes are B's inputs: the packed
  // rows where both would store them (kv_layout.h), else plain rows on both.
  const auto packs = [](Numerics n, const Backend& be) { return kv_format(n) == KvFormat::Official && be.reads_packed_kv(); };
  const bool plain_kv = packs(na, a) != packs(nb, b);
  auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Model> ma = load(opt, be_a, na, scopes_a, n_blocks, plain_kv);
  rep.load_a_s = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Model> mb = load(opt, be_b, nb, scopes_b, n_blocks, plain_kv);
  rep.load_b_s = seconds_since(t0);

  std::vector<int32_t> blocks(static_cast<size_t>(n_blocks));
  for (int i = 0; i < n_blocks; ++i) blocks[size_t(i)] = i;
  int index = 1, fed = 0;
  std::vector<float> la, lb;
  for (size_t s = 0; s < steps.size(); ++s) {
    StepBatch batch;
    SeqChunk c;
    c.slot = 0;
    c.start_pos = steps[s].first;
    c.n_tokens = steps[s].second;
    c.blocks = blocks;
    batch.seqs.push_back(c);
    batch.tokens.assign(ids.begin() + fed, ids.begin() + fed + c.n_tokens);
    fed += c.n_tokens;
    // A records, then B replays the same step op by op (one step's records in memory at a time).
    t0 = std::chrono::steady_clock::now();
    scopes_a.new_step();
    ma->forward(batch, &la);
    rep.run_a_s += seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    rep_hook.begin_step(int(s), rec.take(), index);
    scopes_b.new_step();
    mb->forward(batch, &lb);
    rep_hook.end_step();
    index = rep_hook.next_index();
    rep.run_b_s += seconds_since(t0);
  }
  return rep;
}

}  // namespace dil::trace
