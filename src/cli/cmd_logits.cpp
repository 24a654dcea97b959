// deepinfer-lab logits --model DIR --ids LIST|FILE [--chunks 100,37,...] [--decode-from N]
//                      [--mode official|reference] [--device cpu|cuda] --out FILE.npy
// Runs the forward over the ids (whole, in the given chunks, or a prefill of N tokens followed
// by single-token steps) and writes every position's logits, float32 [n_tokens, vocab].
#include <cstdio>

#include "backend/backend.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/ids.h"
#include "core/npy.h"
#include "model/single_sequence.h"

namespace dil::cli {

int cmd_logits(int argc, char** argv) {
  Args args(argc, argv);
  std::vector<int32_t> ids = parse_ids(args.need("ids"));
  if (ids.empty()) DIL_FAIL("--ids is empty");
  std::string out = args.need("out");
  auto be = make_backend(parse_backend_kind(args.get("device", "cpu")));
  ModelOptions opt;
  opt.numerics = parse_numerics(args.get("mode", "official"));
  auto model = load_model(args.need("model"), *be, opt);
  const int64_t V = model->config().vocab_size;
  for (int32_t t : ids)
    if (t < 0 || t >= V) DIL_FAIL("token id ", t, " outside the vocabulary [0, ", V, ")");

  std::vector<int> chunks;
  if (args.has("chunks")) {
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

  SingleSequence seq(*model, int(ids.size()));
  std::vector<float> all;
  all.reserve(ids.size() * size_t(V));
  size_t pos = 0;
  for (int c : chunks) {
    std::vector<int32_t> part(ids.begin() + ptrdiff_t(pos), ids.begin() + ptrdiff_t(pos + size_t(c)));
    std::vector<float> lg = seq.feed(part, true);
    all.insert(all.end(), lg.begin(), lg.end());
    pos += size_t(c);
  }
  write_npy_f32(out, all.data(), {int64_t(ids.size()), V});
  std::fprintf(stderr, "wrote %s [%zu, %lld]\n", out.c_str(), ids.size(), (long long)V);
  return 0;
}

}  // namespace dil::cli
