// The tensor-core attention inside a model: a small V4 config at the real attention shape
// (tests/data/v4-h512: head dim 512, 16 heads, 3 layers SWA / CSA / HCA) on dummy weights, in
// fast numerics, CUDA against the CPU over a 140-token prefill (logits of every position) and
// 4 decode steps (the ring, the compressed rows and the indexer keys read back in bf16).
//
// Why the bounds are what they are. On random weights one rounding difference anywhere changes
// later FP8 activation roundings (a full e4m3 step each) and, now and then, an expert choice
// of the MoE router, so CPU and CUDA cannot be compared element by element, and a position
// whose routing flipped differs by O(1) (measured on the CPU when this test was written: moving
// every attention output by 2^-7 gives per-position logit distances of 0.03-0.09 with a few
// positions near 0.5, a median of 0.08 over the 144 rows with 3 layers, 0.03 with one). What can
// be bounded is how far perturbations of a known size carry, measured on the CPU in the same run,
// with the median over positions (robust to the few routing flips):
// - Exact GEMMs (linear, grouped_linear, moe_experts forced to the SIMT kernels, which are
//   bit-identical to the reference; the indexer's tensor cores are exact too): the only
//   inexact op left is the attention, whose outputs test_attention.cpp bounds per element, the
//   dominant term being the BF16 rounding of P (an error of RMS <= 2^-8 / sqrt(3) of the output
//   scale, random in sign). The CPU model with every attention output moved by 2^-7 relative
//   in a random direction (PerturbedAttention: about one bf16 ulp, 3.4x that RMS, on every
//   element) gives the median per-position distance M_attn; CUDA's must be <= 2 M_attn (the
//   flips a perturbation causes grow with its size, so the smaller actual error moves the logits
//   less; the factor 2 covers the variance of which activations flip).
//   The same run is also checked against itself: every op on this path is computed per row
//   with a fixed order (the SIMT GEMMs sum in double over k ascending, the attention of a token
//   depends only on its own candidate rows, the same bf16 values whether they come from this
//   step or from the ring and the paged cache), so the logits of the prefill + decode steps must
//   equal those of one 144-token prefill bit for bit: the decode path's ring, compressed rows,
//   compressor state and indexer keys, all bf16 / f32 state written by earlier steps, are
//   exact.
// - The default fast plan adds the cuBLASLt FP8 projections (rel 2.4e-4 per output element),
//   the BF16 GEMMs and the tensor-core MoE (f32 accumulation): perturbations no larger than
//   rounding every activation to bf16, which is what separates the CPU's fast and official
//   numerics (each activation moved by up to 2^-8 relative at every op; median 0.094 when this
//   test was written): CUDA's median must be <= 2 M_chaos, that distance's median.
// Both runs must also produce finite logits everywhere, and the plan must run the tensor-core
// attention (mma_bf16) at every attention site.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>

#include "backend/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "model/model.h"
#include "model/single_sequence.h"
#include "../model/fixture_util.h"

using namespace dil;
using namespace dil::test;

namespace {

std::string config_dir() { return std::string(DIL_SOURCE_DIR) + "/tests/data/v4-h512"; }

// The CPU reference with every attention output (bf16) moved by 2^-7 relative, in a seeded
// random direction per element, then rounded to bf16 again.
class PerturbedAttention : public CpuBackend {
 public:
  void sparse_attention(const AttnArgs& a, const StepMeta& m) override {
    CpuBackend::sparse_attention(a, m);
    DIL_CHECK(a.out.dtype == DType::BF16, "PerturbedAttention: fast numerics (bf16 outputs) only");
    uint16_t* o = a.out.ptr<uint16_t>();
    for (int64_t i = 0; i < a.out.numel(); ++i) {
      const float r = (rng_() & 1) ? 0x1p-7f : -0x1p-7f;
      o[i] = f32_to_bf16(bf16_to_f32(o[i]) * (1.0f + r));
    }
  }

 private:
  std::mt19937 rng_{20261201};
};

constexpr int kPrompt = 140, kDecode = 4;

std::vector<int32_t> token_ids() {
  std::mt19937 rng(512);
  std::uniform_int_distribution<int> u(2, 1023);
  std::vector<int32_t> ids(kPrompt + kDecode);
  for (auto& t : ids) t = u(rng);
  return ids;
}

// Logits of every prompt position, then of each decode token fed alone: [kPrompt + kDecode, V]
// (one_chunk: all kPrompt + kDecode tokens as one prefill instead).
std::vector<float> run(Backend& be, Numerics n, std::string* attention_impls = nullptr, bool one_chunk = false) {
  ModelOptions o;
  o.numerics = n;
  o.load_format = "dummy";
  o.seed = 7;
  std::unique_ptr<Model> model = load_model(config_dir(), be, o);
  if (attention_impls) {
    for (const PlanEntry& e : be.plan()->entries())
      if (e.site.op == "sparse_attention")
        for (const KernelImpl* k : e.impls) *attention_impls += (attention_impls->empty() ? "" : ",") + k->name;
  }
  const std::vector<int32_t> ids = token_ids();
  SingleSequence seq(*model, kPrompt + kDecode);
  if (one_chunk) return seq.feed(ids, true);
  std::vector<float> lg = seq.feed(std::vector<int32_t>(ids.begin(), ids.begin() + kPrompt), true);
  for (int i = kPrompt; i < kPrompt + kDecode; ++i) {
    std::vector<float> r = seq.feed({ids[size_t(i)]}, false);
    lg.insert(lg.end(), r.begin(), r.end());
  }
  return lg;
}

// The median over positions of the per-position relative L2 distance of two [rows, V] logits.
double median_row_rel(const std::vector<float>& got, const std::vector<float>& want, int64_t V) {
  std::vector<double> r;
  for (size_t row = 0; row * size_t(V) < want.size(); ++row) {
    double num = 0, den = 0;
    for (int64_t v = 0; v < V; ++v) {
      const double a = got[row * size_t(V) + size_t(v)], b = want[row * size_t(V) + size_t(v)];
      num += (a - b) * (a - b);
      den += b * b;
    }
    r.push_back(std::sqrt(num / den));
  }
  std::sort(r.begin(), r.end());
  return r.empty() ? 0.0 : r[r.size() / 2];
}

void report(const char* what, const Diff& d) {
  std::printf("MODEL | %-36s | rows %4d | max|d| %.3e | worst rel L2 %.3e | total rel L2 %.3e | argmax %d/%d\n", what,
              d.rows, d.max_abs, d.max_rel_l2, d.total_rel_l2, d.argmax_agree, d.rows);
  std::fflush(stdout);
}

bool all_finite(const std::vector<float>& v) {
  for (float f : v)
    if (!std::isfinite(f)) return false;
  return true;
}

TEST(V4Head512Cuda, FastTensorCoreAttentionInTheModel) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const int64_t V = 1024;
  // The CPU side: the reference, its attention-perturbed twin, and official numerics.
  std::vector<float> ref, pert, official;
  {
    auto be = make_backend(BackendKind::CPU);
    ref = run(*be, Numerics::Fast);
    official = run(*be, Numerics::Official);
  }
  {
    PerturbedAttention be;
    pert = run(be, Numerics::Fast);
  }
  ASSERT_TRUE(all_finite(ref));
  const double m_attn = median_row_rel(pert, ref, V), m_chaos = median_row_rel(official, ref, V);
  report("h512 cpu attention-perturbed vs cpu", compare_logits(pert, ref, V));
  report("h512 cpu official vs cpu fast", compare_logits(official, ref, V));
  std::printf("MODEL | %-36s | median per-position rel L2: attention perturbed %.3e, official %.3e\n",
              "h512 cpu calibration", m_attn, m_chaos);
  ASSERT_GT(m_attn, 0.0) << "the perturbation changed nothing";

  // CUDA with exact GEMMs: only the attention is inexact.
  BackendOptions exact;
  parse_kernel_overrides("linear=simt,grouped_linear=simt,moe_experts=simt", &exact);
  std::string impls;
  std::vector<float> got_exact, got_exact_full;
  {
    auto be = make_backend(BackendKind::CUDA, 0, exact);
    got_exact = run(*be, Numerics::Fast, &impls);
    got_exact_full = run(*be, Numerics::Fast, nullptr, true);
  }
  EXPECT_EQ(impls, "mma_bf16,mma_bf16,mma_bf16") << "attention implementations of the three layer kinds";
  EXPECT_TRUE(all_finite(got_exact));
  const Diff self = compare_logits(got_exact, got_exact_full, V);
  report("h512 gpu simt gemms: steps vs one prefill", self);
  EXPECT_EQ(self.max_abs, 0.0) << "prefill + decode steps differ from one prefill on the GPU";
  const double m_exact = median_row_rel(got_exact, ref, V);
  report("h512 fast gpu (simt gemms) vs cpu", compare_logits(got_exact, ref, V));
  std::printf("MODEL | %-36s | median per-position rel L2 %.3e (bound %.3e)\n", "h512 fast gpu (simt gemms)", m_exact,
              2 * m_attn);
  EXPECT_LE(m_exact, 2 * m_attn);

  // CUDA with the default fast plan.
  std::vector<float> got;
  {
    auto be = make_backend(BackendKind::CUDA, 0);
    got = run(*be, Numerics::Fast);
  }
  EXPECT_TRUE(all_finite(got));
  const double m_default = median_row_rel(got, ref, V);
  report("h512 fast gpu (default plan) vs cpu", compare_logits(got, ref, V));
  std::printf("MODEL | %-36s | median per-position rel L2 %.3e (bound %.3e)\n", "h512 fast gpu (default plan)", m_default,
              2 * m_chaos);
  EXPECT_LE(m_default, 2 * m_chaos);
}

}  // namespace
