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

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/dist_run.h"
#include "tokenizer/tokenizer.h"

namespace dil::cli {

namespace {
using json = nlohmann::json;

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

int run_quality(const Args& args, int argc, char** argv) {
  const std::string dir = args.need("model");
  const long W = args.get_int("window", 512), n_prompts = args.get_int("prompts", 32);
  const long plen = args.get_int("prompt-len", 256), gen = args.get_int("gen", 64);
  if (W < 2 || n_prompts < 1 || plen < 1 || gen < 1) DIL_FAIL("--window >= 2, --prompts, --prompt-len, --gen >= 1");
  auto tok = tok::Tokenizer::load(dir + "/tokenizer.json");
  const std::vector<int32_t> ids = tok->encode(read_file(args.get("text", dir + "/heldout.txt")), false);
  const long avail = long(ids.size()) / W, n_win = std::min(avail, args.get_int("windows", avail));
  if (n_win < 1) DIL_FAIL("the text has ", ids.size(), " tokens: not one window of ", W);
  if (long(ids.size()) < plen + n_prompts) DIL_FAIL("the text is too short for ", n_prompts, " prompts of ", plen);

  // The launcher plumbing gives the backend; quality runs on one rank.
  int launcher_status = 0;
  auto run = start_dist(args, argc, argv, &launcher_status);
  if (!run) return launcher_status;
  if (run->size() != 1) DIL_FAIL("quality runs on one rank");
  ModelOptions opt;
  opt.numerics = parse_numerics(args.get("numerics", "official"));
  auto model = load_model(dir, *run->be, opt);
  const int64_t V = model->config().vocab_size;
  check_token_ids({ids}, V);

  // (a) perplexity over consecutive windows, each from position 0.
  json win_nll = json::array();
  double total = 0.0;
  for (long w = 0; w < n_win; ++w) {
    std::vector<int32_t> part(ids.begin() + w * W, ids.begin() + (w + 1) * W);
    SingleSequence seq(*model, int(W));
    const std::vector<float> lg = seq.feed(part, true);  // [W, V]
    double s = 0.0;
    for (long t = 0; t + 1 < W; ++t) s += nll_of(lg.data() + t * V, V, part[size_t(t + 1)]);
    win_nll.push_back(s / double(W - 1));
    total += s;
  }
  const double ppl = std::exp(total / double(n_win * (W - 1)));

  // (b) greedy continuations of prompts at evenly spaced offsets.
  json prompts = json::array(), greedy = json::array();
  const long span = long(ids.size()) - plen;
  for (long i = 0; i < n_prompts; ++i) {
    const long off = i * span / n_prompts;
    std::vector<int32_t> p(ids.begin() + off, ids.begin() + off + plen), out;
    SingleSequence seq(*model, int(plen + gen));
    std::vector<float> lg = seq.feed(p, false);
    for (long g = 0; g < gen; ++g) {
      out.push_back(argmax(lg.data(), V));
      if (g + 1 < gen) lg = seq.feed({out.back()}, false);
    }
    prompts.push_back(off);
    greedy.push_back(out);
  }
  json r = {{"model", dir}, {"numerics", args.get("numerics", "official")}, {"device", args.get("device", "cpu")},
            {"window", W}, {"windows", n_win}, {"tokens", ids.size()}, {"window_nll", win_nll}, {"ppl", ppl},
            {"prompt_len", plen}, {"gen", gen}, {"prompt_offsets", prompts}, {"greedy", greedy}};
  std::printf("%s numerics=%s device=%s: held-out perplexity %.4f (%ld windows of %ld), %ld prompts x %ld greedy tokens\n",
              dir.c_str(), r["numerics"].get<std::string>().c_str(), r["device"].get<std::string>().c_str(), ppl,
              n_win, W, n_prompts, gen);
  if (args.has("out")) {
    std::ofstream o(args.get("out"));
    if (!o) DIL_FAIL("cannot write ", args.get("out"));
    o << r.dump() << "\n";
  }
  return 0;
}

int run_compare(const Args& args) {
  // --compare takes the first file as its value; the second is positional.
  const auto& pos = args.positional();
  if (pos.size() != 1) DIL_FAIL("--compare A.json B.json");
  const json a = read_json(args.get("compare")), b = read_json(pos.back());
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
  std::printf("A %s %s/%s ppl %.4f\nB %s %s/%s ppl %.4f\n", a.at("model").get<std::string>().c_str(),
              a.at("numerics").get<std::string>().c_str(), a.at("device").get<std::string>().c_str(), pa,
              b.at("model").get<std::string>().c_str(), b.at("numerics").get<std::string>().c_str(),
              b.at("device").get<std::string>().c_str(), pb);
  std::printf("perplexity ratio B/A %.6f (|ratio - 1| = %.3e)\n", ratio, std::fabs(ratio - 1.0));
  std::printf("greedy agreement: prefix %.4f (%ld/%ld tokens before the first divergence), positional %.4f; "
              "%ld of %zu prompts diverge\n", fp, prefix, all, fs, diverged, ga.size());
  int rc = 0;
  if (args.has("max-ppl-ratio")) {
    const double bound = std::stod(args.get("max-ppl-ratio"));
    if (!(std::fabs(ratio - 1.0) <= bound)) {
      std::printf("FAIL: |ppl ratio - 1| %.3e > %g\n", std::fabs(ratio - 1.0), bound);
      rc = 1;
    }
  }
  if (args.has("min-agreement")) {
    const double bound = std::stod(args.get("min-agreement"));
    if (!(fp >= bound)) {
      std::printf("FAIL: prefix agreement %.4f < %g\n", fp, bound);
      rc = 1;
    }
  }
  return rc;
}
}  // namespace

int cmd_quality(int argc, char** argv) {
  Args args(argc, argv);
  if (args.has("compare")) return run_compare(args);
  return run_quality(args, argc, argv);
}

}  // namespace dil::cli
