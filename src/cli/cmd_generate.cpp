// deepinfer-lab generate --model DIR --prompt-ids LIST|FILE --max-tokens N
//                        [--mode official|reference] [--device cpu|cuda]
// Greedy generation of one sequence straight on the model (no engine); prints {"ids": [...]}.
#include <cstdio>

#include "backend/backend.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/ids.h"
#include "model/single_sequence.h"

namespace dil::cli {

int cmd_generate(int argc, char** argv) {
  Args args(argc, argv);
  std::vector<int32_t> prompt = parse_ids(args.need("prompt-ids"));
  if (prompt.empty()) DIL_FAIL("--prompt-ids is empty");
  long max_tokens = args.get_int("max-tokens", 16);
  if (max_tokens < 1) DIL_FAIL("--max-tokens must be >= 1");
  auto be = make_backend(parse_backend_kind(args.get("device", "cpu")));
  ModelOptions opt;
  opt.numerics = parse_numerics(args.get("mode", "official"));
  auto model = load_model(args.need("model"), *be, opt);
  const auto& cfg = model->config();
  for (int32_t t : prompt)
    if (t < 0 || t >= cfg.vocab_size) DIL_FAIL("token id ", t, " outside the vocabulary [0, ", cfg.vocab_size, ")");
  SingleSequence seq(*model, int(prompt.size() + size_t(max_tokens)));
  std::vector<int32_t> out;
  std::vector<float> lg = seq.feed(prompt, false);
  for (long i = 0; i < max_tokens; ++i) {
    int32_t best = 0;
    for (int64_t v = 1; v < cfg.vocab_size; ++v)
      if (lg[size_t(v)] > lg[size_t(best)]) best = int32_t(v);  // ties -> lowest id
    out.push_back(best);
    if (best == cfg.eos_id || i + 1 == max_tokens) break;
    lg = seq.feed({best}, false);
  }
  std::printf("{\"ids\": [");
  for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? ", " : "", out[i]);
  std::printf("]}\n");
  return 0;
}

}  // namespace dil::cli
