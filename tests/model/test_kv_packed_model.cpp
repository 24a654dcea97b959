// Fast numerics store the KV caches in the official packed formats (model/kv_layout.h
// kv_format). Every packed value is one the model's QDQ (FP8 / FP4 points) or bf16 activation
// already produced, and re-quantizing a QDQ'd row gives back its values (tests/kernels
// KvPacked.*), so the packed cache must give the plain (bf16) cache's logits bit for bit, in
// one prefill, in chunks and in single-token decode steps; and its bytes per block must be the
// official layout's (kv-report).
#include <gtest/gtest.h>

#include "fixture_util.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/kv_layout.h"
#include "model/single_sequence.h"

using namespace dil;
using namespace dil::test;

namespace {

const std::string kRoot = DIL_SOURCE_DIR;

std::unique_ptr<Model> fast_model(Backend& be, const std::string& dir, bool plain_kv) {
  ModelOptions o;
  o.numerics = Numerics::Fast;
  o.plain_kv = plain_kv;
  return load_model(dir, be, o);
}

void expect_packed_equals_plain(const std::string& dir) {
  auto be = make_backend(BackendKind::CPU);
  auto packed = fast_model(*be, dir, false), plain = fast_model(*be, dir, true);
  SafeTensors ref = SafeTensors::open(dir + "/reference-official.safetensors");
  std::vector<int32_t> ids = ids_of(ref, "seq2.input_ids");
  ids.resize(160);  // past the window (128), several compressed rows of every ratio, one of 128
  const int64_t V = packed->config().vocab_size;
  for (const std::vector<int>& chunks : {std::vector<int>{160}, std::vector<int>{50, 47, 63}, single_steps(124, 160)}) {
    const std::vector<float> a = run_chunks(*packed, ids, chunks), b = run_chunks(*plain, ids, chunks);
    Diff d = compare_logits(a, b, V);
    expect_within(d, 0, 0, dir + " packed vs plain cache, " + std::to_string(chunks.size()) + " chunks");
    ASSERT_EQ(a.size(), b.size());
    size_t differ = 0;
    for (size_t i = 0; i < a.size(); ++i) differ += f32_to_bits(a[i]) != f32_to_bits(b[i]);
    EXPECT_EQ(differ, 0u) << "logits that differ in any bit";
  }
}

}  // namespace

TEST(KvPackedModel, V4FastLogitsOnPackedCacheEqualPlainCache) { expect_packed_equals_plain(kRoot + "/tests/data/v4-tiny"); }
TEST(KvPackedModel, V41FastLogitsOnPackedCacheEqualPlainCache) { expect_packed_equals_plain(kRoot + "/tests/data/v41-tiny"); }

// The model's own cache (cache_spec, and the buffers allocate_cache makes: counted by a backend
// that records every allocation) holds exactly the official bytes per block in fast numerics,
// and plain rows of the activation dtype in the other modes; its window rings are the official
// rows. Compressor state stays f32 (both layouts count it as the model keeps it, except V4.1's
// official figure of m - 1 pending tokens where the model keeps a ring of m).
class CountingCpu : public CpuBackend {
 public:
  Buffer alloc(size_t bytes) override {
    allocated += bytes;
    return CpuBackend::alloc(bytes);
  }
  size_t allocated = 0;
};

void expect_official_blocks(const std::string& dir) {
  CountingCpu be;
  ModelOptions o;
  o.numerics = Numerics::Fast;
  auto model = load_model(dir, be, o);
  const ModelConfig& c = model->config();
  for (int bt : {128, 256}) {
    const KvLayout off = kv_layout(c, bt, KvFormat::Official);
    const CacheSpec cs = model->cache_spec(bt);
    EXPECT_EQ(cs.bytes_per_block, off.spec.bytes_per_block) << dir << " block " << bt;
    // Allocator's view: blocks and slots as allocate_cache lays them out.
    auto bytes = [&](int blocks, int slots) {
      const size_t before = be.allocated;
      model->allocate_cache(blocks, slots, bt);
      return be.allocated - before;
    };
    const size_t b1 = bytes(1, 1), b3 = bytes(3, 1), s2 = bytes(1, 2);
    EXPECT_EQ((b3 - b1) / 2, off.spec.bytes_per_block) << dir << " allocated bytes per block at " << bt;
    EXPECT_EQ((b3 - b1) / 2, cs.bytes_per_block);
    EXPECT_EQ(s2 - b1, cs.bytes_per_slot - (c.arch == Arch::V41 ? size_t(std::max(c.engram_max_ngram - 1, 0)) * 4 : 0))
        << dir << " allocated bytes per slot (the Engram look-back is host state)";
    const KvLayout f32 = kv_layout(c, bt, KvFormat::F32);
    // Rings: the official rows (the F32 layout's rings hold d floats per row).
    EXPECT_EQ(cs.bytes_per_slot - off.swa_bytes_per_slot * size_t(c.n_layers) / size_t(off.swa_layers),
              f32.spec.bytes_per_slot - f32.swa_bytes_per_slot * size_t(c.n_layers) / size_t(f32.swa_layers))
        << dir << ": only the rings change in a slot";
  }
}

TEST(KvPackedModel, V4FastCacheHoldsTheOfficialBytesPerBlock) { expect_official_blocks(kRoot + "/tests/data/v4-tiny"); }
TEST(KvPackedModel, V41FastCacheHoldsTheOfficialBytesPerBlock) { expect_official_blocks(kRoot + "/tests/data/v41-tiny"); }

// Official numerics keep f32 rows (kv_format: the oracle keeps what an f32 run computes).
TEST(KvPackedModel, OtherModesKeepPlainRows) {
  auto be = make_backend(BackendKind::CPU);
  for (Numerics n : {Numerics::Reference, Numerics::Official}) {
    ModelOptions o;
    o.numerics = n;
    auto model = load_model(kRoot + "/tests/data/v4-tiny", *be, o);
    EXPECT_EQ(model->cache_spec(128).bytes_per_block, kv_layout(model->config(), 128, KvFormat::F32).spec.bytes_per_block)
        << numerics_name(n);
  }
}
