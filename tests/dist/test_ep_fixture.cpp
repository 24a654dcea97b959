// Expert-parallel MoE + data-parallel attention on the v4-tiny and v41-tiny fixtures (reference numerics),
// 2 ranks over the CPU backend's TCP loopback communicator (one thread per rank), against
// the same model on 1 rank. Bounds: the fixture's (max |d| <= 2e-3, relative L2 <= 1e-4 per
// position); the only expected difference is the order of the routed sum (each rank rounds
// its experts' partial sum to f32 before the reduce-scatter adds the two), ~1e-7.
#include <gtest/gtest.h>

#include <mutex>

#include "backend/backend.h"
#include "dist_util.h"
#include "fixture_util.h"
#include "model/model.h"
#include "model/single_sequence.h"

using namespace dil;
using namespace dil::test;

static const std::string kDir = std::string(DIL_SOURCE_DIR) + "/tests/data/v4-tiny";
static const std::string kDir41 = std::string(DIL_SOURCE_DIR) + "/tests/data/v41-tiny";

namespace {

// One rank's work: a sequence fed in the given chunks (empty ids: the rank has no sequence).
struct Work {
  std::vector<int32_t> ids;
  std::vector<int> chunks;
};

// Runs each rank's work in lockstep (a rank whose chunks are done runs empty steps) and
// returns every rank's logits of every position.
std::vector<std::vector<float>> run_ep(const std::vector<Work>& work, const std::string& dir = kDir) {
  const int R = int(work.size()), port = free_port();
  std::vector<std::vector<float>> out(static_cast<size_t>(R));
  run_ranks(R, [&](int r) {
    auto be = make_backend(BackendKind::CPU);
    auto comm = make_communicator(*be, options(r, R, port));
    ModelOptions o;
    o.numerics = Numerics::Reference;
    o.comm = comm.get();
    auto model = load_model(dir, *be, o);
    const Work& w = work[size_t(r)];
    std::unique_ptr<SingleSequence> seq;
    if (!w.ids.empty()) seq = std::make_unique<SingleSequence>(*model, int(w.ids.size()));
    size_t chunk = 0, pos = 0;
    for (;;) {
      std::vector<int32_t> part;
      if (chunk < w.chunks.size())
        part.assign(w.ids.begin() + ptrdiff_t(pos), w.ids.begin() + ptrdiff_t(pos) + w.chunks[chunk]);
      std::vector<int64_t> counts = comm->exchange({int64_t(part.size())});
      int64_t any = 0;
      for (int64_t c : counts) any += c;
      if (any == 0) break;
      std::vector<float> lg;
      if (part.empty()) {
        StepBatch idle;
        idle.rank_tokens = counts;
        model->forward(idle, &lg);
        EXPECT_TRUE(lg.empty());
        continue;
      }
      lg = seq->feed(part, true, counts);
      out[size_t(r)].insert(out[size_t(r)].end(), lg.begin(), lg.end());
      pos += part.size();
      ++chunk;
    }
  });
  return out;
}

// The same work on one rank (the fixture's own single-rank model).
std::vector<float> run_single(const Work& w, const std::string& dir = kDir) {
  return ModelFixture(dir, Numerics::Reference, "reference.safetensors").run(w.ids, w.chunks);
}

void expect_same(const std::vector<float>& got, const std::vector<float>& want, int64_t V, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  Diff d = compare_logits(got, want, V);
  std::printf("[%s] rows %d  max|d| %.3e  worst rel L2 %.3e  argmax agree %d/%d\n", what.c_str(), d.rows, d.max_abs,
              d.max_rel_l2, d.argmax_agree, d.rows);
  EXPECT_LE(d.max_abs, 2e-3) << what;
  EXPECT_LE(d.max_rel_l2, 1e-4) << what;
  EXPECT_EQ(d.argmax_agree, d.rows) << what;
}

}  // namespace

// Each rank runs a different sequence with different step shapes: rank 0 a 130-token prefill
// in chunks, rank 1 a short prefill then single-token decode steps (so the ranks' token
// counts differ every step and rank 0 finishes first and runs empty steps).
TEST(ExpertParallel, TwoRanksDifferentSequencesMatchOneRank) {
  SafeTensors ref = SafeTensors::open(kDir + "/reference.safetensors");
  const int64_t V = int64_t(f32_of(ref, "seq0.logits").size() / ids_of(ref, "seq0.input_ids").size());
  Work w0{ids_of(ref, "seq1.input_ids"), {}};
  w0.chunks = {int(w0.ids.size()) - 30, 30};
  Work w1{ids_of(ref, "seq0.input_ids"), single_steps(3, int(ids_of(ref, "seq0.input_ids").size()))};
  auto ep = run_ep({w0, w1});
  expect_same(ep[0], run_single(w0), V, "rank 0 seq1 vs 1 rank");
  expect_same(ep[1], run_single(w1), V, "rank 1 seq0 vs 1 rank");
  // And both within the fixture's bounds of HF transformers (float64).
  expect_same(ep[0], f32_of(ref, "seq1.logits"), V, "rank 0 seq1 vs HF");
  expect_same(ep[1], f32_of(ref, "seq0.logits"), V, "rank 1 seq0 vs HF");
}

// Rank 1 has no sequence at all: it runs only empty steps (MoE collectives with padding rows)
// for as long as rank 0 works, and nothing hangs.
TEST(ExpertParallel, IdleRankJoinsEveryStep) {
  SafeTensors ref = SafeTensors::open(kDir + "/reference.safetensors");
  auto prompt = ids_of(ref, "decode.input_ids");
  auto gen = ids_of(ref, "decode.generated_ids");
  std::vector<int32_t> ids = prompt;
  ids.insert(ids.end(), gen.begin(), gen.end() - 1);
  Work w0{ids, single_steps(int(prompt.size()), int(ids.size()))};
  const int64_t V = int64_t(f32_of(ref, "decode.logits").size() / gen.size());
  auto ep = run_ep({w0, Work{}});
  EXPECT_TRUE(ep[1].empty());
  auto single = run_single(w0);
  expect_same(ep[0], single, V, "rank 0 decode vs 1 rank (rank 1 idle)");
  // Greedy tokens: the decode steps' argmax equals the fixture's generated ids (HF greedy).
  const size_t P = prompt.size();
  for (size_t j = 0; j < gen.size(); ++j) {
    const float* row = ep[0].data() + (P - 1 + j) * size_t(V);
    int32_t best = 0;
    for (int64_t v = 1; v < V; ++v)
      if (row[v] > row[best]) best = int32_t(v);
    EXPECT_EQ(best, gen[j]) << "generated token " << j;
  }
}

// V4.1 (shared ExpertParallel with V4): rank 0 a chunked prefill, rank 1 prefill then decode
// steps and an idle tail; Engram and the candidate indexer stay per rank.
TEST(ExpertParallel, V41TwoRanksMatchOneRank) {
  SafeTensors ref = SafeTensors::open(kDir41 + "/reference.safetensors");
  const int64_t V = int64_t(f32_of(ref, "seq0.logits").size() / ids_of(ref, "seq0.input_ids").size());
  Work w0{ids_of(ref, "seq1.input_ids"), {}};
  w0.chunks = {int(w0.ids.size()) - 30, 30};
  Work w1{ids_of(ref, "seq0.input_ids"), single_steps(3, int(ids_of(ref, "seq0.input_ids").size()))};
  auto ep = run_ep({w0, w1}, kDir41);
  expect_same(ep[0], run_single(w0, kDir41), V, "v41 rank 0 seq1 vs 1 rank");
  expect_same(ep[1], run_single(w1, kDir41), V, "v41 rank 1 seq0 vs 1 rank");
  expect_same(ep[0], f32_of(ref, "seq1.logits"), V, "v41 rank 0 seq1 vs HF");
  expect_same(ep[1], f32_of(ref, "seq0.logits"), V, "v41 rank 1 seq0 vs HF");
}
