// Exact decoder replay of the V4.1 forward (model/replay.h): the replay set derived from the
// config (V4.1-Flash, the tiny fixture, V4), its host plumbing (spans, sub-steps, row gathers),
// the rows the model really runs, and replay against every layer on every row.
//
// Tolerance of the model comparisons: zero. Every CPU op computes each output row from its own
// input row, its position and the caches alone (double accumulation per row, per-row / per-32
// quantizers, per-query attention and top-k), so a layer run on a chunk's trailing rows
// produces those rows bit for bit as the full forward does; the rows it skips are read by no
// later layer and no later step (the derivation in replay.h). Any nonzero difference is a
// replay bug (a missing window row, a wrong position, a stale selection), not rounding.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "backend/backend.h"
#include "fixture_util.h"
#include "model/config.h"
#include "model/cost.h"
#include "model/model.h"
#include "model/replay.h"
#include "model/single_sequence.h"
#include "model/step.h"
#include "model/v41_model.h"

using namespace dil;
using namespace dil::test;

namespace {

const std::string kSrc = DIL_SOURCE_DIR;
const std::string kDir41 = kSrc + "/tests/data/v41-tiny";

// ---- the replay set from the config ----

TEST(ReplaySchedule, V41FlashRunsLayers20To39OnAShrinkingTail) {
  const ModelConfig c = load_config(kSrc + "/configs/deepseek-v4.1-flash.json");
  const ReplaySchedule s = replay_schedule(c);
  ASSERT_EQ(s.first, 20);  // the last of kv_source_layer_ids [2, 8, 14, 20]
  ASSERT_EQ(s.window, 128);
  // The roadmap chunk: 4,096 new tokens.
  int64_t decoder_rows = 0;
  for (int L = 0; L < c.n_layers; ++L) {
    const ReplayRows r = replay_rows(s, L, 4096);
    if (L < 20) {
      EXPECT_EQ(r.x, 4096) << L;
      EXPECT_EQ(r.kv, 4096) << L;
      EXPECT_EQ(r.out, 4096) << L;
      continue;
    }
    const int k = 39 - L;  // layers after L
    EXPECT_EQ(r.out, std::min(4096, 1 + 127 * k)) << L;
    EXPECT_EQ(r.kv, std::min(4096, 1 + 127 * (k + 1))) << L;
    EXPECT_EQ(r.x, L == 20 ? 4096 : replay_rows(s, L - 1, 4096).out) << L;  // layer 20's compressor: every token
    decoder_rows += r.out;
  }
  EXPECT_EQ(replay_rows(s, 20, 4096).out, 2414);
  EXPECT_EQ(replay_rows(s, 20, 4096).kv, 2541);
  EXPECT_EQ(replay_rows(s, 39, 4096).out, 1);
  EXPECT_EQ(replay_rows(s, 39, 4096).kv, 128);
  EXPECT_EQ(decoder_rows, 24150);  // of 20 x 4,096 = 81,920
  // A prompt shorter than the window: every layer but the last needs all of it (the ring).
  for (int L = 0; L < 39; ++L) EXPECT_EQ(replay_rows(s, L, 100).out, 100) << L;
  EXPECT_EQ(replay_rows(s, 39, 100).out, 1);
  EXPECT_EQ(replay_rows(s, 39, 100).kv, 100);
  // Decode: one row everywhere.
  for (int L = 0; L < c.n_layers; ++L) EXPECT_EQ(replay_rows(s, L, 1).x, 1);
}

TEST(ReplaySchedule, TinyFixtureAndV4) {
  const ModelConfig t = load_config(kDir41 + "/config.json");  // sources 2 (ratio 2) and 5 (ratio 1), 8 layers
  const ReplaySchedule s = replay_schedule(t);
  EXPECT_EQ(s.first, 5);
  const int want_out[8] = {400, 400, 400, 400, 400, 255, 128, 1}, want_kv[8] = {400, 400, 400, 400, 400, 382, 255, 128};
  for (int L = 0; L < 8; ++L) {
    EXPECT_EQ(replay_rows(s, L, 400).out, want_out[L]) << L;
    EXPECT_EQ(replay_rows(s, L, 400).kv, want_kv[L]) << L;
  }
  // V4-Flash: every layer with a ratio compresses its own rows; the last (42, ratio 4) is the
  // last source, so only its attention + MoE could skip rows (V4Model does not replay).
  EXPECT_EQ(replay_schedule(load_config(kSrc + "/configs/deepseek-v4-flash.json")).first, 42);
}

TEST(ReplaySchedule, PlanKeepsWholeChunksThatNeedEveryRow) {
  const ReplaySchedule s = replay_schedule(load_config(kDir41 + "/config.json"));
  StepBatch b;
  auto chunk = [&](int start, int n, bool all) {
    SeqChunk c;
    c.slot = int32_t(b.seqs.size());
    c.start_pos = start;
    c.n_tokens = n;
    c.all_logits = all;
    b.seqs.push_back(c);
  };
  chunk(0, 400, false);  // replays
  chunk(0, 400, true);   // prompt logprobs: whole
  chunk(57, 1, false);   // decode
  const std::vector<LayerSpans> p = plan_replay(s, b, true);
  ASSERT_EQ(p.size(), 8u);
  EXPECT_EQ(p[7].out[0], (RowSpan{399, 400}));
  EXPECT_EQ(p[7].head[0], (RowSpan{272, 399}));
  EXPECT_EQ(p[7].x[0], (RowSpan{272, 400}));  // = out(6): 1 + 127 rows
  EXPECT_EQ(p[5].x[0], (RowSpan{0, 400}));
  EXPECT_EQ(p[5].head[0], (RowSpan{18, 145}));
  EXPECT_TRUE(p[7].trims() && p[5].trims() && !p[4].trims());
  for (int L = 0; L < 8; ++L) {
    EXPECT_EQ(p[size_t(L)].out[1], (RowSpan{0, 400})) << L;
    EXPECT_EQ(p[size_t(L)].out[2], (RowSpan{0, 1})) << L;
  }
  for (const LayerSpans& ls : plan_replay(s, b, false)) EXPECT_FALSE(ls.trims());
}

// The cost model counts the rows the replay runs (docs/performance.md quotes these numbers):
// per-token modules of layers 20..39 scale by 24,150 / 81,920 rows, the compressors (every
// token) and the head do not change, and V4 ignores the flag.
TEST(ReplayCost, CountsTheReplayRows) {
  const ModelConfig c = load_config(kSrc + "/configs/deepseek-v4.1-flash.json");
  const auto with = step_cost(c, {}, 1, 126976, 4096, true), without = step_cost(c, {}, 1, 126976, 4096, false);
  const double rows_ratio = (20.0 * 4096 + 24150) / (40.0 * 4096);
  for (const char* mod : {"moe experts", "moe shared", "moe gate"})
    EXPECT_NEAR(with.at(mod).flops / without.at(mod).flops, rows_ratio, 1e-12) << mod;
  EXPECT_EQ(with.at("compressors").flops, without.at("compressors").flops);
  EXPECT_EQ(with.at("embed+head").flops, without.at("embed+head").flops);
  double tw = 0, to = 0;
  for (const auto& [name, mc] : with) {
    EXPECT_LE(mc.flops, without.at(name).flops) << name;
    std::printf("[cost V4.1-Flash 4096 new after 126976] %-16s %10.3f TFLOP replay, %10.3f every row\n", name.c_str(),
                mc.flops / 1e12, without.at(name).flops / 1e12);
    tw += mc.flops, to += without.at(name).flops;
  }
  std::printf("[cost V4.1-Flash] total %.3f TFLOP replay, %.3f every row (%.1f%%); %.2f / %.2f GFLOP per new token\n",
              tw / 1e12, to / 1e12, 100 * tw / to, tw / 4096 / 1e9, to / 4096 / 1e9);
  EXPECT_LT(tw, 0.8 * to);
  const ModelConfig v4 = load_config(kSrc + "/configs/deepseek-v4-flash.json");
  const auto a = step_cost(v4, {}, 1, 126976, 4096, true), b = step_cost(v4, {}, 1, 126976, 4096, false);
  for (const auto& [name, mc] : a) EXPECT_EQ(mc.flops, b.at(name).flops) << name;
}

// ---- host plumbing ----

TEST(ReplayRows, SubMetaAndGather) {
  auto be = make_backend(BackendKind::CPU);
  StepBatch b;
  const int starts[3] = {0, 300, 9}, lens[3] = {5, 1, 4};
  for (int i = 0; i < 3; ++i) {
    SeqChunk c;
    c.slot = 2 - i;
    c.start_pos = starts[i];
    c.n_tokens = lens[i];
    for (int k = 0; k < 3; ++k) c.blocks.push_back(10 * i + k);
    b.seqs.push_back(c);
    for (int t = 0; t < lens[i]; ++t) b.tokens.push_back(t);
  }
  StepPlan p = plan_step(b, 128, *be);
  std::vector<Buffer> st;
  const RowSpans spans{{2, 5}, {0, 0}, {1, 4}};
  StepMeta s = sub_meta(p.meta, spans, *be, &st);
  ASSERT_EQ(s.n_seqs, 2);
  EXPECT_EQ(s.n_tokens, 6);
  EXPECT_EQ(s.h_start_pos, (std::vector<int32_t>{2, 10}));
  EXPECT_EQ(s.h_len, (std::vector<int32_t>{3, 3}));
  EXPECT_EQ(s.h_q_start, (std::vector<int32_t>{0, 3}));
  EXPECT_EQ(s.h_slot, (std::vector<int32_t>{2, 0}));
  EXPECT_EQ(s.h_tok_pos, (std::vector<int32_t>{2, 3, 4, 10, 11, 12}));
  EXPECT_EQ(s.h_tok_seq, (std::vector<int32_t>{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(s.h_block_table[size_t(s.max_blocks)], 20);  // chunk 2's table, now the second row
  std::vector<int32_t> dev(6);
  be->download(dev.data(), s.tok_pos);
  EXPECT_EQ(dev, s.h_tok_pos);
  // Rows of a [10, 2] tensor whose row r holds (r, -r); narrow to `spans`, then further.
  std::vector<float> h(20);
  for (int r = 0; r < 10; ++r) h[size_t(2 * r)] = float(r), h[size_t(2 * r + 1)] = float(-r);
  Buffer a = be->alloc(80), c = be->alloc(48), d = be->alloc(16);
  Tensor src(a.data(), DType::F32, {10, 2}), mid(c.data(), DType::F32, {6, 2}), fin(d.data(), DType::F32, {2, 2});
  be->upload(src, h.data());
  const RowSpans whole{{0, 5}, {0, 1}, {0, 4}};
  gather_rows(*be, src, whole, mid, spans);
  const float* m = mid.ptr<float>();
  const int want[6] = {2, 3, 4, 7, 8, 9};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(m[2 * i], float(want[i])) << i;
  gather_rows(*be, mid, spans, fin, RowSpans{{4, 5}, {0, 0}, {3, 4}});
  EXPECT_EQ(fin.ptr<float>()[0], 4.0f);
  EXPECT_EQ(fin.ptr<float>()[2], 9.0f);
  EXPECT_EQ(fin.ptr<float>()[3], -9.0f);
}

// ---- the model: replay against every layer on every row ----

struct ReplayPair {
  std::unique_ptr<Backend> be_on = make_backend(BackendKind::CPU), be_off = make_backend(BackendKind::CPU);
  std::unique_ptr<Model> on, off;
  int64_t V = 0;
  ReplayPair(const std::string& dir, Numerics n, const std::string& format = "safetensors") {
    ModelOptions o;
    o.numerics = n;
    o.load_format = format;
    o.decoder_replay = true;
    on = load_model(dir, *be_on, o);
    o.decoder_replay = false;
    off = load_model(dir, *be_off, o);
    V = on->config().vocab_size;
  }
};

// The prompt fed in `chunks` (last-token logits only, as the engine asks), then `steps` greedy
// tokens: the logits of every chunk's last token and of every step, and the tokens.
struct Run {
  std::vector<float> logits;
  std::vector<int32_t> tokens;
};
Run prefill_and_greedy(Model& model, const std::vector<int32_t>& prompt, const std::vector<int>& chunks, int steps) {
  SingleSequence seq(model, int(prompt.size()) + steps + 1);
  Run r;
  size_t pos = 0;
  std::vector<float> lg;
  for (int c : chunks) {
    lg = seq.feed(std::vector<int32_t>(prompt.begin() + ptrdiff_t(pos), prompt.begin() + ptrdiff_t(pos) + c), false);
    r.logits.insert(r.logits.end(), lg.begin(), lg.end());
    pos += size_t(c);
  }
  EXPECT_EQ(pos, prompt.size());
  const int64_t V = model.config().vocab_size;
  for (int i = 0; i < steps; ++i) {
    int32_t best = 0;
    for (int64_t v = 1; v < V; ++v)
      if (lg[size_t(v)] > lg[size_t(best)]) best = int32_t(v);
    r.tokens.push_back(best);
    lg = seq.feed({best}, false);
    r.logits.insert(r.logits.end(), lg.begin(), lg.end());
  }
  return r;
}

void expect_same(ReplayPair& p, const std::vector<int32_t>& prompt, const std::vector<int>& chunks, int steps,
                 const std::string& what) {
  const Run a = prefill_and_greedy(*p.on, prompt, chunks, steps), b = prefill_and_greedy(*p.off, prompt, chunks, steps);
  EXPECT_EQ(a.tokens, b.tokens) << what;
  expect_within(compare_logits(a.logits, b.logits, p.V), 0, 0, what + " replay vs every row");
}

// Rows that ran attention + MoE in the last step, per layer.
std::vector<int64_t> rows_of(Model& m) { return dynamic_cast<V41Model&>(m).layer_rows(); }

TEST(V41Replay, RunsOnlyTheReplayRows) {
  ReplayPair p(kDir41, Numerics::Official);
  SafeTensors ref = SafeTensors::open(kDir41 + "/reference.safetensors");
  const auto ids = ids_of(ref, "seq2.input_ids");  // 400
  SingleSequence a(*p.on, 400), b(*p.off, 400), c(*p.on, 400);
  a.feed(ids, false);
  EXPECT_EQ(rows_of(*p.on), (std::vector<int64_t>{400, 400, 400, 400, 400, 255, 128, 1}));
  b.feed(ids, false);
  EXPECT_EQ(rows_of(*p.off), std::vector<int64_t>(8, 400));
  c.feed(std::vector<int32_t>(ids.begin(), ids.begin() + 300), true);  // every position's logits: no replay
  EXPECT_EQ(rows_of(*p.on), std::vector<int64_t>(8, 300));
  c.feed(std::vector<int32_t>(ids.begin() + 300, ids.end()), false);  // a later chunk shorter than the window
  EXPECT_EQ(rows_of(*p.on), (std::vector<int64_t>{100, 100, 100, 100, 100, 100, 100, 1}));
}

// Prompts of 7 and 100 tokens (shorter than the window), 130 and 400 (longer), whole and in
// chunks whose ends fall on and off the ratio-2 source's boundaries (odd and even ends) and on
// both sides of the replay's row counts (255, 382), then 40 greedy tokens.
// `all`: every case (the default numerics); otherwise (CI time: each case is two CPU
// prefills) one prompt shorter and one longer than the window, whole and in chunks with odd
// and even ends, 40 greedy tokens after each.
void check_mode(Numerics n, const std::string& tag, bool all) {
  ReplayPair p(kDir41, n);
  SafeTensors ref = SafeTensors::open(kDir41 + "/reference.safetensors");
  const auto s0 = ids_of(ref, "seq0.input_ids"), s1 = ids_of(ref, "seq1.input_ids"), s2 = ids_of(ref, "seq2.input_ids");
  expect_same(p, s0, {7}, 40, tag + " 7 tokens + 40 greedy");
  expect_same(p, s2, {101, 299}, 40, tag + " chunks 101 (odd end), 299 + 40 greedy");
  if (!all) return;
  expect_same(p, std::vector<int32_t>(s2.begin(), s2.begin() + 100), {100}, 0, tag + " 100 tokens");
  expect_same(p, s1, {130}, 0, tag + " 130 tokens");
  expect_same(p, s2, {400}, 40, tag + " 400 tokens + 40 greedy");
  expect_same(p, s2, {100, 37, 263}, 0, tag + " chunks 100, 37 (odd end), 263");
  expect_same(p, s2, {256, 1, 126, 17}, 0, tag + " chunks 256, 1, 126, 17");
}

TEST(V41Replay, ReferenceModeEqualsFullForward) { check_mode(Numerics::Reference, "reference", false); }
TEST(V41Replay, OfficialModeEqualsFullForward) { check_mode(Numerics::Official, "official", true); }
TEST(V41Replay, FastModeEqualsFullForward) { check_mode(Numerics::Fast, "fast", false); }

// Several sequences per step, each in its own slot and blocks, prefill chunks and decode
// tokens mixed, a chunk with every position's logits among them; every logits row compared.
TEST(V41Replay, SeveralSequencesInOneStep) {
  ReplayPair p(kDir41, Numerics::Official);
  SafeTensors ref = SafeTensors::open(kDir41 + "/reference.safetensors");
  const auto s1 = ids_of(ref, "seq1.input_ids"), s2 = ids_of(ref, "seq2.input_ids");
  std::vector<int32_t> r2(s2.rbegin(), s2.rend()), s12 = s1;
  s12.insert(s12.end(), s2.begin(), s2.end());
  const std::vector<int32_t>* src[3] = {&s2, &r2, &s12};
  const int bt = 128, blocks_per_seq = 4;
  for (Model* m : {p.on.get(), p.off.get()}) m->allocate_cache(3 * blocks_per_seq, 3, bt);
  // (sequence, start, tokens, all_logits) per step: chunks of each sequence's token list.
  struct Part { int seq, start, n; bool all; };
  const std::vector<std::vector<Part>> steps = {
      {{0, 0, 300, false}, {1, 0, 60, false}},
      {{0, 300, 1, false}, {1, 60, 70, true}, {2, 0, 7, false}},
      {{0, 301, 1, false}, {1, 130, 1, false}, {2, 7, 390, false}},
      {{0, 302, 1, false}, {1, 131, 1, false}, {2, 397, 1, false}},
      {{2, 398, 1, false}, {0, 303, 1, false}},
  };
  std::vector<int32_t> seq_tokens[2][3];
  for (int w = 0; w < 2; ++w)
    for (int q = 0; q < 3; ++q) seq_tokens[w][q] = *src[q];
  std::vector<float> out[2];
  for (const auto& parts : steps) {
    for (int w = 0; w < 2; ++w) {
      Model& m = w == 0 ? *p.on : *p.off;
      StepBatch b;
      for (const Part& pt : parts) {
        SeqChunk c;
        c.slot = pt.seq;
        c.start_pos = pt.start;
        c.n_tokens = pt.n;
        c.all_logits = pt.all;
        for (int k = 0; k < blocks_per_seq; ++k) c.blocks.push_back(pt.seq * blocks_per_seq + k);
        b.seqs.push_back(c);
        const auto& t = seq_tokens[w][size_t(pt.seq)];
        b.tokens.insert(b.tokens.end(), t.begin() + pt.start, t.begin() + pt.start + pt.n);
      }
      std::vector<float> lg;
      m.forward(b, &lg);
      out[w].insert(out[w].end(), lg.begin(), lg.end());
    }
  }
  EXPECT_EQ(out[0].size(), out[1].size());
  expect_within(compare_logits(out[0], out[1], p.V), 0, 0, "official 3 sequences, mixed steps, replay vs every row");
}

// A config whose last kv source has ratio 2 (its compressor's windows straddle chunk ends) and
// Engram inside the replayed layers, on dummy weights: the tiny fixture's dimensions, 10
// layers, sources 2 and 5 (both ratio 2), candidate source 5, Reindex 7 and 9, Engram 1 and 6.
std::string ratio2_folder() {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("dil_replay_ratio2_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(std::ifstream(kDir41 + "/config.json"));
  auto& t = j["text_config"];
  t["num_hidden_layers"] = 10;
  t["compress_ratios"] = {0, 0, 2, 2, 2, 2, 2, 2, 2, 2};
  t["kv_source_layer_ids"] = {2, 5};
  t["index_source_layer_ids"] = {2, 5, 7, 9};
  t["candidate_source_layer_id"] = 5;
  t["engram_layer_ids"] = {1, 6};  // the prime sums do not depend on the layer ids
  std::ofstream(dir / "config.json") << j.dump(2);
  fs::copy_file(kDir41 + "/tokenizer.json", dir / "tokenizer.json", fs::copy_options::overwrite_existing);
  return dir.string();
}

TEST(V41Replay, Ratio2LastSourceAndEngramOnDummyWeights) {
  const std::string dir = ratio2_folder();
  ReplayPair p(dir, Numerics::Official, "dummy");
  std::vector<int32_t> ids;
  for (int i = 0; i < 700; ++i) ids.push_back(3 + (i * 389 + 17) % 1021);
  SingleSequence a(*p.on, 700);
  a.feed(ids, false);
  // Layers 5..9 from the config: 9 on 1 row, 5 on 1 + 4 * 127.
  EXPECT_EQ(rows_of(*p.on), (std::vector<int64_t>{700, 700, 700, 700, 700, 509, 382, 255, 128, 1}));
  expect_same(p, ids, {700}, 20, "dummy ratio-2 source, 700 tokens + 20 greedy");
  // Chunk ends at 333 (odd: the source's compressor holds a pending token) and 334 (even).
  expect_same(p, ids, {333, 1, 366}, 20, "dummy ratio-2 source, chunks 333 (odd end), 1, 366 + 20 greedy");
  std::filesystem::remove_all(dir);
}

}  // namespace
