// The trace tool on the CPU (src/trace/trace.h), on the random fixtures v4-tiny and v41-tiny:
// - the same numerics mode on both sides: every op bit-identical (the CPU reference is a
//   deterministic function of the inputs the trace forces, so anything else is a bug of the
//   tool: a missed input, a state not forced, a mismatched call);
// - official vs fast: the fast mode is the official arithmetic with every output rounded once
//   to bf16 (backend.h), so B = fast fed A = official's values converted to bf16 equals A's
//   result rounded to bf16 wherever the conversion was exact, and fast -> official is exact
//   everywhere except the MoE's internal BF16 roundings;
// - a backend that adds 1e-3 to one op's output is named as the first (and only) op over.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>

#include "trace/hooks.h"
#include "trace/report.h"

namespace dil::trace {
namespace {

std::string fixture(const char* name) { return std::string(DIL_SOURCE_DIR) + "/tests/data/" + name; }

TraceOptions options(const char* name, int tokens, int decode, int start) {
  TraceOptions o;
  o.model = fixture(name);
  o.tokens = tokens;
  o.decode_steps = decode;
  o.start_pos = start;
  return o;
}

TraceReport cpu_trace(const TraceOptions& o, Numerics na, Numerics nb) {
  auto a = make_backend(BackendKind::CPU), b = make_backend(BackendKind::CPU);
  return run_trace(o, *a, na, *b, nb);
}

bool has_op(const TraceReport& r, const std::string& op) {
  for (const Check& c : r.checks)
    if (c.op == op) return true;
  return false;
}

void expect_all_exact(const TraceReport& r) {
  ASSERT_FALSE(r.checks.empty());
  for (const Check& c : r.checks) {
    EXPECT_TRUE(c.exact && c.ok && c.gate != "mode") << describe(c) << ": rel_l2 " << c.rel_l2 << " differ "
                                                      << c.differ << " gate " << c.gate;
  }
  EXPECT_EQ(r.over(), 0);
}

// 17 tokens from position 0 (fresh state: reset_state, the compressors' first windows), then two
// decode steps.
TEST(TraceCpu, V4SameModeIsExact) {
  for (Numerics n : {Numerics::Official, Numerics::Fast, Numerics::Reference}) {
    SCOPED_TRACE(numerics_name(n));
    TraceReport r = cpu_trace(options("v4-tiny", 17, 2, 0), n, n);
    expect_all_exact(r);
    EXPECT_EQ(r.steps.size(), 3u);
    for (const char* op : {"embed", "hc_pre", "linear", "grouped_linear", "sparse_attention", "ring_write",
                           "compressor", "paged_write", "indexer_topk", "moe_route", "moe_experts", "swiglu",
                           "reset_state"})
      EXPECT_TRUE(has_op(r, op)) << op;
    if (n != Numerics::Reference)
      for (const char* op : {"fp8_qdq", "fp4_qdq", "hadamard"}) EXPECT_TRUE(has_op(r, op)) << op;
    // Every layer of the fixture appears, with its kind.
    std::set<std::string> kinds;
    for (const Check& c : r.checks)
      if (c.layer >= 0) kinds.insert(std::to_string(c.layer) + c.kind);
    EXPECT_EQ(kinds, (std::set<std::string>{"0SWA", "1SWA", "2CSA", "3HCA", "4CSA"}));
  }
}

// After a synthesized context (random rings, compressed rows, compressor state): the prompt
// crosses the HCA window boundary at 128 and V4.1's candidate / Reindex selections read rows
// the trace forced from A.
TEST(TraceCpu, V41SameModeIsExactAfterASynthesizedContext) {
  for (Numerics n : {Numerics::Official, Numerics::Fast}) {
    SCOPED_TRACE(numerics_name(n));
    TraceReport r = cpu_trace(options("v41-tiny", 13, 2, 120), n, n);
    expect_all_exact(r);
    EXPECT_FALSE(has_op(r, "reset_state"));  // a continuing sequence keeps its state
    EXPECT_TRUE(has_op(r, "indexer_topk") && has_op(r, "compressor"));
  }
  expect_all_exact(cpu_trace(options("v4-tiny", 13, 1, 120), Numerics::Official, Numerics::Official));
}

const Check* first_with(const TraceReport& r, const std::string& op, int layer) {
  for (const Check& c : r.checks)
    if (c.op == op && c.layer == layer) return &c;
  return nullptr;
}

// Official (A) against fast (B): the model's first ops see inputs bf16 holds exactly (the BF16
// embedding table), later ones A's f32 activations rounded to bf16.
TEST(TraceCpu, OfficialVsFastIsTheRoundingWhereTheInputsAgree) {
  for (const char* fx : {"v4-tiny", "v41-tiny"}) {
    SCOPED_TRACE(fx);
    TraceReport r = cpu_trace(options(fx, 17, 1, 0), Numerics::Official, Numerics::Fast);
    ASSERT_TRUE(r.mode_pair());
    EXPECT_EQ(r.over(), 0);
    int gated = 0, mode = 0, mode_nonzero = 0;
    for (const Check& c : r.checks) {
      if (c.gate == "mode") {
        ++mode;
        mode_nonzero += !c.exact;
        continue;
      }
      ++gated;
      // Both sides are the CPU reference: where the inputs agree, fast is official rounded to bf16.
      EXPECT_TRUE(c.exact) << describe(c) << " rel_l2 " << c.rel_l2;
    }
    EXPECT_GT(gated, 0);
    EXPECT_GT(mode, 0);
    EXPECT_GT(mode_nonzero, 0);  // the mode difference shows
    // The embedding (a BF16 table) and the first mixes read values bf16 holds: gated and exact.
    for (const char* op : {"embed", "hc_expand"}) {
      const Check* c = first_with(r, op, -1);
      ASSERT_TRUE(c) << op;
      EXPECT_EQ(c->gate, "kernel") << op;
      EXPECT_TRUE(c->exact) << op;
      EXPECT_EQ(c->dtype, "f32->bf16") << op;
    }
    // The first mixes are the fused pre, which rounds its collapsed row to bf16 inside in fast
    // numerics (f32 in official): the mode, although its inputs are exact in bf16.
    const bool v4 = std::string(fx) == "v4-tiny";
    const Check* mix = first_with(r, "hc_pre", 0);
    ASSERT_TRUE(mix);
    EXPECT_EQ(mix->gate, "mode");
    // The routers' logits and the compressors' projections are f32 in both modes: every call
    // of moe_route and compressor is gated, and exact.
    for (const Check& c : r.checks)
      if (c.op == "moe_route" || c.op == "compressor") EXPECT_NE(c.gate, "mode") << describe(c);
    // The first op whose modes differ is the layer-0 fused pre (its first output is xn). In V4
    // its collapse is rounded to bf16 in fast numerics and kept f32 in official, so xn differs;
    // in V4.1 that collapse of the expanded embedding is bf16-exact (equal streams, the one-hot
    // first pre), so xn agrees and the first difference is the norm's f32 output, fed to wq_a.
    const Check* first_mode = nullptr;
    for (const Check& c : r.checks)
      if (c.gate == "mode") {
        first_mode = &c;
        break;
      }
    ASSERT_TRUE(first_mode);
    EXPECT_EQ(first_mode->op, "hc_pre");
    EXPECT_EQ(first_mode->output, "xn");
    EXPECT_EQ(first_mode->layer, 0);
    if (v4) EXPECT_GT(first_mode->rel_l2, 0);
    else EXPECT_TRUE(first_mode->exact);
    if (!v4) {
      const Check* wq_a = first_with(r, "linear", 0);
      ASSERT_TRUE(wq_a);
      EXPECT_EQ(wq_a->gate, "mode");
      EXPECT_GT(wq_a->rel_l2, 0);
    }
    // Under teacher forcing an RMSNorm's only mode difference is its input's rounding, bounded
    // by the rounding's derivation: x' = bf16(x) moves each input by <= 2^-8 relative (RNE:
    // 2^-9) and the norm factor by <= 2^-8, so y' is within 2^-7 |y| of y, and their bf16
    // roundings within 2^-7 |y| + one ulp (<= 2^-7 |y|) = 2^-6 |y| of each other (f32
    // roundings: 1e-6 margin).
    // The fused pre's xn is the same case: its norm's input (the collapsed row) is rounded to
    // bf16 in fast numerics and kept f32 in official (V4.1's layer-0 attention pre collapses the
    // expanded embedding, which bf16 holds: no difference there).
    int norms = 0;
    for (const Check& c : r.checks)
      if ((c.op == "rms_norm" || (c.op == "hc_pre" && c.output == "xn")) && c.gate == "mode") {
        ++norms;
        if (c.op == "rms_norm") EXPECT_GT(c.rel_l2, 0) << describe(c);
        EXPECT_LE(c.max_abs, 0x1p-6 * c.max_ref * (1 + 1e-6)) << describe(c);
      }
    EXPECT_GT(norms, 0);
  }
}

// Fast (A) against official (B): every input converts exactly (bf16 -> f32), so every op is
// gated, and each is exact (official's result rounded to bf16 is fast's) except the routed
// experts, whose fast arithmetic rounds inside the op, and the fused mHC pre, whose fast
// collapse is rounded to bf16 before its norm (the mode; its mixes pre / post / comb agree).
TEST(TraceCpu, FastVsOfficialDiffersOnlyInTheExpertsRoundings) {
  for (const char* fx : {"v4-tiny", "v41-tiny"}) {
    SCOPED_TRACE(fx);
    TraceReport r = cpu_trace(options(fx, 17, 1, 0), Numerics::Fast, Numerics::Official);
    EXPECT_EQ(r.over(), 0);
    int experts = 0, pres = 0;
    for (const Check& c : r.checks) {
      if (c.op == "moe_experts") {
        ++experts;
        EXPECT_EQ(c.gate, "mode") << describe(c);
        EXPECT_FALSE(c.exact) << describe(c);
        continue;
      }
      if (c.op == "hc_pre") {
        ++pres;
        EXPECT_EQ(c.gate, "mode") << describe(c);
        if (c.output != "xn") EXPECT_TRUE(c.exact) << describe(c);
        continue;
      }
      EXPECT_NE(c.gate, "mode") << describe(c);
      EXPECT_TRUE(c.exact) << describe(c) << " rel_l2 " << c.rel_l2;
    }
    EXPECT_GT(experts, 0);
    EXPECT_GT(pres, 0);
  }
}

TEST(TraceCpu, RejectsReferenceAgainstAQuantizingMode) {
  EXPECT_THROW(cpu_trace(options("v4-tiny", 3, 0, 0), Numerics::Reference, Numerics::Official), Error);
}

// B adds 1e-3 to one op's output: that op, and only it, is over (teacher forcing: the next ops
// run on A's values again), and it is the first op over.
TEST(TraceCpu, APerturbedOpIsNamedFirst) {
  struct Case {
    const char* spec;
    const char* output;
    int layer;
  };
  for (const Case& k : {Case{"sparse_attention:3", "out", 2}, Case{"compressor:2", "state_kv", 2},
                        Case{"linear:40", "", -2}}) {
    SCOPED_TRACE(k.spec);
    const Perturbation p = parse_perturbation(k.spec);
    auto a = make_backend(BackendKind::CPU), cpu_b = make_backend(BackendKind::CPU);
    auto b = make_perturbed(*cpu_b, p);
    TraceReport r = run_trace(options("v4-tiny", 17, 1, 0), *a, Numerics::Official, *b, Numerics::Official);
    ASSERT_TRUE(b->fired());
    const Check* c = r.first_over();
    ASSERT_TRUE(c);
    EXPECT_EQ(c->op, p.op);
    if (k.layer != -2) EXPECT_EQ(c->layer, k.layer);
    if (*k.output) EXPECT_EQ(c->output, k.output);
    EXPECT_EQ(c->step, 0);
    EXPECT_EQ(r.over(), 1) << "only the perturbed output is over";
    // Its index is that of the op's nth call in the run.
    int calls = 0, index = -1;
    for (const Check& x : r.checks)
      if (x.op == p.op && x.index != index) {
        index = x.index;
        if (++calls == p.nth) break;
      }
    EXPECT_EQ(c->index, index);
  }
}

}  // namespace
}  // namespace dil::trace
