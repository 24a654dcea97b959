// deepinfer-lab quality --model DIR [--numerics reference|official] [--device cpu|cuda]
//                       [--text FILE] [--window 512] [--windows N] [--prompts 32]
//                       [--prompt-len 256] [--gen 64] [--out RUN.json]
// deepinfer-lab quality --compare A.json B.json [--max-ppl-ratio R] [--min-agreement F]
//
// Model-level quality of one numerics mode on one backend, on a trained checkpoint
// (tests/data/v4-trained, v41-trained): (a) held-out perplexity: the text's ids (default
// DIR/heldout.txt, tokenized with DIR/tokenizer.json) cut into consecutive windows of --window
// tokens, each one full forward from position 0, NLL of positions 1..window-1; (b) greedy
// continuations: --prompts prompts of --prompt-len ids at evenly spaced offsets of the same
// ids, --gen tokens each (argmax, ties to the lowest id, no stop at EOS). Prints a summary
// and writes every figure and token to --out.
// --compare reads two runs of the same workload and prints the perplexity ratio B/A and the
// greedy agreement: `prefix` = tokens equal up to each prompt's first divergence / all tokens,
// `positional` = tokens equal at the same position / all tokens. With bounds it exits 1 when
// |ppl_B / ppl_A - 1| > R or prefix agreement < F (the quality test's gate).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/dist_run.h"
#include "cli/shared_options.h"
#include "tokenizer/tokenizer.h"

namespace dil::cli {

namespace {
using json = nlohmann::json;

struct QualityOptions {
  std::string model;                 // a trained checkpoint folder (config, weights, tokenizer, heldout.txt)
  Numerics numerics = ModelOptions{}.numerics;
  std::string device = "cpu";
  std::string text;                  // empty: MODEL/heldout.txt
  long window = 512, windows = 0;    // windows 0: every whole window of the text
  long prompts = 32, prompt_len = 256, gen = 64;
  std::string out;                   // RUN.json
  std::string follow;                // A.json: feed A's prompts and greedy tokens (forced agreement)
  std::vector<std::string> compare;  // A.json B.json
  double max_ppl_ratio = -1, min_agreement = -1;  // < 0: no gate
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) DIL_FAIL("cannot read ", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json read_json(const std::string& path) {
  try {
    return json::parse(read_file(path));
  } catch (const json::exception& e) {
    DIL_FAIL(path, ": ", e.what());
  }
}

int32_t argmax(const float* lg, int64_t V) {
  int32_t best = 0;
  for (int64_t v = 1; v < V; ++v)
    if (lg[v] > lg[best]) best = int32_t(v);  // ties -> lowest id
  return best;
}

// -log softmax(lg)[target], in double.
double nll_of(const float* lg, int64_t V, int32_t target) {
  double mx = lg[0];
  for (int64_t v = 1; v < V; ++v) mx = std::max(mx, double(lg[v]));
  double s = 0.0;
  for (int64_t v = 0; v < V; ++v) s += std::exp(double(lg[v]) - mx);
  return std::log(s) + mx - double(lg[target]);
}

int run_quality(const QualityOptions& o) {
  const std::string& dir = o.model;
  const long W = o.window, n_prompts = o.prompts, plen = o.prompt_len, gen = o.gen;
  if (W < 2 || n_prompts < 1 || plen < 1 || gen < 1) DIL_FAIL("--window >= 2, --prompts, --prompt-len, --gen >= 1");
  auto tok = tok::Tokenizer::load(dir + "/tokenizer.json");
  const std::vector<int32_t> ids = tok->encode(read_file(o.text.empty() ? dir + "/heldout.txt" : o.text), false);
  const long avail = long(ids.size()) / W, n_win = o.windows > 0 ? std::min(avail, o.windows) : avail;
  if (n_win < 1) DIL_FAIL("the text has ", ids.size(), " tokens: not one window of ", W);
  if (long(ids.size()) < plen + n_prompts) DIL_FAIL("the text is too short for ", n_prompts, " prompts of ", plen);

  // One rank, one backend.
  auto be = make_backend(parse_backend_kind(o.device));
  ModelOptions opt;
  opt.numerics = o.numerics;
  auto model = load_model(dir, *be, opt);
  const int64_t V = model->config().vocab_size;
  check_token_ids({ids}, V);

  // (a) perplexity over consecutive windows, each from position 0; the argmax of every scored
  // position too (teacher-forced top-1, compared across runs without any divergence cascade).
  json win_nll = json::array(), win_top1 = json::array();
  double total = 0.0;
  for (long w = 0; w < n_win; ++w) {
    std::vector<int32_t> part(ids.begin() + w * W, ids.begin() + (w + 1) * W);
    SingleSequence seq(*model, int(W));
    const std::vector<float> lg = seq.feed(part, true);  // [W, V]
    double s = 0.0;
    for (long t = 0; t + 1 < W; ++t) {
      s += nll_of(lg.data() + t * V, V, part[size_t(t + 1)]);
      win_top1.push_back(argmax(lg.data() + t * V, V));
    }
    win_nll.push_back(s / double(W - 1));
    total += s;
  }
  const double ppl = std::exp(total / double(n_win * (W - 1)));

  // (b) greedy continuations of prompts at evenly spaced offsets. With --follow A.json every
  // step feeds A's greedy token instead of this run's own: `greedy` then holds this model's
  // choice at each of A's steps (forced agreement, no divergence cascade).
  json followed;
  if (!o.follow.empty()) {
    followed = read_json(o.follow);
    for (const char* k : {"prompt_len", "gen", "tokens"})
      if (followed.at(k) != json(k == std::string("prompt_len") ? plen : k == std::string("gen") ? gen : long(ids.size())))
        DIL_FAIL("--follow ", o.follow, ": a different workload (", k, ")");
    if (long(followed.at("greedy").size()) != n_prompts) DIL_FAIL("--follow ", o.follow, ": a different workload (prompts)");
  }
  json prompts = json::array(), greedy = json::array();
  const long span = long(ids.size()) - plen;
  for (long i = 0; i < n_prompts; ++i) {
    const long off = i * span / n_prompts;
    std::vector<int32_t> p(ids.begin() + off, ids.begin() + off + plen), out;
    const std::vector<int32_t> path =
        followed.is_null() ? std::vector<int32_t>{} : followed.at("greedy")[size_t(i)].get<std::vector<int32_t>>();
    SingleSequence seq(*model, int(plen + gen));
    std::vector<float> lg = seq.feed(p, false);
    for (long g = 0; g < gen; ++g) {
      out.push_back(argmax(lg.data(), V));
      if (g + 1 < gen) lg = seq.feed({path.empty() ? out.back() : path[size_t(g)]}, false);
    }
    prompts.push_back(off);
    greedy.push_back(out);
  }
  json r = {{"model", dir}, {"numerics", numerics_name(o.numerics)}, {"device", o.device},
            {"window", W}, {"windows", n_win}, {"tokens", ids.size()}, {"window_nll", win_nll}, {"ppl", ppl},
            {"prompt_len", plen}, {"gen", gen}, {"prompt_offsets", prompts}, {"greedy", greedy},
            {"window_top1", win_top1}};
  if (!followed.is_null()) r["followed"] = followed.at("greedy");
  std::printf("%s numerics=%s device=%s: held-out perplexity %.4f (%ld windows of %ld), %ld prompts x %ld greedy tokens\n",
              dir.c_str(), r["numerics"].get<std::string>().c_str(), r["device"].get<std::string>().c_str(), ppl,
              n_win, W, n_prompts, gen);
  if (!o.out.empty()) {
    std::ofstream f(o.out);
    if (!f) DIL_FAIL("cannot write ", o.out);
    f << r.dump() << "\n";
  }
  return 0;
}

int run_compare(const QualityOptions& o) {
  const json a = read_json(o.compare[0]), b = read_json(o.compare[1]);
  for (const char* k : {"window", "windows", "tokens", "prompt_len", "gen", "prompt_offsets"})
    if (a.at(k) != b.at(k)) DIL_FAIL("the two runs have different workloads (", k, ")");
  const auto &ga = a.at("greedy"), &gb = b.at("greedy");
  long prefix = 0, same = 0, all = 0, diverged = 0;
  for (size_t i = 0; i < ga.size(); ++i) {
    const auto x = ga[i].get<std::vector<int32_t>>(), y = gb[i].get<std::vector<int32_t>>();
    size_t k = 0;
    while (k < x.size() && x[k] == y[k]) ++k;
    prefix += long(k);
    diverged += k < x.size();
    for (size_t j = 0; j < x.size(); ++j) same += x[j] == y[j];
    all += long(x.size());
  }
  const double pa = a.at("ppl").get<double>(), pb = b.at("ppl").get<double>();
  const double ratio = pb / pa, fp = double(prefix) / double(all), fs = double(same) / double(all);
  // B ran with --follow A: its `greedy` is its own choice at each of A's steps.
  const bool forced = b.contains("followed") && b.at("followed") == ga;
  long top1 = 0;
  const auto &ta = a.at("window_top1"), &tb = b.at("window_top1");
  for (size_t i = 0; i < ta.size(); ++i) top1 += ta[i] == tb[i];
  const double ft = ta.empty() ? 0.0 : double(top1) / double(ta.size());
  std::printf("A %s %s/%s ppl %.4f\nB %s %s/%s ppl %.4f\n", a.at("model").get<std::string>().c_str(),
              a.at("numerics").get<std::string>().c_str(), a.at("device").get<std::string>().c_str(), pa,
              b.at("model").get<std::string>().c_str(), b.at("numerics").get<std::string>().c_str(),
              b.at("device").get<std::string>().c_str(), pb);
  std::printf("perplexity ratio B/A %.6f (|ratio - 1| = %.3e)\n", ratio, std::fabs(ratio - 1.0));
  if (forced) {
    std::printf("greedy agreement (B following A's continuations): %.4f (%ld/%ld of A's greedy tokens are B's "
                "choice too)\n", fs, same, all);
  } else {
    std::printf("greedy agreement: prefix %.4f (%ld/%ld tokens before the first divergence), positional %.4f; "
                "%ld of %zu prompts diverge\n", fp, prefix, all, fs, diverged, ga.size());
  }
  std::printf("teacher-forced top-1 agreement over the perplexity windows: %.4f (%ld/%zu positions)\n", ft, top1,
              ta.size());
  const double agreement = forced ? fs : fp;  // what --min-agreement gates
  int rc = 0;
  if (o.max_ppl_ratio >= 0) {
    const double bound = o.max_ppl_ratio;
    if (!(std::fabs(ratio - 1.0) <= bound)) {
      std::printf("FAIL: |ppl ratio - 1| %.3e > %g\n", std::fabs(ratio - 1.0), bound);
      rc = 1;
    }
  }
  if (o.min_agreement >= 0) {
    const double bound = o.min_agreement;
    if (!(agreement >= bound)) {
      std::printf("FAIL: %s agreement %.4f < %g\n", forced ? "greedy (followed)" : "prefix", agreement, bound);
      rc = 1;
    }
  }
  return rc;
}
}  // namespace

void add_quality(CLI::App& top, std::vector<Declared>* out) {
  auto o = std::make_shared<QualityOptions>();
  CLI::App* c = top.add_subcommand(
      "quality", "held-out perplexity and greedy continuations of a trained checkpoint; --compare two runs");
  auto* model = c->add_option("--model", o->model, "a trained checkpoint folder (with tokenizer.json, heldout.txt)");
  add_numerics_option(c, o->numerics);
  add_device_option(c, o->device);
  c->add_option("--text", o->text, "held-out text (empty: MODEL/heldout.txt)");
  c->add_option("--window", o->window, "tokens per perplexity window (each a forward from position 0)")
      ->check(CLI::Range(2L, 1L << 20));
  c->add_option("--windows", o->windows, "windows to score (0: every whole window)")->check(CLI::NonNegativeNumber);
  c->add_option("--prompts", o->prompts, "greedy prompts")->check(CLI::PositiveNumber);
  c->add_option("--prompt-len", o->prompt_len, "ids per prompt")->check(CLI::PositiveNumber);
  c->add_option("--gen", o->gen, "greedy tokens per prompt")->check(CLI::PositiveNumber);
  c->add_option("--out", o->out, "write every figure and token to this JSON file");
  c->add_option("--follow", o->follow, "feed the greedy tokens of this earlier run (A.json, same workload) instead of "
                                       "this run's own: forced greedy agreement");
  auto* cmp = c->add_option("--compare", o->compare, "compare two runs A.json B.json instead of running")->expected(2);
  c->add_option("--max-ppl-ratio", o->max_ppl_ratio, "--compare: fail (exit 1) when |ppl_B/ppl_A - 1| exceeds this (< 0: no gate)");
  c->add_option("--min-agreement", o->min_agreement, "--compare: fail (exit 1) when the greedy agreement (forced when B "
                                                     "followed A, else up to the first divergence) is below this (< 0: no gate)");
  model->excludes(cmp);
  require(c, {"--model", "--compare"});
  out->push_back({c, [o](const ProgramArgs&) { return o->compare.empty() ? run_quality(*o) : run_compare(*o); }});
}

}  // namespace dil::cli
