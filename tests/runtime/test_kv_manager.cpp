// KvManager: unit cases and a 100,000-operation property test against a shadow model.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "runtime/kv_manager.h"

namespace dil::runtime {
namespace {

TEST(KvManager, AllocatesPerBlockAndAccountsBytes) {
  KvManager kv(10, 3, 128, 1000, 77);
  EXPECT_EQ(kv.total_bytes(), 10u * 1000 + 3u * 77);
  ASSERT_TRUE(kv.add(1));
  EXPECT_EQ(kv.used_bytes(), 77u);
  EXPECT_EQ(kv.blocks_needed(1, 1), 1);
  EXPECT_EQ(kv.blocks_needed(1, 128), 1);
  EXPECT_EQ(kv.blocks_needed(1, 129), 2);
  ASSERT_TRUE(kv.reserve(1, 300));
  EXPECT_EQ(kv.blocks(1).size(), 3u);
  EXPECT_EQ(kv.used_bytes(), 3u * 1000 + 77);
  EXPECT_FALSE(kv.reserve(1, 128 * 11));  // all or nothing
  EXPECT_EQ(kv.free_blocks(), 7);
  EXPECT_EQ(kv.reserved_tokens(1), 300);
  kv.free(1);
  EXPECT_EQ(kv.free_blocks(), 10);
  EXPECT_EQ(kv.free_slots(), 3);
  EXPECT_EQ(kv.used_bytes(), 0u);
  kv.check_invariants();
}

TEST(KvManager, SlotsRunOut) {
  KvManager kv(4, 2, 128, 1, 1);
  EXPECT_TRUE(kv.add(1));
  EXPECT_TRUE(kv.add(2));
  EXPECT_FALSE(kv.add(3));
  EXPECT_NE(kv.slot(1), kv.slot(2));
  kv.free(1);
  EXPECT_TRUE(kv.add(3));
  kv.check_invariants();
}

TEST(KvManager, ForkSharesBlocksAndCopiesOnWrite) {
  KvManager kv(8, 4, 128, 1, 1);
  ASSERT_TRUE(kv.add(1));
  ASSERT_TRUE(kv.reserve(1, 200));  // block 0 full, block 1 partial
  std::vector<CopyOp> ops;
  ASSERT_TRUE(kv.fork(1, 2, &ops));
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0].kind, CopyOp::Kind::Slot);
  EXPECT_EQ(ops[0].src, kv.slot(1));
  EXPECT_EQ(ops[0].dst, kv.slot(2));
  EXPECT_EQ(kv.blocks(1), kv.blocks(2));
  EXPECT_EQ(kv.refcount(kv.blocks(1)[0]), 2);
  EXPECT_EQ(kv.free_blocks(), 6);
  // The child writes position 200: its shared partial block is copied first.
  ops.clear();
  EXPECT_EQ(kv.blocks_needed(2, 201), 1);
  ASSERT_TRUE(kv.reserve(2, 201, &ops));
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0].kind, CopyOp::Kind::Block);
  EXPECT_EQ(ops[0].src, kv.blocks(1)[1]);
  EXPECT_EQ(ops[0].dst, kv.blocks(2)[1]);
  EXPECT_EQ(kv.blocks(1)[0], kv.blocks(2)[0]);  // the full block stays shared
  EXPECT_EQ(kv.refcount(kv.blocks(1)[1]), 1);
  kv.check_invariants();
  kv.free(1);
  EXPECT_EQ(kv.refcount(kv.blocks(2)[0]), 1);
  kv.free(2);
  EXPECT_EQ(kv.free_blocks(), 8);
  kv.check_invariants();
}

TEST(KvManagerDeathTest, DoubleFreeAborts) {
  KvManager kv(4, 2, 128, 1, 1);
  ASSERT_TRUE(kv.add(1));
  kv.free(1);
  EXPECT_DEATH(kv.free(1), "free of unknown sequence");
}

// Random allocate / append / fork / free / preempt. After every operation: the manager's own
// invariants (refcounts recomputed from the tables, free lists exact and duplicate-free), and a
// shadow model: every sequence reads back, through its block table, exactly the tokens it
// wrote (a block freed or shared wrongly would be overwritten by another sequence), and the
// free counts equal the totals minus what the live sequences hold.
TEST(KvManager, PropertyRandomOperations) {
  constexpr int kBlocks = 24, kSlots = 12, kBt = 128, kOps = 100000;
  KvManager kv(kBlocks, kSlots, kBt, 3, 5);
  std::vector<int64_t> cells(size_t(kBlocks) * kBt, -1);  // [blocks, block_tokens] what was written
  std::map<int64_t, std::vector<int64_t>> shadow;          // seq -> values at positions 0..n-1
  std::map<int64_t, int64_t> preempted;                    // seq -> tokens it had
  std::mt19937_64 rng(42);
  int64_t next_id = 0, next_value = 0;
  int64_t n_cow = 0, n_fail = 0, n_fork = 0, n_preempt = 0;

  auto read = [&](int64_t s, int64_t p) { return cells[size_t(kv.blocks(s)[p / kBt]) * kBt + p % kBt]; };
  auto apply = [&](const std::vector<CopyOp>& ops) {
    for (const CopyOp& op : ops)
      if (op.kind == CopyOp::Kind::Block) {
        std::copy_n(cells.begin() + int64_t(op.src) * kBt, kBt, cells.begin() + int64_t(op.dst) * kBt);
        ++n_cow;
      }
  };
  // Grows `s` by `k` positions, writing fresh values; false if the pool is short.
  auto append = [&](int64_t s, int64_t k) {
    std::vector<CopyOp> ops;
    const int64_t n = int64_t(shadow[s].size());
    if (!kv.reserve(s, n + k, &ops)) return false;
    apply(ops);
    for (int64_t p = n; p < n + k; ++p) {
      cells[size_t(kv.blocks(s)[p / kBt]) * kBt + p % kBt] = next_value;
      shadow[s].push_back(next_value++);
    }
    return true;
  };
  auto pick = [&](const auto& m) {
    auto it = m.begin();
    std::advance(it, int64_t(rng() % m.size()));
    return it->first;
  };
  auto verify = [&](int64_t s) {
    const auto& v = shadow[s];
    ASSERT_EQ(kv.reserved_tokens(s), int64_t(v.size()));
    for (int64_t p = 0; p < int64_t(v.size()); ++p) ASSERT_EQ(read(s, p), v[p]) << "seq " << s << " pos " << p;
  };

  for (int op = 0; op < kOps; ++op) {
    const int kind = int(rng() % 100);
    int64_t touched = -1;
    if (kind < 20) {  // allocate
      const int64_t s = next_id++;
      if (kv.add(s)) {
        shadow[s];
        if (!append(s, 1 + int64_t(rng() % 300))) ++n_fail;
        touched = s;
      }
    } else if (kind < 55 && !shadow.empty()) {  // append (decode steps or a prefill chunk)
      const int64_t s = pick(shadow);
      if (!append(s, rng() % 2 ? 1 : 1 + int64_t(rng() % 200))) ++n_fail;
      touched = s;
    } else if (kind < 65 && !shadow.empty()) {  // fork
      const int64_t p = pick(shadow), c = next_id++;
      std::vector<CopyOp> ops;
      if (kv.fork(p, c, &ops)) {
        ASSERT_EQ(ops.size(), 1u);
        shadow[c] = shadow[p];
        touched = c;
        ++n_fork;
      }
    } else if (kind < 85 && !shadow.empty()) {  // free (finish or cancel)
      const int64_t s = pick(shadow);
      kv.free(s);
      shadow.erase(s);
    } else if (kind < 95 && !shadow.empty()) {  // preempt: drop everything, keep the length
      const int64_t s = pick(shadow);
      preempted[s] = int64_t(shadow[s].size());
      kv.free(s);
      shadow.erase(s);
      ++n_preempt;
    } else if (!preempted.empty()) {  // resume a preempted sequence: recompute from 0
      const int64_t s = pick(preempted);
      if (kv.add(s)) {
        shadow[s];
        if (!append(s, preempted[s])) ++n_fail;
        preempted.erase(s);
        touched = s;
      }
    }
    kv.check_invariants();
    // Accounting: slots = live sequences; blocks in use = distinct blocks of the tables.
    ASSERT_EQ(kv.total_slots() - kv.free_slots(), int(shadow.size()));
    std::vector<uint8_t> used(kBlocks, 0);
    int n_used = 0;
    for (auto& [s, v] : shadow)
      for (int32_t b : kv.blocks(s)) n_used += !used[b]++ ? 1 : 0;
    ASSERT_EQ(kv.total_blocks() - kv.free_blocks(), n_used);
    ASSERT_EQ(kv.used_bytes(), size_t(n_used) * 3 + shadow.size() * 5);
    if (touched >= 0 && shadow.count(touched)) verify(touched);
    if (op % 997 == 0)
      for (auto& [s, v] : shadow) verify(s);
    if (::testing::Test::HasFatalFailure()) return;
  }
  for (auto& [s, v] : shadow) verify(s);
  std::vector<int64_t> live;
  for (auto& [s, v] : shadow) live.push_back(s);
  for (int64_t s : live) kv.free(s);
  kv.check_invariants();
  EXPECT_EQ(kv.free_blocks(), kBlocks);
  EXPECT_EQ(kv.free_slots(), kSlots);
  // The random walk really exercised every path.
  EXPECT_GT(n_cow, 100);
  EXPECT_GT(n_fail, 100);
  EXPECT_GT(n_fork, 1000);
  EXPECT_GT(n_preempt, 1000);
  std::printf("[kv property] %d ops: %lld forks, %lld copy-on-writes, %lld preemptions, %lld pool-full refusals\n", kOps,
              (long long)n_fork, (long long)n_cow, (long long)n_preempt, (long long)n_fail);
}

}  // namespace
}  // namespace dil::runtime
