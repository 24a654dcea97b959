// Fast numerics on the GPU store the KV caches in the official packed formats (issue 28): the
// writers quantize each row once, the fast attention and indexer kernels dequantize on load
// into the BF16 / FP8 operands they used with bf16 rows. Every packed value is one the model's
// QDQ already produced (tests/cuda/test_kv_packed.cpp: the device codecs equal the host ones bit
// for bit), so a run on the packed cache must give the logits of the same run on a plain bf16
// cache (ModelOptions::plain_kv) bit for bit: same kernels (the plan does not depend on the
// storage), same operand values, same order. Checked on both tiny fixtures (fp64 attention,
// fast_simt indexer at their shapes) and on v4-h512 (the tensor-core attention at head dim
// 512), in one prefill, in chunks and in single-token decode steps.
#include <gtest/gtest.h>

#include <random>

#include "backend/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "model/kv_layout.h"
#include "../model/fixture_util.h"

using namespace dil;
using namespace dil::test;

namespace {

const std::string kRoot = DIL_SOURCE_DIR;

std::unique_ptr<Model> fast_model(Backend& be, const std::string& dir, bool plain_kv, bool dummy) {
  ModelOptions o;
  o.numerics = Numerics::Fast;
  o.plain_kv = plain_kv;
  if (dummy) {
    o.load_format = "dummy";
    o.seed = 7;
  }
  return load_model(dir, be, o);
}

void expect_packed_equals_plain(const std::string& dir, bool dummy, int n_tokens) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto be = make_backend(BackendKind::CUDA, 0);
  auto packed = fast_model(*be, dir, false, dummy), plain = fast_model(*be, dir, true, dummy);
  const ModelConfig& c = packed->config();
  ASSERT_TRUE(stored_kv_rows(c, Numerics::Fast, *be, false).swa.packed()) << "the CUDA backend stores packed rows";
  EXPECT_LT(packed->cache_spec(128).bytes_per_block, plain->cache_spec(128).bytes_per_block);
  EXPECT_EQ(packed->cache_spec(128).bytes_per_block, kv_layout(c, 128, KvFormat::Official).spec.bytes_per_block);
  std::mt19937 rng(28);
  std::uniform_int_distribution<int> u(2, int(c.vocab_size) - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n_tokens));
  for (auto& t : ids) t = u(rng);
  const int64_t V = c.vocab_size;
  const std::vector<std::vector<int>> runs = {{n_tokens}, {50, 47, n_tokens - 97}, single_steps(n_tokens - 36, n_tokens)};
  for (const std::vector<int>& chunks : runs) {
    const std::vector<float> a = run_chunks(*packed, ids, chunks), b = run_chunks(*plain, ids, chunks);
    ASSERT_EQ(a.size(), b.size());
    size_t differ = 0;
    for (size_t i = 0; i < a.size(); ++i) differ += f32_to_bits(a[i]) != f32_to_bits(b[i]);
    const Diff d = compare_logits(a, b, V);
    std::printf("MODEL | %-36s | %zu chunks | max|d| %.3e | %zu of %zu logits differ\n",
                (dir.substr(dir.rfind('/') + 1) + " packed vs bf16 kv").c_str(), chunks.size(), d.max_abs, differ,
                a.size());
    EXPECT_EQ(differ, 0u) << dir << ": logits on the packed cache differ from the bf16 cache, " << chunks.size()
                          << " chunks";
  }
}

}  // namespace

TEST(KvPackedCuda, V4TinyPackedEqualsBf16Cache) { expect_packed_equals_plain(kRoot + "/tests/data/v4-tiny", false, 160); }
TEST(KvPackedCuda, V41TinyPackedEqualsBf16Cache) {
  expect_packed_equals_plain(kRoot + "/tests/data/v41-tiny", false, 160);
}
TEST(KvPackedCuda, V4Head512PackedEqualsBf16Cache) {
  expect_packed_equals_plain(kRoot + "/tests/data/v4-h512", true, 144);
}
