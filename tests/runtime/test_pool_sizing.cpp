// KV pool sizing (runtime/pool_sizing.cpp): explicit budgets, the automatic budget of a device
// whose allocator tracks its peak (a CPU backend that counts its allocations the way the CUDA
// arena does, over the real v4-tiny model), the host-memory rule, fewer slots when they do
// not fit, the start-up errors, and admission at the pool's capacity.
#include <gtest/gtest.h>

#include <memory>

#include "engine_harness.h"
#include "fake_model.h"
#include "kernels/cpu/cpu_backend.h"
#include "runtime/engine_internal.h"

namespace dil::testing {
namespace {

const std::string kV4Tiny = std::string(DIL_SOURCE_DIR) + "/tests/data/v4-tiny";

// A CPU backend reporting a device of `total` bytes of which its own allocations are in use
// (exact byte counts), with a peak like cuda::Arena's.
class CountingBackend : public CpuBackend {
 public:
  explicit CountingBackend(size_t total) : total_(total) {}
  Buffer alloc(size_t bytes) override {
    auto inner = std::make_shared<Buffer>(CpuBackend::alloc(bytes));
    in_use_ += bytes;
    peak_ = std::max(peak_, in_use_);
    return Buffer(inner->data(), bytes, Device::CPU, [this, inner, bytes](void*) mutable {
      in_use_ -= bytes;
      inner.reset();
    });
  }
  MemoryInfo memory_info() override {
    MemoryInfo m;
    m.total = total_;
    m.available = total_ - in_use_;
    m.in_use = in_use_;
    m.peak_in_use = peak_;
    m.tracks_peak = true;
    return m;
  }
  void reset_memory_peak() override { peak_ = in_use_; }
  size_t in_use() const { return in_use_; }

 private:
  size_t total_, in_use_ = 0, peak_ = 0;
};

EngineOptions tiny_options(int batched_tokens) {
  EngineOptions o;
  o.model_dir = kV4Tiny;
  o.numerics = "reference";
  o.max_num_seqs = 4;
  o.max_num_batched_tokens = batched_tokens;
  o.max_model_len = 512;
  o.block_tokens = 128;
  o.gpu_memory_utilization = 0.5;
  o.seed = 7;
  return o;
}

std::unique_ptr<Model> load_tiny(Backend& be) {
  ModelOptions mo;
  mo.numerics = Numerics::Reference;
  mo.load_mtp = false;
  return load_model(kV4Tiny, be, mo);
}

constexpr size_t kDevice = size_t(1) << 30;

TEST(PoolSizing, ProfiledBudgetIsUtilizationMinusInUseMinusStepScratch) {
  int64_t scratch_small = 0;
  for (int T : {32, 256}) {
    CountingBackend be(kDevice);
    auto model = load_tiny(be);
    const EngineOptions o = tiny_options(T);
    const CacheSpec spec = model->cache_spec(o.block_tokens);
    const runtime::KvBudget b = runtime::auto_kv_budget(o, spec, *model, &be);
    ASSERT_TRUE(b.automatic);
    // The profiling cache (one sequence of max_model_len) is dropped again: only the minimal
    // cache of one block and one slot stays, which the engine's allocation replaces.
    const int64_t in_use = int64_t(be.in_use());
    EXPECT_EQ(b.bytes, int64_t(0.5 * double(kDevice)) - in_use - b.scratch_bytes) << b.how;
    EXPECT_GT(b.scratch_bytes, 0);
    EXPECT_NE(b.how.find(std::to_string(T) + " tokens at position " + std::to_string(512 - T)), std::string::npos)
        << b.how;
    if (T == 32) scratch_small = b.scratch_bytes;
    else EXPECT_GT(b.scratch_bytes, 4 * scratch_small) << "a step of 8x the tokens needs more scratch";
  }
}

TEST(PoolSizing, ProfiledEngineHoldsTheBudgetAndGeneratesAsAFixedPool) {
  CountingBackend be(kDevice);
  const EngineOptions o = tiny_options(64);
  auto model = load_tiny(be);
  const CacheSpec spec = model->cache_spec(o.block_tokens);
  auto e = runtime::make_engine_with_model(o, std::move(model), nullptr, nullptr, &be);
  const EngineInfo& i = e->info();
  EXPECT_EQ(i.kv_slots, 4);
  EXPECT_NE(i.kv_sizing.find("gpu-memory-utilization 0.5"), std::string::npos) << i.kv_sizing;
  // Blocks: what the budget leaves after the 4 + 16 slots.
  const int64_t slots_bytes = int64_t(4 + 16) * int64_t(spec.bytes_per_slot);
  EXPECT_GT(i.kv_blocks, 4);
  // The pool the engine allocated is within the budget: in use now = weights etc. + pool.
  EXPECT_LE(int64_t(be.in_use()), int64_t(0.5 * double(kDevice)));
  EXPECT_GE(i.kv_blocks * int64_t(spec.bytes_per_block) + slots_bytes,
            int64_t(0.5 * double(kDevice)) - int64_t(be.in_use()) - int64_t(spec.bytes_per_block) -
                int64_t(spec.bytes_per_slot) - (int64_t(1) << 25))
      << "the budget is mostly KV";
  // The profiling step leaves nothing behind: the same tokens as a fixed pool.
  GenRequest r;
  r.prompt = {0, 17, 400, 5, 9, 33};
  r.sampling.temperature = 0.0f;
  r.stop.max_tokens = 12;
  r.stop.ignore_eos = true;
  const Result got = drain(*e->submit(r));
  EngineOptions fixed = o;
  fixed.kv_blocks = 8;
  auto ref = runtime::make_engine_with_model(fixed, load_tiny(be), nullptr);
  EXPECT_EQ(got, drain(*ref->submit(r)));
  EXPECT_EQ(got.tokens.size(), 12u);
}

TEST(PoolSizing, HostMemoryRuleIsCappedByTheLimits) {
  // The fake model has no backend: the host's memory, capped by what max_num_seqs sequences of
  // max_model_len and every slot use (a few MB here, far below any machine's MemAvailable).
  EngineOptions o;
  o.max_num_seqs = 8;
  o.max_model_len = 1024;
  o.max_num_batched_tokens = 256;
  auto st = std::make_shared<FakeModelStats>();
  auto e = runtime::make_engine_with_model(o, std::make_unique<FakeModel>(64, st));
  EXPECT_EQ(e->info().kv_blocks, 8 * 8 + 1);
  EXPECT_EQ(e->info().kv_slots, 8);
  const CacheSpec spec = FakeModel(64, st).cache_spec(128);
  EXPECT_EQ(runtime::pool_bytes_at_limits(o, spec), (8 + 16) * 1000 + 65 * 128 * 4);
}

TEST(PoolSizing, ExplicitAndAutomaticBudgets) {
  const CacheSpec spec{128, 1000, 10000};
  EngineOptions o;
  o.max_num_seqs = 256;
  o.max_model_len = 1024;  // 8 blocks
  o.prefix_cache_slots = 16;
  // kv_memory_bytes: blocks after every slot.
  o.kv_memory_bytes = 272 * 10000 + 50 * 1000 + 999;
  runtime::PoolPlan p = runtime::plan_pool(o, spec);
  EXPECT_EQ(p.n_slots, 256);
  EXPECT_EQ(p.n_extra_slots, 16);
  EXPECT_EQ(p.n_blocks, 50);
  // An explicit budget that cannot hold the slots is an error, not fewer slots.
  o.kv_memory_bytes = 100 * 10000;
  EXPECT_THROW(runtime::plan_pool(o, spec), Error);
  // Automatic: fewer sequence slots, so that one sequence of max_model_len still fits.
  o.kv_memory_bytes = 0;
  runtime::KvBudget b{9 * 1000 + (16 + 100) * 10000 + 500, true, "test", 0};
  p = runtime::plan_pool(o, spec, b);
  EXPECT_EQ(p.n_slots, 100);
  EXPECT_EQ(p.n_blocks, 9);  // 8 for max_model_len + the copy-on-write block
  EXPECT_NE(p.sizing.find("100 state slots fit, not max_num_seqs 256"), std::string::npos) << p.sizing;
  // ... but an explicit kv_slots is kept (and fails when it cannot be held).
  o.kv_slots = 200;
  EXPECT_THROW(runtime::plan_pool(o, spec, b), Error);
  o.kv_slots = 0;
  // Not even one sequence: the error names max_model_len.
  b.bytes = 9 * 1000 + 16 * 10000 + 500;
  try {
    runtime::plan_pool(o, spec, b);
    FAIL() << "expected an error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("cannot hold one sequence of max_model_len 1024"), std::string::npos)
        << err.what();
  }
}

TEST(PoolSizing, RequestsOfTheWholePoolWaitAndComplete) {
  // The smallest pool the engine starts with: one sequence of max_model_len plus the block of
  // a copy-on-write (with 4 blocks, a 400-token prompt's partial last block is shared with its
  // own prefix-cache entry and the first decode token could never copy it: the engine aborted
  // with "waiting requests but nothing schedulable"). Requests that need all of it run one
  // after another.
  EngineOptions o;
  o.max_num_seqs = 4;
  o.max_num_batched_tokens = 256;
  o.max_model_len = 512;
  o.kv_blocks = 4;
  auto st = std::make_shared<FakeModelStats>();
  EXPECT_THROW(runtime::make_engine_with_model(o, std::make_unique<FakeModel>(64, st)), Error);
  o.kv_blocks = 5;
  auto e = runtime::make_engine_with_model(o, std::make_unique<FakeModel>(64, st));
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int k = 0; k < 3; ++k) {
    GenRequest r;
    r.prompt.assign(400, int32_t(k + 1));
    r.stop.max_tokens = 112;
    r.stop.ignore_eos = true;
    streams.push_back(e->submit(r));
  }
  for (auto& s : streams) {
    const Result x = drain(*s);
    EXPECT_EQ(x.finish, FinishReason::Length) << x.error;
    EXPECT_EQ(x.tokens.size(), 112u);
  }
  // One more token than max_model_len can never fit: an error naming the context length.
  GenRequest big;
  big.prompt.assign(400, 1);
  big.stop.max_tokens = 113;
  const Result x = drain(*e->submit(big));
  EXPECT_EQ(x.finish, FinishReason::Error);
  EXPECT_NE(x.error.find("maximum context length 512"), std::string::npos) << x.error;
}

}  // namespace
}  // namespace dil::testing
