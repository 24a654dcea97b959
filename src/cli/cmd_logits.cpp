// deepinfer-lab logits --model DIR --ids LIST|FILE[;LIST...] [--chunks 100,37,...] [--decode-from N]
//                      [--numerics reference|official] [--device cpu|cuda] --out FILE.npy
//                      [--nproc N [--nnodes M --node-rank K --master-addr H --master-port P]]
// Runs the forward over the ids (whole, in the given chunks, or a prefill of N tokens followed
// by single-token steps) and writes every position's logits, float32 [n_tokens, vocab].
// Several sequences (';'-separated) write FILE.<i>.npy each; with several ranks (expert-
// parallel MoE) rank r runs sequences i with i % ranks == r, in lockstep with the others.
#include <cstdio>

#include "cli/commands.h"
#include "core/check.h"
#include "cli/dist_run.h"
#include "cli/ids.h"
#include "cli/shared_options.h"
#include "core/npy.h"

namespace dil::cli {

namespace {

struct LogitsOptions {
  std::string model;
  std::string ids;        // LIST|FILE[;LIST...]
  std::string out;        // FILE.npy (FILE.<i>.npy each with several sequences)
  std::string chunks;     // "100,37": chunk sizes of the one sequence; empty: one chunk
  int decode_from = 0;    // N > 0: a prefill of N tokens, then one token per step
  Numerics numerics = ModelOptions{}.numerics;
  std::string device = "cpu";
  LaunchRequest launch;
};

std::string indexed_path(const std::string& out, size_t i) {
  size_t dot = out.rfind(".npy");
  std::string base = dot != std::string::npos && dot + 4 == out.size() ? out.substr(0, dot) : out;
  return base + "." + std::to_string(i) + ".npy";
}

int run_logits(const LogitsOptions& o, const ProgramArgs& prog) {
  std::vector<std::vector<int32_t>> seqs = parse_id_lists(o.ids);
  const std::string& out = o.out;
  int launcher_status = 0;
  auto run = start_dist(o.launch, o.device, prog, &launcher_status);
  if (!run) return launcher_status;
  auto model = load_dist_model(o.model, o.numerics, *run);
  const int64_t V = model->config().vocab_size;
  check_token_ids(seqs, V);

  // Chunk sizes of every sequence.
  std::vector<std::vector<int>> plans;
  for (const auto& ids : seqs) {
    std::vector<int> chunks;
    if (!o.chunks.empty()) {
      if (seqs.size() > 1) DIL_FAIL("--chunks takes one sequence");
      chunks = parse_int_list(o.chunks);
    } else if (o.decode_from > 0) {
      const long n = o.decode_from;
      if (n > long(ids.size())) DIL_FAIL("--decode-from must be in [1, ", ids.size(), "]");
      chunks.push_back(int(n));
      for (size_t i = size_t(n); i < ids.size(); ++i) chunks.push_back(1);
    } else {
      chunks.push_back(int(ids.size()));
    }
    size_t total = 0;
    for (int c : chunks) {
      if (c <= 0) DIL_FAIL("chunk sizes must be positive");
      total += size_t(c);
    }
    if (total != ids.size()) DIL_FAIL("chunks sum to ", total, " but there are ", ids.size(), " ids");
    plans.push_back(chunks);
  }

  // This rank's sequences one after another, every step in lockstep with the other ranks.
  std::vector<size_t> mine;
  for (size_t i = size_t(run->rank()); i < seqs.size(); i += size_t(run->size())) mine.push_back(i);
  size_t cur = 0, chunk = 0, pos = 0;
  std::unique_ptr<SingleSequence> seq;
  std::vector<float> all, lg;
  for (;;) {
    std::vector<int32_t> part;
    if (cur < mine.size()) {
      const auto& ids = seqs[mine[cur]];
      if (!seq) seq = std::make_unique<SingleSequence>(*model, int(ids.size()));
      const int c = plans[mine[cur]][chunk];
      part.assign(ids.begin() + ptrdiff_t(pos), ids.begin() + ptrdiff_t(pos + size_t(c)));
    }
    if (!lockstep(*model, run->comm.get(), seq.get(), part, true, &lg)) break;
    if (part.empty()) continue;
    all.insert(all.end(), lg.begin(), lg.end());
    pos += part.size();
    if (++chunk < plans[mine[cur]].size()) continue;
    const size_t n = seqs[mine[cur]].size();
    std::string path = seqs.size() == 1 ? out : indexed_path(out, mine[cur]);
    write_npy_f32(path, all.data(), {int64_t(n), V});
    std::fprintf(stderr, "wrote %s [%zu, %lld]\n", path.c_str(), n, (long long)V);
    all.clear();
    seq.reset();
    chunk = pos = 0;
    ++cur;
  }
  return 0;
}

}  // namespace

void add_logits(CLI::App& top, std::vector<Declared>* out) {
  auto o = std::make_shared<LogitsOptions>();
  CLI::App* c = top.add_subcommand("logits", "run the forward over token ids and write every position's logits (.npy)");
  c->add_option("--model", o->model, "checkpoint folder");
  c->add_option("--ids", o->ids, "token ids: LIST or FILE, ';' between sequences (\"1,2,3;4,5\")")
      ->check(parsed_by([](const std::string& s) { parse_id_lists(s); }));
  c->add_option("--out", o->out, "output FILE.npy, float32 [n_tokens, vocab] (FILE.<i>.npy per sequence)");
  auto* chunks = c->add_option("--chunks", o->chunks, "chunk sizes of the one sequence, e.g. 100,37")
                     ->default_str("one chunk")
                     ->check(parsed_by([](const std::string& s) { parse_int_list(s); }));
  c->add_option("--decode-from", o->decode_from, "a prefill of N tokens, then one token per step")
      ->default_str("off")
      ->check(CLI::PositiveNumber)
      ->excludes(chunks);
  add_numerics_option(c, o->numerics);
  add_device_option(c, o->device);
  add_launch_options(c, o->launch, true);
  require(c, {"--model"});
  require(c, {"--ids"});
  require(c, {"--out"});
  out->push_back({c, [o](const ProgramArgs& prog) { return run_logits(*o, prog); }});
}

}  // namespace dil::cli
