// The V4 CPU forward against tests/data/v4-tiny (see its README):
// - reference mode vs HF transformers float64 (reference.safetensors): every position within
//   max |d| <= 2e-3 and relative L2 <= 1e-4 (issue 2's bounds); chunked prefill and
//   prefill + single-token decode within the same bounds;
// - official mode vs DeepSeek's own code with its quantization simulation
//   (reference-official.safetensors): bounds stated below with the measured values.
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "fixture_util.h"
#include "model/model.h"
#include "model/single_sequence.h"

using namespace dil;
using namespace dil::test;

static const std::string kDir = std::string(DIL_SOURCE_DIR) + "/tests/data/v4-tiny";

TEST(V4Fixture, ReferenceModeMatchesHF) { check_mode(kDir, Numerics::Reference, "reference.safetensors", 2e-3, 1e-4, "reference"); }

// Official numerics. The first positions agree with DeepSeek's code to ~1e-7; later ones
// diverge once a last-bit difference (fp32 reduction order in RMSNorm, the fp32 F.linear of the
// compressor/gate/mHC in the reference vs our double accumulation) flips one FP8 rounding of an
// activation or a KV row, which random tiny weights amplify (the fixture README warns of
// this). Measured on this fixture: seq0 (7 tokens) 1.6e-7; seq1 first flip at position 21
// (3e-3), persistent divergence from 66; totals rel L2 0.087 (seq1), 0.085 (seq2), 0.138
// (decode), argmax agreement 121/130, 367/400, 32/40. Bounds below: a clean prefix of 20
// positions at 1e-5, totals within 0.12 (full sequences) / 0.2 (decode), and always much
// closer to the official logits than to the unquantized reference (measured 0.087 vs 0.144
// for seq1). A control run that only rounds RMSNorm's rsqrt in fp32 instead of double moves
// our own official logits by 0.056 (first change at position 17): the divergence is FP8
// rounding flips, not a semantic difference.
TEST(V4Fixture, OfficialModeMatchesDeepSeekCode) {
  ModelFixture f(kDir, Numerics::Official, "reference-official.safetensors");
  SafeTensors hf = SafeTensors::open(kDir + "/reference.safetensors");
  for (int i = 0; i < 3; ++i) {
    std::string k = "seq" + std::to_string(i);
    auto ids = ids_of(f.ref, k + ".input_ids");
    auto want = f32_of(f.ref, k + ".logits");
    auto got = f.run(ids, {int(ids.size())});
    Diff d = compare_logits(got, want, f.V);
    std::printf("[official %s] max|d| %.3e  total rel L2 %.3e  argmax agree %d/%d\n", k.c_str(), d.max_abs,
                d.total_rel_l2, d.argmax_agree, d.rows);
    const size_t clean = std::min<size_t>(ids.size(), 20) * size_t(f.V);
    Diff p = compare_logits(std::vector<float>(got.begin(), got.begin() + ptrdiff_t(clean)),
                            std::vector<float>(want.begin(), want.begin() + ptrdiff_t(clean)), f.V);
    EXPECT_LE(p.max_rel_l2, 1e-5) << k << " clean prefix, worst position " << p.worst_pos;
    EXPECT_LE(d.total_rel_l2, 0.12) << k;
    EXPECT_GE(d.argmax_agree, int(0.9 * d.rows)) << k;
    Diff vs_hf = compare_logits(got, f32_of(hf, k + ".logits"), f.V);
    if (ids.size() > 20) {
      EXPECT_LT(d.total_rel_l2, vs_hf.total_rel_l2) << k << ": official mode is not simulating the quantization";
    }
  }
  // Decode: prefill the prompt, then single-token steps; the official decode path.
  auto prompt = ids_of(f.ref, "decode.input_ids");
  auto gen = ids_of(f.ref, "decode.generated_ids");
  std::vector<float> got = f.decode(prompt, gen);
  Diff d = compare_logits(got, f32_of(f.ref, "decode.logits"), f.V);
  std::printf("[official decode] total rel L2 %.3e  argmax agree %d/%d\n", d.total_rel_l2, d.argmax_agree, d.rows);
  EXPECT_LE(d.total_rel_l2, 0.2);
  EXPECT_GE(d.argmax_agree, int(0.75 * d.rows));
  // Our own incremental paths equal our full forward in official mode too (same bounds as
  // reference mode: chunking must not change the numerics).
  auto ids = ids_of(f.ref, "seq2.input_ids");
  auto full = f.run(ids, {400});
  Diff c = compare_logits(f.run(ids, {100, 37, 263}), full, f.V);
  EXPECT_LE(c.max_abs, 2e-3);
  EXPECT_LE(c.max_rel_l2, 1e-4);
  Diff s = compare_logits(f.run(ids, single_steps(20, 400)), full, f.V);
  EXPECT_LE(s.max_abs, 2e-3);
  EXPECT_LE(s.max_rel_l2, 1e-4);
}

// Fast numerics on the CPU (its specification): BF16 activations at the official BF16 points.
// On these random weights its logits differ from official mode's by the chaos level (each BF16
// rounding of an activation is a 2^-9 relative change, far above the ulp flips that already
// move official mode by ~0.1 relative L2 from DeepSeek's code); quality in fast numerics is
// measured on the trained fixtures. What holds exactly here: the incremental paths compute the
// full forward's function bit for bit (every op is per row, and the ring and cache hold the same
// bf16 rows a chunk computes in place), and the mode is not silently the official one.
TEST(V4Fixture, FastModeChunkedAndDecodeEqualFullForward) {
  ModelFixture f(kDir, Numerics::Fast, "reference-official.safetensors");
  ModelFixture o(kDir, Numerics::Official, "reference-official.safetensors");
  auto ids = ids_of(f.ref, "seq2.input_ids");
  auto full = f.run(ids, {400});
  Diff c = compare_logits(f.run(ids, {100, 37, 263}), full, f.V);
  expect_within(c, 0, 0, "fast seq2 chunks 100,37,263 vs full");
  Diff s = compare_logits(f.run(ids, single_steps(20, 400)), full, f.V);
  expect_within(s, 0, 0, "fast seq2 prefill 20 + 380 steps vs full");
  Diff vs_official = compare_logits(full, o.run(ids, {400}), f.V);
  std::printf("[fast vs official seq2] total rel L2 %.3e  argmax agree %d/%d\n", vs_official.total_rel_l2,
              vs_official.argmax_agree, vs_official.rows);
  EXPECT_GT(vs_official.max_abs, 0.0) << "fast numerics computed exactly the official logits";
}
