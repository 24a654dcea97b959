// deepinfer-lab generate --model DIR --prompt-ids LIST|FILE[;LIST...] --max-tokens N
//                        [--mode official|reference] [--device cpu|cuda]
//                        [--nproc N [--nnodes M --node-rank K --master-addr H --master-port P]]
// Greedy generation straight on the model (no engine). One prompt on one rank prints
// {"ids": [...]}. Several prompts (';'-separated) or several ranks (expert-parallel MoE, each
// rank running prompts i with i % ranks == rank, data parallel) print one line per prompt,
// {"prompt": i, "rank": r, "ids": [...]}, from the rank that ran it.
#include <cstdio>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/dist_run.h"

namespace dil::cli {

int cmd_generate(int argc, char** argv) {
  Args args(argc, argv);
  std::vector<std::vector<int32_t>> prompts = parse_id_lists(args.need("prompt-ids"));
  long max_tokens = args.get_int("max-tokens", 16);
  if (max_tokens < 1) DIL_FAIL("--max-tokens must be >= 1");
  int launcher_status = 0;
  auto run = start_dist(args, argc, argv, &launcher_status);
  if (!run) return launcher_status;
  auto model = load_dist_model(args, *run);
  const auto& cfg = model->config();
  check_token_ids(prompts, cfg.vocab_size);
  const bool plain = prompts.size() == 1 && run->size() == 1;

  // This rank's prompts, one after another; every step is taken in lockstep with the others.
  std::vector<size_t> mine;
  for (size_t i = size_t(run->rank()); i < prompts.size(); i += size_t(run->size())) mine.push_back(i);
  size_t cur = 0;
  std::unique_ptr<SingleSequence> seq;
  std::vector<int32_t> out;
  std::vector<float> lg;
  for (;;) {
    std::vector<int32_t> feed;
    if (cur < mine.size()) {
      if (!seq) {
        seq = std::make_unique<SingleSequence>(*model, int(prompts[mine[cur]].size() + size_t(max_tokens)));
        feed = prompts[mine[cur]];
      } else {
        feed = {out.back()};
      }
    }
    if (!lockstep(*model, run->comm.get(), seq.get(), feed, false, &lg)) break;
    if (feed.empty()) continue;
    int32_t best = 0;
    for (int64_t v = 1; v < cfg.vocab_size; ++v)
      if (lg[size_t(v)] > lg[size_t(best)]) best = int32_t(v);  // ties -> lowest id
    out.push_back(best);
    if (best != cfg.eos_id && long(out.size()) < max_tokens) continue;
    if (plain) std::printf("{\"ids\": [");
    else std::printf("{\"prompt\": %zu, \"rank\": %d, \"ids\": [", mine[cur], run->rank());
    for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? ", " : "", out[i]);
    std::printf("]}\n");
    std::fflush(stdout);
    out.clear();
    seq.reset();
    ++cur;
  }
  return 0;
}

}  // namespace dil::cli
