// The V4 model on the GPU against tests/data/v4-tiny and against the CPU backend:
// - reference mode: every position within the CPU test's bounds of HF's float64 logits
//   (max |d| <= 2e-3, rel L2 <= 1e-4), and 40 greedy decode steps giving the fixture's tokens
//   and the CPU's;
// - official mode: with DIL_TEST_KERNELS=linear=simt,... every GEMM is the double-accumulating SIMT kernel
//   and the logits must equal the CPU's to 1e-5 per position with identical greedy tokens;
//   with the default cuBLASLt FP8 path (2.3e-4 relative error per projection, tests/cuda)
//   FP8 roundings of activations flip early, so the bounds are those of the CPU's own
//   comparison with DeepSeek's code over decode: total rel L2 <= 0.2 against
//   reference-official.safetensors, argmax agreement >= 75%;
// - fast mode (bf16 activations, the CPU's fast numerics as the specification): with
//   DIL_TEST_KERNELS=linear=simt,...,hc_pre=composed,hc_mix=default,hc_post=default (gpu-check)
//   the GEMMs are the SIMT kernels (bit-identical f32 results, hence identical bf16 roundings),
//   the attention (head dim 128: the FP64 kernel), compressor and mHC sums are double like the
//   CPU's (the fast mHC kernels' f32 sums are bounded in test_mhc_fast.cpp) and the indexer's
//   tensor cores exact: the official
//   simt bound again (1e-5 per position, identical greedy tokens). With the default plan the
//   cuBLASLt FP8 error flips activation roundings from the first position on, so the logits sit
//   at the chaos level of these random weights; its size is measured in the same run as the
//   CPU's own distance between fast and official numerics on the same sequences (every
//   activation moved by a bf16 rounding: 0.156 total rel L2, argmax 324/400 on seq2 when this
//   test was written), and the CUDA logits must be within twice that (total over the three
//   sequences), argmax agreement >= 60% (the chaos level agrees ~80%).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "backend/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "model/model.h"
#include "model/single_sequence.h"
#include "../model/fixture_util.h"

using namespace dil;
using namespace dil::test;

namespace {

std::string fixture_dir() {
  const char* d = std::getenv("DIL_V4_TINY");
  return d ? std::string(d) : std::string(DIL_SOURCE_DIR) + "/tests/data/v4-tiny";
}
// DIL_TEST_KERNELS (tests/cuda/parity.h): scripts/gpu-check forces the exact SIMT GEMMs.
BackendOptions test_options() {
  BackendOptions o;
  if (const char* k = std::getenv("DIL_TEST_KERNELS")) parse_kernel_overrides(k, &o);
  return o;
}
bool simt_only() { return test_options().force.count("linear") > 0; }

struct ModelRun {
  std::unique_ptr<Backend> be;
  std::unique_ptr<Model> model;
  int64_t V = 0;
  ModelRun(BackendKind k, Numerics n) : be(make_backend(k, 0, k == BackendKind::CUDA ? test_options() : BackendOptions{})) {
    ModelOptions o;
    o.numerics = n;
    model = load_model(fixture_dir(), *be, o);
    V = model->config().vocab_size;
  }
  std::vector<float> full(const std::vector<int32_t>& ids) {
    SingleSequence seq(*model, int(ids.size()));
    return seq.feed(ids, true);
  }
  // Greedy continuation: prefill `prompt`, then n argmax steps; returns the tokens.
  std::vector<int32_t> greedy(const std::vector<int32_t>& prompt, int n) {
    SingleSequence seq(*model, int(prompt.size()) + n + 1);
    std::vector<float> lg = seq.feed(prompt, false);
    std::vector<int32_t> out;
    for (int i = 0; i < n; ++i) {
      int32_t best = 0;
      for (int64_t v = 1; v < V; ++v)
        if (lg[size_t(v)] > lg[size_t(best)]) best = int32_t(v);
      out.push_back(best);
      lg = seq.feed({best}, false);
    }
    return out;
  }
};

void report(const char* what, const Diff& d) {
  std::printf("MODEL | %-36s | rows %4d | max|d| %.3e | worst rel L2 %.3e | total rel L2 %.3e | argmax %d/%d\n", what,
              d.rows, d.max_abs, d.max_rel_l2, d.total_rel_l2, d.argmax_agree, d.rows);
  std::fflush(stdout);
}

class V4TinyCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(V4TinyCuda, ReferenceModeLogitsAndGreedy) {
  SafeTensors ref = SafeTensors::open(fixture_dir() + "/reference.safetensors");
  ModelRun gpu(BackendKind::CUDA, Numerics::Reference), cpu(BackendKind::CPU, Numerics::Reference);
  for (int i = 0; i < 3; ++i) {
    std::string k = "seq" + std::to_string(i);
    auto ids = ids_of(ref, k + ".input_ids");
    auto got = gpu.full(ids);
    Diff d = compare_logits(got, f32_of(ref, k + ".logits"), gpu.V);
    report(("reference " + k + " gpu vs HF fp64").c_str(), d);
    EXPECT_LE(d.max_abs, 2e-3) << k;
    EXPECT_LE(d.max_rel_l2, 1e-4) << k;
    Diff c = compare_logits(got, cpu.full(ids), gpu.V);
    report(("reference " + k + " gpu vs cpu").c_str(), c);
    EXPECT_LE(c.max_rel_l2, 1e-5) << k;
  }
  auto prompt = ids_of(ref, "decode.input_ids");
  auto want = ids_of(ref, "decode.generated_ids");
  auto g = gpu.greedy(prompt, 40), c = cpu.greedy(prompt, 40);
  int same_cpu = 0, same_ref = 0;
  for (int i = 0; i < 40; ++i) {
    same_cpu += g[size_t(i)] == c[size_t(i)];
    same_ref += i < int(want.size()) && g[size_t(i)] == want[size_t(i)];
  }
  std::printf("MODEL | %-36s | greedy 40 steps: %d/40 equal to the CPU, %d/40 equal to the fixture\n",
              "reference greedy", same_cpu, same_ref);
  EXPECT_EQ(g, c);
  EXPECT_EQ(same_ref, 40);
}

TEST_F(V4TinyCuda, OfficialMode) {
  SafeTensors ref = SafeTensors::open(fixture_dir() + "/reference-official.safetensors");
  ModelRun gpu(BackendKind::CUDA, Numerics::Official), cpu(BackendKind::CPU, Numerics::Official);
  const char* path = simt_only() ? "official simt" : "official cublasLt";
  for (int i = 0; i < 3; ++i) {
    std::string k = "seq" + std::to_string(i);
    auto ids = ids_of(ref, k + ".input_ids");
    auto got = gpu.full(ids);
    Diff d = compare_logits(got, f32_of(ref, k + ".logits"), gpu.V);
    report((std::string(path) + " " + k + " gpu vs deepseek").c_str(), d);
    Diff c = compare_logits(got, cpu.full(ids), gpu.V);
    report((std::string(path) + " " + k + " gpu vs cpu").c_str(), c);
    if (simt_only()) {
      EXPECT_LE(c.max_rel_l2, 1e-5) << k;
    } else {
      EXPECT_LE(d.total_rel_l2, 0.2) << k;
      EXPECT_GE(d.argmax_agree, int(0.75 * d.rows)) << k;
    }
  }
  auto prompt = ids_of(ref, "decode.input_ids");
  auto g = gpu.greedy(prompt, 40), c = cpu.greedy(prompt, 40);
  int same = 0;
  for (int i = 0; i < 40; ++i) same += g[size_t(i)] == c[size_t(i)];
  std::printf("MODEL | %-36s | greedy 40 steps: %d/40 equal to the CPU\n", path, same);
  if (simt_only()) {
    EXPECT_EQ(g, c);
  }
}

TEST_F(V4TinyCuda, FastMode) {
  SafeTensors ref = SafeTensors::open(fixture_dir() + "/reference-official.safetensors");
  ModelRun gpu(BackendKind::CUDA, Numerics::Fast), cpu(BackendKind::CPU, Numerics::Fast);
  const char* path = simt_only() ? "fast simt" : "fast default";
  std::vector<float> g_all, c_all, o_all;
  {
    ModelRun off(BackendKind::CPU, Numerics::Official);
    for (int i = 0; i < 3; ++i) {
      std::string k = "seq" + std::to_string(i);
      auto ids = ids_of(ref, k + ".input_ids");
      auto got = gpu.full(ids), want = cpu.full(ids), other = off.full(ids);
      Diff c = compare_logits(got, want, gpu.V);
      report((std::string(path) + " " + k + " gpu vs cpu").c_str(), c);
      if (simt_only()) {
        EXPECT_LE(c.max_rel_l2, 1e-5) << k;
      }
      g_all.insert(g_all.end(), got.begin(), got.end());
      c_all.insert(c_all.end(), want.begin(), want.end());
      o_all.insert(o_all.end(), other.begin(), other.end());
    }
  }
  const Diff all = compare_logits(g_all, c_all, gpu.V), chaos = compare_logits(o_all, c_all, gpu.V);
  report((std::string(path) + " seq0-2 gpu vs cpu").c_str(), all);
  report("cpu official vs cpu fast seq0-2 (chaos)", chaos);
  if (!simt_only()) {
    EXPECT_LE(all.total_rel_l2, 2 * chaos.total_rel_l2);
    EXPECT_GE(all.argmax_agree, int(0.6 * all.rows));
  }
  auto prompt = ids_of(ref, "decode.input_ids");
  auto g = gpu.greedy(prompt, 40), c = cpu.greedy(prompt, 40);
  int same = 0;
  for (int i = 0; i < 40; ++i) same += g[size_t(i)] == c[size_t(i)];
  std::printf("MODEL | %-36s | greedy 40 steps: %d/40 equal to the CPU\n", path, same);
  if (simt_only()) {
    EXPECT_EQ(g, c);
  }
}

}  // namespace
