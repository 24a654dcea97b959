// deepinfer-lab logits --model DIR --ids LIST|FILE[;LIST...] [--chunks 100,37,...] [--decode-from N]
//                      [--mode official|reference] [--device cpu|cuda] --out FILE.npy
//                      [--nproc N [--nnodes M --node-rank K --master-addr H --master-port P]]
// Runs the forward over the ids (whole, in the given chunks, or a prefill of N tokens followed
// by single-token steps) and writes every position's logits, float32 [n_tokens, vocab].
// Several sequences (';'-separated) write FILE.<i>.npy each; with several ranks (expert-
// parallel MoE) rank r runs sequences i with i % ranks == r, in lockstep with the others.
#include <cstdio>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/dist_run.h"
#include "cli/ids.h"
#include "core/npy.h"

namespace dil::cli {

namespace {
std::string indexed_path(const std::string& out, size_t i) {
  size_t dot = out.rfind(".npy");
  std::string base = dot != std::string::npos && dot + 4 == out.size() ? out.substr(0, dot) : out;
  return base + "." + std::to_string(i) + ".npy";
}
}  // namespace

int cmd_logits(int argc, char** argv) {
  Args args(argc, argv);
  std::vector<std::vector<int32_t>> seqs = parse_id_lists(args.need("ids"));
  std::string out = args.need("out");
  int launcher_status = 0;
  auto run = start_dist(args, argc, argv, &launcher_status);
  if (!run) return launcher_status;
  auto model = load_dist_model(args, *run);
  const int64_t V = model->config().vocab_size;
  check_token_ids(seqs, V);

  // Chunk sizes of every sequence.
  std::vector<std::vector<int>> plans;
  for (const auto& ids : seqs) {
    std::vector<int> chunks;
    if (args.has("chunks")) {
      if (seqs.size() > 1) DIL_FAIL("--chunks takes one sequence");
      chunks = parse_int_list(args.get("chunks"));
    } else if (args.has("decode-from")) {
      long n = args.get_int("decode-from", 0);
      if (n < 1 || n > long(ids.size())) DIL_FAIL("--decode-from must be in [1, ", ids.size(), "]");
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

}  // namespace dil::cli
