// deepinfer-lab trace --model DIR | --config FILE [--layers L,...|all] [--a cpu:fast] [--b cuda:fast]
//                     [--ids LIST | --tokens N] [--decode-steps K] [--start-pos P] [--kernels op=impl]
//                     [--rows all|over|none] [--json OUT] [--perturb OP[:N]]
//
// One forward (a prefill step, then K decode steps) on two backends or two numerics modes, op by
// op with teacher forcing (src/trace/trace.h): every op of B gets A's inputs and state, and its
// outputs are checked against A's under the implementations' tolerances (docs/kernels.md). Prints
// every check, a line per layer and the first op over its tolerance; exits 1 when any op is over.
// --config runs dummy weights at the config's real shapes (default: one layer of each kind).
// --perturb adds 1e-3 to one of B's op outputs (a self-test: the trace must name that op).
#include <cstdio>
#include <fstream>

#include "cli/commands.h"
#include "cli/ids.h"
#include "cli/layer_kinds.h"
#include "cli/load_report.h"
#include "cli/shared_options.h"
#include "trace/hooks.h"
#include "trace/report.h"

namespace dil::cli {

namespace {

struct TraceCliOptions {
  std::string model;        // checkpoint folder
  std::string config;       // config.json: dummy weights
  std::string load_format;  // empty: safetensors for --model, dummy for --config
  std::string layers;       // "1,3,4" | "all"; empty: all (--model), default_layers (--config)
  std::string a = "cpu:fast", b = "cuda:fast";
  std::string ids;
  int tokens = trace::TraceOptions{}.tokens;
  int decode_steps = trace::TraceOptions{}.decode_steps;
  int start_pos = trace::TraceOptions{}.start_pos;
  uint64_t seed = trace::TraceOptions{}.seed;
  std::string kernels;      // B's forced implementations
  std::string rows = "all";
  std::string json;
  std::string perturb;
};

int run_trace_cmd(const TraceCliOptions& o) {
  const trace::Side sa = trace::parse_side(o.a), sb = trace::parse_side(o.b);
  trace::check_pair(sa.numerics, sb.numerics);
  trace::TraceOptions t;
  t.model = o.model.empty() ? o.config : o.model;
  t.load_format = !o.load_format.empty() ? o.load_format : o.model.empty() ? "dummy" : "safetensors";
  const ModelConfig cfg = load_model_config(t.model);
  if (o.layers == "all") t.layers.clear();
  else if (!o.layers.empty()) t.layers = parse_int_list(o.layers);
  else if (t.load_format == "dummy") t.layers = default_layers(cfg);
  if (!o.ids.empty()) t.ids = parse_ids(o.ids);
  t.tokens = o.tokens;
  t.decode_steps = o.decode_steps;
  t.start_pos = o.start_pos;
  t.seed = o.seed;
  LoadPrinter printer = LoadPrinter::for_stderr();
  t.on_progress = printer.callback();

  BackendOptions bo;
  if (!o.kernels.empty()) parse_kernel_overrides(o.kernels, &bo);
  std::unique_ptr<Backend> a = make_backend(sa.kind, 0), b = make_backend(sb.kind, 0, bo);
  Backend* bb = b.get();
  std::unique_ptr<trace::PerturbedBackend> perturbed;
  if (!o.perturb.empty()) {
    perturbed = trace::make_perturbed(*b, trace::parse_perturbation(o.perturb));
    bb = perturbed.get();
  }
  trace::TraceReport rep = trace::run_trace(t, *a, sa.numerics, *bb, sb.numerics);
  rep.a = sa;
  rep.b = sb;
  trace::print_header(stdout, rep);
  if (o.rows != "none") trace::print_table(stdout, rep, o.rows == "over");
  trace::print_layers(stdout, rep);
  trace::print_verdict(stdout, rep);
  if (perturbed && !perturbed->fired())
    std::fprintf(stderr, "warning: --perturb %s never applied (B made no such call)\n", o.perturb.c_str());
  if (!o.json.empty()) {
    std::ofstream out(o.json);
    if (!out) DIL_FAIL("cannot write ", o.json);
    out << trace::to_json(rep).dump(1) << "\n";
  }
  return rep.over() > 0 ? 1 : 0;
}

}  // namespace

void add_trace(CLI::App& top, std::vector<Declared>* out) {
  auto o = std::make_shared<TraceCliOptions>();
  CLI::App* c = top.add_subcommand(
      "trace", "one forward on two backends or numerics modes, op by op with teacher forcing, against the kernel "
               "tolerances (exit 1 when an op is over)");
  auto* model = c->add_option("--model", o->model, "checkpoint folder");
  auto* config = c->add_option("--config", o->config, "model config.json: dummy weights at its real shapes");
  model->excludes(config);
  c->add_option("--load-format", o->load_format, "weights: safetensors (the checkpoint) or dummy (random, official formats)")
      ->default_str("safetensors with --model, dummy with --config")
      ->check(CLI::IsMember({"safetensors", "dummy"}));
  c->add_option("--layers", o->layers, "backbone layers to build and trace, LIST or all")
      ->default_str("all with --model; one of each kind with dummy weights (V4: 1,3,4; V4.1: 0,2,3,20,21,24)")
      ->check(parsed_by([](const std::string& s) {
        if (s != "all" && parse_int_list(s).empty()) DIL_FAIL("expected a layer list or 'all'");
      }));
  const auto side = parsed_by([](const std::string& s) { trace::parse_side(s); });
  c->add_option("--a", o->a, "side A, the one the run continues with: DEVICE:NUMERICS")
      ->type_name("cpu|cuda:MODE")
      ->check(side);
  c->add_option("--b", o->b, "side B, fed A's inputs at every op and checked against A: DEVICE:NUMERICS")
      ->type_name("cpu|cuda:MODE")
      ->check(side);
  auto* ids = c->add_option("--ids", o->ids, "token ids of the sequence (LIST or FILE): the prompt, then one per decode step")
                  ->default_str("random")
                  ->check(parsed_by([](const std::string& s) {
                    if (parse_ids(s).empty()) DIL_FAIL("expected token ids");
                  }));
  c->add_option("--tokens", o->tokens, "prompt length with random ids (one prefill step)")
      ->check(CLI::PositiveNumber)
      ->excludes(ids);
  c->add_option("--decode-steps", o->decode_steps, "one-token steps after the prompt")->check(CLI::NonNegativeNumber);
  c->add_option("--start-pos", o->start_pos, "position of the prompt; > 0: after a synthesized context (random cache)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--seed", o->seed, "seed of the dummy weights, random ids and synthesized context");
  c->add_option("--kernels", o->kernels, "B's forced implementations, op=impl[,op=impl...]")
      ->check(parsed_by([](const std::string& s) {
        BackendOptions bo;
        parse_kernel_overrides(s, &bo);
      }));
  c->add_option("--rows", o->rows, "table rows to print: all, over (only the checks over their bound) or none")
      ->check(CLI::IsMember({"all", "over", "none"}));
  c->add_option("--json", o->json, "also write every check to this JSON file");
  c->add_option("--perturb", o->perturb, "self-test: add 1e-3 to the output of B's Nth call of OP (OP[:N], N from 1)")
      ->check(parsed_by([](const std::string& s) { trace::parse_perturbation(s); }));
  require(c, {"--model", "--config"});
  out->push_back({c, [o](const ProgramArgs&) { return run_trace_cmd(*o); }});
}

}  // namespace dil::cli
