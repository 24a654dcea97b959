// deepinfer-lab bench prefill|decode|ceilings
//
//   bench prefill --config FILE [--context 131072] [--cached 126976] [--new-tokens 4096]
//                 [--layers 1,3,4|all] [--device cuda] [--numerics fast] [--iters 3] [--json OUT]
//   bench decode  --config FILE --batch B --context C [--speculative K [--speculative-method mtp|dspark]]
//                 [...same options]
//   bench ceilings [--device cuda]
//   prefill/decode also take --no-replay (V4.1: every layer on every row, the baseline of the
//   decoder replay, model/replay.h) and --nproc N (and --nnodes/--node-rank/--master-addr/--master-port):
//   expert-parallel MoE over N GPUs, every rank running the same step on its own sequences
//   (data-parallel attention); rank 0 prints and writes the JSON.
//
// Dummy weights in the official formats (--load-format dummy) for a subset of layers, a cached
// context synthesized with random rows, one step timed after a warm-up, a per-module breakdown,
// the FLOP/byte floor of the same step, and the extrapolation of the measured per-layer times to
// the model's full depth (labelled as such; each layer kind's time per row it computed, times
// the rows every layer of that kind computes at full depth, which under decoder replay differ
// per layer).
//
// bench decode --speculative K (issue 27) then also times the verify step of speculative
// decoding for d = 1..K drafted tokens: every sequence a chunk of d + 1 tokens with every row's
// logits (what the engine runs), plus the engine's per-step snapshot of each drafting sequence's
// state slot (copy_cache), and prints the tok/s/GPU implied at mean acceptance lengths 1.5, 2.5,
// 3.5 (tokens emitted per verify step; dummy weights accept nothing, so the acceptance length is
// an input here: tok/s = batch x length / verify time). --speculative-method mtp (V4) loads the
// MTP drafter (dummy mtp.0): every timed step then includes the MTP block over its tokens (as
// the engine runs it), and each d adds the draft itself (d chained MTP steps for every
// sequence, Model::draft), timed alone and not extrapolated (one block at any depth).
// --speculative-method dspark (V4.1, K <= dspark_block_size) loads the DSpark drafter (dummy
// mtp.0..2): every timed step then includes its context rows (the stream means at the target
// layers -- with a layer subset, at the next built layer --, main_proj and each block's ring
// row, as the engine runs them), and each d adds the draft (one forward of the three blocks
// over the 5-token draft block, d Markov steps), timed alone and not extrapolated.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "cli/commands.h"
#include "core/check.h"
#include "cli/dist_run.h"
#include "cli/ids.h"
#include "cli/layer_kinds.h"
#include "cli/load_report.h"
#include "cli/shared_options.h"
#include "model/cost.h"
#include "model/kv_layout.h"
#include "model/model.h"
#include "model/replay.h"
#include "model/v41_model.h"
#include "runtime/sampler.h"

namespace dil::cli {

namespace {

using json = nlohmann::json;

// Options of bench prefill and bench decode.
struct BenchModelOptions {
  std::string config;
  std::string layers;  // "1,3,4" | "all"; empty: default_layers()
  std::string device = "cuda";
  Numerics numerics = ModelOptions{}.numerics;
  int iters = 3;
  int warmup = 1;
  std::string json;    // write the results here too
  uint64_t seed = ModelOptions{}.seed;
  int block_tokens = CacheSpec{}.block_tokens;
  bool no_replay = !ModelOptions{}.decoder_replay;
  bool plain_kv = false;  // bf16 / f32 cache rows instead of the official packed ones (a baseline)
  std::string kernels;    // forced implementations (op=impl,...): a baseline of a planned kernel
  LaunchRequest launch;
};
struct BenchPrefillOptions : BenchModelOptions {
  int64_t context = 131072;
  int64_t cached = -1;  // -1: context - new_tokens
  int64_t new_tokens = 4096;
};
struct BenchDecodeOptions : BenchModelOptions {
  int64_t batch = 64;
  int64_t context = 32768;
  int speculative = 0;  // K > 0: also the verify step for 1..K drafted tokens
  std::string speculative_method = "ngram";  // ngram: the verify step only; mtp / dspark: + the model's drafter
};
struct BenchCeilingsOptions {
  std::string device = "cuda";
  std::string json;
};

struct Run {
  double step_ms = 0;    // forward + device sampling + the sampled ids back on the host
  double host_ms = 0;    // host time inside forward_device (planning, uploads, launches)
  double sample_ms = 0;  // host wall time of the sampling call (packing, upload, kernel, download)
  double device_ms = 0;  // the forward on the device with every launch queued ahead (device_forward_ms)
  std::map<std::string, double> module_ms;
  std::map<std::string, double> layer_kind_ms;
};

// A step as the engine runs it: the forward with the logits left on the device, then every row
// sampled there (temperature 0.8, top-p 0.95, seeded: a common chat setting) and only the ids
// downloaded. The host time of the forward is the wall time until forward_device returns: the
// kernels run asynchronously, so it is planning + launches, plus any wait on the device
// inside the forward (a host synchronization shows up as host time close to the step time).
Run time_steps(Model& model, Backend& be, const StepBatch& batch, int warmup, int iters) {
  using clock = std::chrono::steady_clock;
  auto ms = [](clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  SamplingParams sp;
  sp.temperature = 0.8f;
  sp.top_p = 0.95f;
  auto step = [&](double* host, double* sample) {
    const auto h0 = clock::now();
    const Tensor lg = model.forward_device(batch);  // [rows, vocab] f32
    const auto h1 = clock::now();
    if (!lg.empty()) {
      runtime::SampleBatch sb{lg.shape[1]};
      for (int64_t r = 0; r < lg.shape[0]; ++r) sb.add(int32_t(r), sp, {}, {}, 1234 + uint64_t(r), 1 << 20);
      sb.run(be, lg, LogprobsMode::Raw);  // downloads the ids: waits for the step
    }
    if (host) *host += ms(h1 - h0);
    if (sample) *sample += ms(clock::now() - h1);
  };
  for (int i = 0; i < warmup; ++i) step(nullptr, nullptr);
  be.synchronize();
  // Plain step time first (no events inside the step), then one profiled step for the breakdown.
  Run r;
  auto t0 = clock::now();
  for (int i = 0; i < iters; ++i) step(&r.host_ms, &r.sample_ms);
  be.synchronize();
  r.step_ms = ms(clock::now() - t0) / iters;
  r.host_ms /= iters;
  r.sample_ms /= iters;
  // The profiled step leaves its logits on the device too, as the timed steps do (a host
  // download inside the head's scope would inflate embed+head and, through the scale of the
  // extrapolation, shrink every other part); they are checked after the profiler is detached.
  StepProfiler prof(be);
  model.set_profiler(&prof);
  const Tensor plg = model.forward_device(batch);  // [rows, vocab] f32
  be.synchronize();
  model.set_profiler(nullptr);
  std::vector<float> logits(size_t(plg.numel()));
  if (!plg.empty()) be.download(logits.data(), plg);
  for (const auto& [name, ms] : prof.totals_ms()) {
    if (name.rfind("layer:", 0) == 0) r.layer_kind_ms[name.substr(6)] += ms;
    else r.module_ms[name] += ms;
  }
  for (float v : logits)
    if (!std::isfinite(v)) DIL_FAIL("benchmark step produced non-finite logits");
  return r;
}

// The forward's device time without launch gaps: the stream is held while the host queues the
// whole forward (hold: 4x the host time, at least 20 ms), then timed by events. Against
// step_ms - sample_ms it says how much of the step the host's launches cost.
double device_forward_ms(Model& model, Backend& be, const StepBatch& batch, double host_ms) {
  be.hold(std::max(20.0, 4 * host_ms));
  const int a = be.record_event();
  (void)model.forward_device(batch);
  const int b = be.record_event();
  const double ms = be.elapsed_ms(a, b);
  be.clear_events();
  return ms;
}

// Speculative decoding's verify step for d = 1..K drafts (see the file comment): each d's step
// time (subset and full depth, extrapolated like the decode step), the state-slot snapshot of
// every sequence the engine takes before it, and the tok/s/GPU at acceptance lengths 1.5..3.5.
struct VerifyRuns {
  double snap_ms = 0;     // the slot snapshots of every sequence, built layers
  std::vector<Run> runs;  // d = 1..K
  std::vector<double> draft_ms;  // d = 1..K: the model's drafter (MTP) for every sequence; empty: none
};

// Every rank runs these (the forwards' collectives), before rank 0 reports.
template <typename MakeBatch>
VerifyRuns time_verify(Model& model, Backend& be, const MakeBatch& make_batch, int64_t n_seqs, int k,
                       const BenchModelOptions& o) {
  VerifyRuns v;
  // Snapshot: one slot copy per sequence (slot s -> n_seqs + s), timed alone.
  std::vector<CacheCopy> cc;
  for (int64_t s = 0; s < n_seqs; ++s) cc.push_back({CacheCopy::Kind::Slot, int32_t(s), int32_t(n_seqs + s)});
  model.copy_cache(cc);
  be.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.iters; ++i) model.copy_cache(cc);
  be.synchronize();
  v.snap_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / o.iters;
  for (int d = 1; d <= k; ++d) v.runs.push_back(time_steps(model, be, make_batch(d + 1, true), o.warmup, o.iters));
  if (model.has_drafter()) {
    // Every sequence drafts d tokens from its (synthesized) slot: the pair at the last cached
    // position. The draft reads the slots and leaves them as they are.
    const StepBatch b = make_batch(1, false);
    std::vector<DraftRequest> req;
    for (const SeqChunk& c : b.seqs) req.push_back({c.slot, std::max(0, c.start_pos - 1), 5, 1});
    std::vector<std::vector<int32_t>> out;
    for (int d = 1; d <= k; ++d) {
      for (DraftRequest& r : req) r.n = d;
      for (int i = 0; i < o.warmup; ++i) model.draft(req, &out);
      be.synchronize();
      const auto t1 = std::chrono::steady_clock::now();
      for (int i = 0; i < o.iters; ++i) model.draft(req, &out);
      be.synchronize();
      v.draft_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count() /
                           o.iters);
    }
  }
  return v;
}

template <typename Extrapolate>
json report_verify(VerifyRuns& v, const ModelConfig& cfg, const Extrapolate& extrapolate, int64_t n_seqs, Run& decode,
                   double decode_full_ms, int n_built) {
  // The slots hold the built layers only; a slot is mostly SWA ring rows (the same size in
  // every layer), so the full-depth snapshot scales by layers.
  const double snap_ms = v.snap_ms;
  const double snap_full_ms = snap_ms * cfg.n_layers / std::max(1, n_built);
  std::printf("\nspeculative verify: %lld seqs, each [last token + d drafts] with every row's logits, + the slot "
              "snapshot (%.3f ms for the built layers, ~%.3f ms at full depth)\n",
              (long long)n_seqs, snap_ms, snap_full_ms);
  const bool drafts = !v.draft_ms.empty();
  if (drafts)
    std::printf(cfg.arch == Arch::V4
                    ? "MTP drafter: every step includes the MTP block over its tokens; +draft = d chained MTP steps "
                      "per sequence (timed alone, not extrapolated)\n"
                    : "DSpark drafter: every step includes its context rows; +draft = the 3 blocks over the 5-token "
                      "draft block + d Markov steps per sequence (timed alone, not extrapolated)\n");
  std::printf("%-3s %12s %14s %14s %12s", "d", "subset ms", "full ms", drafts ? "+snap+draft ms" : "+snapshot ms",
              "vs decode");
  const double lens[] = {1.5, 2.5, 3.5};
  for (double a : lens) std::printf("  tok/s/GPU@%.1f", a);
  std::printf("\n%-3d %12.3f %14.3f %14s %12s  (plain decode: %.1f tok/s/GPU)\n", 0, decode.step_ms, decode_full_ms, "-",
              "1.00x", double(n_seqs) / (decode_full_ms / 1e3));
  json rows = json::array();
  for (int d = 1; d <= int(v.runs.size()); ++d) {
    Run& r = v.runs[size_t(d - 1)];
    const double draft = drafts ? v.draft_ms[size_t(d - 1)] : 0.0;
    const double full = extrapolate(r, d + 1), verify = full + snap_full_ms + draft;
    std::printf("%-3d %12.3f %14.3f %14.3f %11.2fx", d, r.step_ms, full, verify, verify / decode_full_ms);
    json tok = json::object();
    for (double a : lens) {
      if (a > d + 1) {
        std::printf("  %15s", "-");
        continue;
      }
      const double t = double(n_seqs) * a / (verify / 1e3);
      std::printf("  %15.1f", t);
      tok[std::to_string(a).substr(0, 3)] = t;
    }
    std::printf("\n");
    rows.push_back({{"drafts", d}, {"step_ms_subset", r.step_ms}, {"full_ms", full}, {"snapshot_full_ms", snap_full_ms},
                    {"draft_ms", draft}, {"verify_full_ms", verify}, {"tok_s_gpu_at_acceptance_length", tok}});
  }
  return {{"snapshot_ms_subset", snap_ms}, {"snapshot_full_ms", snap_full_ms}, {"decode_full_ms", decode_full_ms},
          {"verify", rows}};
}

// One step of n_seqs sequences, each `new_tokens` after `cached` cached tokens (decode: 1).
int bench_model(const BenchModelOptions& o, bool decode, int64_t n_seqs, int64_t cached, int64_t new_tokens,
                const ProgramArgs& prog, int spec_tokens = 0, bool mtp = false) {
  const std::string& cfg_path = o.config;
  ModelConfig cfg = load_config(cfg_path);
  int launcher_status = 0;
  auto run = start_dist(o.launch, o.device, prog, &launcher_status, o.kernels);
  if (!run) return launcher_status;
  Backend* be = run->be.get();
  const bool quiet = run->rank() != 0;
  ModelOptions opt;
  opt.comm = run->comm.get();
  opt.numerics = o.numerics;
  opt.load_format = "dummy";
  opt.seed = o.seed;
  opt.decoder_replay = !o.no_replay;
  opt.load_mtp = mtp;
  opt.plain_kv = o.plain_kv;
  if (mtp && cfg.arch == Arch::V41 && spec_tokens > cfg.dspark_block_size)
    DIL_FAIL("--speculative ", spec_tokens, ": DSpark drafts at most dspark_block_size = ", cfg.dspark_block_size,
             " tokens");
  if (o.layers == "all") {
    for (int L = 0; L < cfg.n_layers; ++L) opt.layers.push_back(L);
  } else if (!o.layers.empty()) {
    opt.layers = parse_int_list(o.layers);
  } else {
    opt.layers = default_layers(cfg);
  }
  const bool full_depth = int(opt.layers.size()) == cfg.n_layers;
  if (cached < 0 || cached + new_tokens > cfg.max_position) DIL_FAIL("bad --context/--cached/--new-tokens");
  const int bt = o.block_tokens;
  const int iters = o.iters, warmup = o.warmup;
  LoadPrinter printer = LoadPrinter::for_stderr();
  if (!quiet) opt.on_progress = printer.callback();

  auto t_load = std::chrono::steady_clock::now();
  auto model = load_model(cfg_path, *be, opt);
  if (!quiet) std::fprintf(stderr, "%s\n", loaded_line(printer.last(), "").c_str());
  const int64_t blocks_per_seq = (cached + new_tokens + spec_tokens + bt - 1) / bt;
  // Speculative verify: slots [n_seqs, 2 n_seqs) hold the engine's per-step snapshots.
  const int64_t n_blocks = blocks_per_seq * n_seqs, n_slots = n_seqs * (spec_tokens > 0 ? 2 : 1);
  model->allocate_cache(int(n_blocks), int(n_slots), bt);
  model->randomize_cache(opt.seed + 1);
  // What the cache holds (issue 28): the subset's bytes as allocated (cache_spec: the stored row
  // formats, packed in fast numerics where the backend reads them), the same context at full
  // depth (kv_layout of the stored format, every layer), and the device memory in use.
  const CacheSpec kv_sub = model->cache_spec(bt);
  const KvFormat kv_fmt =
      stored_kv_rows(cfg, o.numerics, *be, o.plain_kv).swa.packed() ? KvFormat::Official : KvFormat::F32;
  const KvLayout kv_full = kv_layout(cfg, bt, kv_fmt);
  const double kv_sub_bytes = double(kv_sub.bytes_per_block) * double(n_blocks) + double(kv_sub.bytes_per_slot) * double(n_slots);
  const double kv_full_bytes =
      double(kv_full.spec.bytes_per_block) * double(n_blocks) + double(kv_full.spec.bytes_per_slot) * double(n_slots);
  const Backend::MemoryInfo mem = be->memory_info();
  auto make_batch = [&](int64_t n_new, bool all_logits) {
    StepBatch batch;
    for (int64_t s = 0; s < n_seqs; ++s) {
      SeqChunk c;
      c.slot = int32_t(s);
      c.start_pos = int32_t(cached);
      c.n_tokens = int32_t(n_new);
      c.all_logits = all_logits;
      for (int64_t b = 0; b < blocks_per_seq; ++b) c.blocks.push_back(int32_t(s * blocks_per_seq + b));
      batch.seqs.push_back(c);
      for (int64_t t = 0; t < n_new; ++t) batch.tokens.push_back(int32_t((s * 7919 + t * 104729) % cfg.vocab_size));
    }
    return batch;
  };
  const StepBatch batch = make_batch(new_tokens, false);
  double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  Run r = time_steps(*model, *be, batch, warmup, iters);
  r.device_ms = device_forward_ms(*model, *be, batch, r.host_ms);
  // Rows per layer and sequence (decoder replay): what the cost model and the extrapolation
  // count, checked against what the model ran.
  const bool replay = opt.decoder_replay && cfg.arch == Arch::V41;
  const ReplaySchedule rs = replay_schedule(cfg);
  auto layer_rows_of = [&](int L, int64_t n) { return replay ? replay_rows(rs, L, int(n)).out : int(n); };
  auto layer_rows = [&](int L) { return layer_rows_of(L, new_tokens); };
  if (auto* v41 = dynamic_cast<V41Model*>(model.get())) {
    for (int L : opt.layers)
      if (v41->layer_rows()[size_t(L)] != int64_t(layer_rows(L)) * n_seqs)
        DIL_FAIL("layer ", L, " ran ", v41->layer_rows()[size_t(L)], " rows, the replay plan says ",
                 int64_t(layer_rows(L)) * n_seqs);
  }
  VerifyRuns verify;
  if (spec_tokens > 0) verify = time_verify(*model, *be, make_batch, n_seqs, spec_tokens, o);
  if (quiet) return 0;

  std::map<std::string, double> ceil = be->measure_ceilings();
  auto cost = step_cost(cfg, opt.layers, n_seqs, cached, new_tokens, replay);
  auto full_cost = step_cost(cfg, {}, n_seqs, cached, new_tokens, replay);
  auto full_cost_all_rows = step_cost(cfg, {}, n_seqs, cached, new_tokens, false);
  const double fp8_rate = ceil.count("fp8_gemm_tflops") ? ceil["fp8_gemm_tflops"] * 1e12 : 0;
  const double bf16_rate = ceil.count("bf16_gemm_tflops") ? ceil["bf16_gemm_tflops"] * 1e12 : 0;
  const double bw = ceil.count("hbm_copy_gbps") ? ceil["hbm_copy_gbps"] * 1e9 : 0;
  auto floor_ms = [&](const ModuleCost& mc) {
    double rate = mc.fp8_gemm ? fp8_rate : bf16_rate;
    if (rate <= 0 || bw <= 0) return 0.0;
    return 1e3 * std::max(mc.flops / rate, mc.bytes / bw);
  };

  // Extrapolation to the full depth: measured time per row of each layer kind x the rows that
  // kind's layers compute at full depth (without replay: time per layer x the kind's count).
  bool extrapolable = true;
  auto extrapolate = [&](Run& run, int64_t n_new) {
    std::map<std::string, double> kind_rows_subset, kind_rows_full;
    for (int L : opt.layers) kind_rows_subset[layer_kind(cfg, L)] += layer_rows_of(L, n_new);
    for (int L = 0; L < cfg.n_layers; ++L) kind_rows_full[layer_kind(cfg, L)] += layer_rows_of(L, n_new);
    // The profiled step carries event overhead: when its parts add up to more than the plain
    // step, they are scaled down to it. When they add up to less, the rest is per-step work
    // outside the profiled forward (device sampling, its packing and upload, the ids back):
    // added once, not spread over the layers.
    double prof_layers = 0;
    for (auto& [kind, ms] : run.layer_kind_ms) prof_layers += ms;
    const double prof_head = run.module_ms["embed+head"];
    const double prof = std::max(1e-9, prof_layers + prof_head);
    double ms = prof_head;
    for (auto& [kind, rows] : kind_rows_full) {
      if (!kind_rows_subset.count(kind)) { extrapolable = false; continue; }
      ms += run.layer_kind_ms[kind] / kind_rows_subset[kind] * rows;
    }
    if (full_depth) return run.step_ms;
    return prof > run.step_ms ? ms * run.step_ms / prof : ms + (run.step_ms - prof);
  };
  const double full_ms = extrapolate(r, new_tokens);

  const double tokens = double(n_seqs * new_tokens);
  std::printf("\n%s %s  device %s x %d ranks (expert-parallel MoE)  numerics %s  layers [", decode ? "decode" : "prefill",
              cfg_path.c_str(), be->name().c_str(), run->size(), dil::numerics_name(o.numerics));
  for (size_t i = 0; i < opt.layers.size(); ++i) std::printf("%s%d", i ? "," : "", opt.layers[i]);
  std::printf("] of %d  seqs %lld  cached %lld  new %lld/seq  (load+synth %.1fs)\n", cfg.n_layers, (long long)n_seqs,
              (long long)cached, (long long)new_tokens, load_s);
  std::printf("%-16s %10s %7s %10s %10s %10s\n", "module", "ms/step", "share", "TFLOP", "TFLOP/s", "floor ms");
  double prof_total = 0;
  for (auto& [k, v] : r.module_ms) prof_total += v;
  json jm = json::object();
  for (auto& [name, ms] : r.module_ms) {
    const ModuleCost& mc = cost[name];
    std::printf("%-16s %10.3f %6.1f%% %10.3f %10.1f %10.3f\n", name.c_str(), ms, 100 * ms / prof_total, mc.flops / 1e12,
                mc.flops / 1e12 / (ms / 1e3), floor_ms(mc));
    jm[name] = {{"ms", ms}, {"flops", mc.flops}, {"bytes", mc.bytes}, {"floor_ms", floor_ms(mc)}};
  }
  double subset_floor = 0, full_floor = 0, full_floor_all = 0, full_flops = 0, full_flops_all = 0;
  for (auto& [k, mc] : cost) subset_floor += floor_ms(mc);
  for (auto& [k, mc] : full_cost) full_floor += floor_ms(mc), full_flops += mc.flops;
  for (auto& [k, mc] : full_cost_all_rows) full_floor_all += floor_ms(mc), full_flops_all += mc.flops;
  // Rows per sequence each layer of the full model runs attention + MoE on, and their sum
  // against every layer on every new token.
  std::vector<int> rows_full;
  int64_t rows_sum = 0;
  for (int L = 0; L < cfg.n_layers; ++L) rows_full.push_back(layer_rows(L)), rows_sum += layer_rows(L);
  if (cfg.arch == Arch::V41) {
    std::printf("decoder replay %s:", replay ? "on" : "off (--no-replay)");
    if (replay && rs.first >= 0)
      std::printf(" layers %d..%d run attention + MoE on %d..%d of the %lld new rows per sequence;", rs.first,
                  cfg.n_layers - 1, layer_rows(rs.first), layer_rows(cfg.n_layers - 1), (long long)new_tokens);
    std::printf(" layer-rows %lld of %lld (%.1f%%), full-depth %.3f TFLOP of %.3f without replay\n", (long long)rows_sum,
                (long long)(new_tokens * cfg.n_layers), 100.0 * double(rows_sum) / double(new_tokens * cfg.n_layers),
                full_flops / 1e12, full_flops_all / 1e12);
  }
  constexpr double kGiB = double(1ll << 30);
  std::printf("kv cache (%s rows): %lld sequences x %lld tokens = %lld tokens in %lld blocks of %d; subset %.2f GiB "
              "(%.1f B/token, %.2f MiB/slot)",
              kv_fmt == KvFormat::Official ? "official packed" : "plain", (long long)n_seqs,
              (long long)(cached + new_tokens), (long long)(n_seqs * (cached + new_tokens)), (long long)n_blocks, bt,
              kv_sub_bytes / kGiB, double(kv_sub.bytes_per_block) / bt, double(kv_sub.bytes_per_slot) / (1 << 20));
  // Full depth from kv_layout: exact for the official rows (plain fast rows are bf16, which
  // kv_layout's F32 layout does not describe).
  if (kv_fmt == KvFormat::Official)
    std::printf("; full depth %.2f GiB (%.2f B/token, %.2f MiB/slot)", kv_full_bytes / kGiB,
                kv_full.global_bytes_per_token, double(kv_full.spec.bytes_per_slot) / (1 << 20));
  std::printf("; device memory in use %.2f of %.2f GiB\n", double(mem.in_use) / kGiB, double(mem.total) / kGiB);
  std::printf("measured step (subset, no profiling events): %.3f ms  -> %.1f tok/s\n", r.step_ms, tokens / (r.step_ms / 1e3));
  std::printf("host per step: %.3f ms in the forward (planning + launches, until forward_device returns), "
              "%.3f ms sampling on the device (pack + upload + kernel + ids back; waits for the step)\n",
              r.host_ms, r.sample_ms);
  std::printf("forward on the device with its launches queued ahead (no launch gaps): %.3f ms (subset)\n",
              r.device_ms);
  if (full_depth)
    std::printf("full depth measured (all %d layers): %.3f ms/step  -> %.1f tok/s/GPU  (floor %.3f ms)\n", cfg.n_layers,
                r.step_ms, tokens / (r.step_ms / 1e3), full_floor);
  else if (extrapolable)
    std::printf("extrapolated to all %d layers: %.3f ms/step  -> %.1f tok/s/GPU  (floor %.3f ms)\n", cfg.n_layers, full_ms,
                tokens / (full_ms / 1e3), full_floor);
  else
    std::printf("not extrapolated: the subset lacks a layer kind of the full model\n");
  json out = {{"bench", decode ? "decode" : "prefill"}, {"config", cfg_path}, {"device", be->name()}, {"ranks", run->size()},
              {"layers", opt.layers}, {"n_layers", cfg.n_layers}, {"seqs", n_seqs}, {"cached", cached},
              {"new_tokens", new_tokens}, {"step_ms_subset", r.step_ms}, {"host_forward_ms", r.host_ms},
              {"device_forward_ms", r.device_ms},
              {"sample_ms", r.sample_ms}, {"modules", jm},
              {"layer_kind_ms", r.layer_kind_ms}, {"ceilings", ceil}, {"floor_ms_subset", subset_floor},
              {"floor_ms_full", full_floor}, {"extrapolated", extrapolable && !full_depth}, {"full_depth", full_depth},
              {"replay", replay}, {"rows_per_layer", rows_full}, {"flops_full", full_flops},
              {"flops_full_no_replay", full_flops_all}, {"floor_ms_full_no_replay", full_floor_all},
              {"kv", {{"format", kv_fmt == KvFormat::Official ? "official" : "plain"}, {"blocks", n_blocks},
                      {"slots", n_slots}, {"subset_bytes", kv_sub_bytes}, {"full_depth_bytes", kv_fmt == KvFormat::Official ? kv_full_bytes : 0.0},
                      {"full_bytes_per_token", kv_full.global_bytes_per_token},
                      {"full_bytes_per_slot", kv_full.spec.bytes_per_slot}, {"device_in_use", mem.in_use},
                      {"device_total", mem.total}}}};
  if (full_depth) out["tok_s_gpu"] = tokens / (r.step_ms / 1e3);
  if (extrapolable && !full_depth) {
    out["full_ms_extrapolated"] = full_ms;
    out["tok_s_gpu_extrapolated"] = tokens / (full_ms / 1e3);
  }
  if (spec_tokens > 0)
    out["speculative"] = report_verify(verify, cfg, extrapolate, n_seqs, r, full_ms, int(opt.layers.size()));
  if (!o.json.empty()) std::ofstream(o.json) << out.dump(2) << "\n";
  return 0;
}

int bench_ceilings(const BenchCeilingsOptions& o) {
  auto be = make_backend(parse_backend_kind(o.device));
  auto c = be->measure_ceilings();
  if (c.empty()) std::printf("backend %s measures no ceilings\n", be->name().c_str());
  for (auto& [k, v] : c) std::printf("%-20s %12.1f\n", k.c_str(), v);
  if (!o.json.empty()) std::ofstream(o.json) << json(c).dump(2) << "\n";
  return 0;
}

void add_model_options(CLI::App* c, BenchModelOptions& o) {
  c->add_option("--config", o.config, "model config.json (weights: random, in the official formats)");
  c->add_option("--layers", o.layers, "backbone layers to build and time, LIST or all")
      ->default_str("V4: 1,3,4; V4.1: 0,2,3,20,21,24 (one of each layer kind)")
      ->check(parsed_by([](const std::string& s) {
        if (s != "all" && parse_int_list(s).empty()) DIL_FAIL("expected a layer list or 'all'");
      }));
  add_device_option(c, o.device);
  add_numerics_option(c, o.numerics, o.device);
  c->add_option("--iters", o.iters, "timed steps")->check(CLI::PositiveNumber);
  c->add_option("--warmup", o.warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  c->add_option("--json", o.json, "also write the results to this JSON file");
  c->add_option("--seed", o.seed, "seed of the random weights and cache");
  c->add_option("--block-tokens", o.block_tokens, "tokens per paged KV block")->check(CLI::PositiveNumber);
  add_switch(c, "--plain-kv", o.plain_kv,
             "fast numerics: keep the caches as rows of the activation dtype instead of the official packed formats "
             "(the baseline of the packed storage)");
  add_switch(c, "--no-replay", o.no_replay,
             "V4.1: every layer on every new token (no decoder replay), the baseline of the replay's gain");
  c->add_option("--kernels", o.kernels,
                 "forced implementations, op=impl[,op=impl...] (e.g. moe_experts=mma_bf16: the baseline of a planned "
                 "kernel in the same job)");
  add_launch_options(c, o.launch, true);
  require(c, {"--config"});
}

}  // namespace

void add_bench(CLI::App& top, std::vector<Declared>* out) {
  CLI::App* b = top.add_subcommand("bench", "prefill / decode / ceilings benchmarks on dummy weights");

  auto p = std::make_shared<BenchPrefillOptions>();
  CLI::App* pc = b->add_subcommand("prefill", "time one prefill step: new tokens after a cached context");
  add_model_options(pc, *p);
  pc->add_option("--context", p->context, "context length after the step (tokens)")->check(CLI::PositiveNumber);
  pc->add_option("--cached", p->cached, "cached tokens before the step")
      ->default_str("context - new-tokens")
      ->check(CLI::NonNegativeNumber);
  pc->add_option("--new-tokens", p->new_tokens, "tokens the step prefills")->check(CLI::PositiveNumber);
  out->push_back({pc, [p](const ProgramArgs& prog) {
                    const int64_t cached = p->cached >= 0 ? p->cached : p->context - p->new_tokens;
                    return bench_model(*p, false, 1, cached, p->new_tokens, prog);
                  }});

  auto d = std::make_shared<BenchDecodeOptions>();
  CLI::App* dc = b->add_subcommand("decode", "time one decode step of a batch, each sequence at a cached context");
  add_model_options(dc, *d);
  dc->add_option("--batch", d->batch, "sequences in the step")->check(CLI::PositiveNumber);
  dc->add_option("--context", d->context, "cached tokens of each sequence")->check(CLI::PositiveNumber);
  dc->add_option("--speculative", d->speculative,
                 "also time speculative decoding's verify step for 1..K drafted tokens per sequence")
      ->check(CLI::Range(1, 16));
  dc->add_option("--speculative-method", d->speculative_method,
                 "ngram: the verify step only (a host drafter costs nothing on the device); mtp: with V4's MTP "
                 "drafter (dummy mtp.0): its block in every step and the draft of d tokens; dspark: with V4.1's "
                 "DSpark drafter (dummy mtp.0..2): its context rows in every step and the draft")
      ->check(CLI::IsMember({"ngram", "mtp", "dspark"}));
  out->push_back({dc, [d](const ProgramArgs& prog) {
                    // The method names the drafter of one architecture: mtp is V4's, dspark V4.1's.
                    if (d->speculative > 0 && d->speculative_method != "ngram") {
                      const Arch arch = load_config(d->config).arch;
                      if ((d->speculative_method == "mtp") != (arch == Arch::V4))
                        DIL_FAIL("--speculative-method ", d->speculative_method, " is ",
                                 d->speculative_method == "mtp" ? "V4's MTP drafter" : "V4.1's DSpark drafter",
                                 "; ", d->config, " is ", arch == Arch::V4 ? "a V4 model (mtp)" : "a V4.1 model (dspark)");
                    }
                    return bench_model(*d, true, d->batch, d->context, 1, prog, d->speculative,
                                       d->speculative > 0 &&
                                           (d->speculative_method == "mtp" || d->speculative_method == "dspark"));
                  }});

  auto c = std::make_shared<BenchCeilingsOptions>();
  CLI::App* cc = b->add_subcommand("ceilings", "measure the backend's GEMM and memory ceilings");
  add_device_option(cc, c->device);
  cc->add_option("--json", c->json, "also write the results to this JSON file");
  out->push_back({cc, [c](const ProgramArgs&) { return bench_ceilings(*c); }});
}

}  // namespace dil::cli
