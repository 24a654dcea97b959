// The forward issues no host-to-device copy after its first op (issue 25): plan_step uploads
// the step's layout, token ids and every compressor ratio's emits in one copy before the first
// kernel (model/step.h), so the device never waits on the host inside a step and the decode
// forward can be captured as a CUDA graph. Checked on the CPU backend through the interposer,
// which sees every op; uploads are counted per step and split into before / after its first op.
// V4.1's Engram rows are the one known exception in decode (a host look-up per Engram layer,
// right before its engram_mix): counted exactly, so a new mid-forward upload still fails.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "model/model.h"
#include "model/step.h"
#include "trace/interpose.h"

namespace dil::trace {
namespace {

struct Counter : CallHook {
  int ops = 0, engram_ops = 0;
  void around(Backend&, Call& c, const std::function<void()>& op) override {
    ++ops;
    if (std::strcmp(c.op, "engram_mix") == 0) ++engram_ops;
    op();
  }
};

class CountingBackend : public InterposingBackend {
 public:
  CountingBackend(Backend& inner, Counter& h) : InterposingBackend(inner, h, "count"), h_(h) {}
  void upload(Tensor dst, const void* src) override {
    ++uploads;
    if (h_.ops > 0) ++late;
    InterposingBackend::upload(dst, src);
  }
  Buffer alloc(size_t bytes) override {
    ++allocs;
    return InterposingBackend::alloc(bytes);
  }
  void reset() { uploads = late = allocs = h_.ops = h_.engram_ops = 0; }
  int uploads = 0, late = 0;  // this step: all uploads, those after its first op
  int allocs = 0;             // this step's allocations (CUDA: each a zero-fill launch)

 private:
  Counter& h_;
};

// Two sequences: a prefill (positions 0..n-1 of each, two chunks in one step), then decode
// steps of one token each; returns nothing, checks every step.
void check_fixture(const std::string& name) {
  SCOPED_TRACE(name);
  auto cpu = make_backend(BackendKind::CPU);
  Counter hook;
  CountingBackend be(*cpu, hook);
  ModelOptions o;
  o.numerics = Numerics::Fast;
  auto model = load_model(std::string(DIL_SOURCE_DIR) + "/tests/data/" + name, be, o);
  be.sync_plan();
  const int bt = 128;
  model->allocate_cache(8, 2, bt);
  const int V = int(model->config().vocab_size);
  StepBatch b;
  const int n0 = 37, n1 = 9;
  for (int t = 0; t < n0 + n1; ++t) b.tokens.push_back((t * 7 + 3) % V);
  b.seqs.push_back(SeqChunk{0, 0, n0, {0, 1}});
  b.seqs.push_back(SeqChunk{1, 0, n1, {2, 3}});
  std::vector<float> logits;
  be.reset();
  model->forward(b, &logits);
  EXPECT_GT(hook.ops, 0);
  // V4.1's prefill also uploads its decoder-replay sub-steps' layouts (model/replay.h) where the
  // replay narrows the rows; decode steps have whole rows.
  if (name == "v4-tiny") EXPECT_EQ(be.late, 0) << "prefill: uploads after the step's first op";
  else EXPECT_GE(be.late, hook.engram_ops) << "prefill";
  for (int step = 0; step < 4; ++step) {
    StepBatch d;
    d.tokens = {(step * 11 + 5) % V, (step * 13 + 1) % V};
    d.seqs.push_back(SeqChunk{0, n0 + step, 1, {0, 1}});
    d.seqs.push_back(SeqChunk{1, n1 + step, 1, {2, 3}});
    be.reset();
    model->forward(d, &logits);
    EXPECT_EQ(be.late, hook.engram_ops) << "decode step " << step << ": uploads after the step's first op";
    EXPECT_EQ(be.uploads - be.late, 1) << "decode step " << step << ": the one planned upload";
    ASSERT_EQ(logits.size(), size_t(2) * size_t(V));
    if (step == 0)
      std::printf("INFO   | %s decode step: %d ops, %d uploads, %d allocations\n", name.c_str(), hook.ops,
                  be.uploads, be.allocs);
  }
}

// plan_step's one packed upload holds what the separate uploads held: the layout, the ids and,
// per distinct ratio, the emits plan_emits computes (views 64-byte aligned).
TEST(StepUploads, PlanStepPacksEveryRatio) {
  auto be = make_backend(BackendKind::CPU);
  StepBatch b;
  b.seqs.push_back(SeqChunk{3, 0, 130, {0, 1}});   // prefill across a block: emits of both ratios
  b.seqs.push_back(SeqChunk{0, 127, 1, {2}});      // decode completing a window of 4 and of 128
  b.seqs.push_back(SeqChunk{1, 61, 5, {4, 5}});    // a chunk completing one window of 4
  for (int t = 0; t < 136; ++t) b.tokens.push_back(1000 + t);
  StepPlan p = plan_step(b, 128, *be, {4, 128, 4, 0});
  ASSERT_EQ(p.emits.size(), 2u);
  auto words = [](const Tensor& t) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 64, 0u);
    const int32_t* d = t.ptr<int32_t>();
    return std::vector<int32_t>(d, d + t.numel());
  };
  const StepMeta& m = p.meta;
  EXPECT_EQ(words(p.ids), b.tokens);
  EXPECT_EQ(words(m.q_start), m.h_q_start);
  EXPECT_EQ(words(m.len), m.h_len);
  EXPECT_EQ(words(m.start_pos), m.h_start_pos);
  EXPECT_EQ(words(m.slot), m.h_slot);
  EXPECT_EQ(words(m.tok_pos), m.h_tok_pos);
  EXPECT_EQ(words(m.tok_seq), m.h_tok_seq);
  EXPECT_EQ(words(m.block_table), m.h_block_table);
  EXPECT_EQ(m.block_table.size(0), 3);
  for (int r : {4, 128}) {
    const EmitPlan want = plan_emits_host(m, r), &got = p.emit(r);
    EXPECT_EQ(got.n, want.n) << r;
    EXPECT_EQ(words(got.seq), want.h_seq) << r;
    EXPECT_EQ(words(got.row), want.h_row) << r;
    EXPECT_EQ(words(got.pos), want.h_pos) << r;
  }
  EXPECT_EQ(p.emit(4).n, 32 + 1 + 1);  // windows 0..31; 31 (positions 124..127); 15 (60..63)
  EXPECT_EQ(p.emit(128).n, 1 + 1);
  EXPECT_THROW(p.emit(2), Error);
}

TEST(StepUploads, V4OnlyBeforeTheFirstOp) { check_fixture("v4-tiny"); }
TEST(StepUploads, V41OnlyBeforeTheFirstOpButEngram) { check_fixture("v41-tiny"); }

}  // namespace
}  // namespace dil::trace
