// PrefixCache over KvManager: unit cases and a random-operation property test against a shadow
// of the cache's contents. The shadow writes each position's token id into the block cell that
// holds it and keeps, per slot, the token ids the state stands for; copies run on the shadow as
// the model would run them. So a hit whose blocks or snapshot hold anything but the query's own
// prefix, a shared block written in place, or an eviction of something in use is caught.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "runtime/prefix_cache.h"

namespace dil::runtime {
namespace {

constexpr int kBt = 4;  // tiny blocks: many block boundaries in short token lists

struct Shadow {
  KvManager kv;
  PrefixCache cache;
  std::vector<int32_t> cells;                 // [blocks, kBt] token id written there
  std::vector<std::vector<int32_t>> state;    // [slots] token ids the slot's state stands for
  struct Seq {
    std::vector<int32_t> tokens;
    int64_t computed = 0;
  };
  std::map<int64_t, Seq> seqs;
  int64_t next_id = 0;

  Shadow(int blocks, int seq_slots, int extra_slots)
      : kv(blocks, seq_slots, kBt, 1, 1, extra_slots), cache(kv, "test"), cells(size_t(blocks) * kBt, -1),
        state(size_t(seq_slots + extra_slots)) {
    kv.set_reclaimer(&cache);
  }
  void apply(const std::vector<CopyOp>& ops) {
    for (const CopyOp& op : ops) {
      if (op.kind == CopyOp::Kind::Block)
        std::copy_n(cells.begin() + int64_t(op.src) * kBt, kBt, cells.begin() + int64_t(op.dst) * kBt);
      else
        state[size_t(op.dst)] = state[size_t(op.src)];
    }
  }
  int32_t cell(int64_t id, int64_t p) const { return cells[size_t(kv.blocks(id)[size_t(p / kBt)]) * kBt + p % kBt]; }
  // A new sequence: a slot, the longest hit (checked against the shadow), its restore.
  int64_t admit(std::vector<int32_t> tokens, PrefixMatch* got = nullptr) {
    const int64_t id = next_id++;
    if (!kv.add(id)) return -1;
    PrefixMatch m = cache.lookup(tokens, int64_t(tokens.size()) - 1);
    EXPECT_LE(m.tokens, int64_t(tokens.size()) - 1);
    EXPECT_GE(m.shared, m.tokens);
    if (m.tokens > 0) {
      const std::vector<int32_t> prefix(tokens.begin(), tokens.begin() + m.tokens);
      EXPECT_EQ(state[size_t(m.snapshot)], prefix) << "snapshot of another prefix";
      EXPECT_EQ(int64_t(m.blocks.size()), (m.tokens + kBt - 1) / kBt);
      for (int64_t p = 0; p < m.tokens; ++p)
        EXPECT_EQ(cells[size_t(m.blocks[size_t(p / kBt)]) * kBt + p % kBt], tokens[size_t(p)]) << "position " << p;
      kv.adopt(id, m.blocks, m.tokens);
      apply({{CopyOp::Kind::Slot, m.snapshot, kv.slot(id)}});
    } else {
      state[size_t(kv.slot(id))].clear();  // a fresh start resets the slot
    }
    seqs[id] = {std::move(tokens), m.tokens};
    if (got) *got = m;
    return id;
  }
  // Computes k more positions; false when the pool is short.
  bool advance(int64_t id, int64_t k) {
    Seq& s = seqs.at(id);
    k = std::min<int64_t>(k, int64_t(s.tokens.size()) - s.computed);
    std::vector<CopyOp> cow;
    if (!kv.reserve(id, s.computed + k, &cow)) return false;
    apply(cow);
    std::vector<int32_t>& st = state[size_t(kv.slot(id))];
    for (int64_t p = s.computed; p < s.computed + k; ++p) {
      cells[size_t(kv.blocks(id)[size_t(p / kBt)]) * kBt + p % kBt] = s.tokens[size_t(p)];
      st.push_back(s.tokens[size_t(p)]);
    }
    s.computed += k;
    return true;
  }
  bool record(int64_t id, bool shared = false) {
    std::vector<CopyOp> copies;
    const Seq& s = seqs.at(id);
    const bool ok = cache.insert(id, s.tokens, s.computed, shared, &copies);
    apply(copies);
    return ok;
  }
  // n > 1: a copy of `id` sharing its blocks, its slot copied.
  int64_t fork(int64_t id) {
    const int64_t c = next_id++;
    std::vector<CopyOp> ops;
    if (!kv.fork(id, c, &ops)) return -1;
    apply(ops);
    seqs[c] = seqs.at(id);
    return c;
  }
  void free(int64_t id) {
    kv.free(id);
    seqs.erase(id);
  }
  void verify() {
    // Whoever reads a cached block reads its parent's: the cache's reclaim reachability.
    for (const auto& [id, s] : seqs) {
      const auto& bl = kv.blocks(id);
      for (size_t i = 1; i < bl.size(); ++i)
        ASSERT_TRUE(!kv.cached(bl[i]) || kv.cached(bl[i - 1])) << "seq " << id << " block " << i;
    }
    kv.check_invariants();
    cache.check_invariants();
    for (const auto& [id, s] : seqs) {
      ASSERT_EQ(state[size_t(kv.slot(id))], std::vector<int32_t>(s.tokens.begin(), s.tokens.begin() + s.computed));
      for (int64_t p = 0; p < s.computed; ++p) ASSERT_EQ(cell(id, p), s.tokens[size_t(p)]) << "seq " << id << " pos " << p;
    }
  }
};

std::vector<int32_t> seq_of(std::initializer_list<int32_t> head, int n, int32_t start) {
  std::vector<int32_t> v(head);
  for (int i = 0; i < n; ++i) v.push_back(start + i);
  return v;
}

TEST(PrefixCache, HitOnAPromptEndSharesItsBlocksAndCopiesTheTailOnWrite) {
  Shadow sh(16, 4, 4);
  const auto a = seq_of({}, 10, 100);  // blocks [100..103] [104..107] [108 109 . .]
  const int64_t ia = sh.admit(a);
  ASSERT_TRUE(sh.advance(ia, 10));
  ASSERT_TRUE(sh.record(ia));
  EXPECT_EQ(sh.kv.cached_blocks(), 3);
  EXPECT_EQ(sh.kv.snapshot_slots(), 1);
  sh.verify();
  // b extends a's prompt: a hit at 10, inside block 2 (shared until b writes into it).
  auto b = a;
  b.insert(b.end(), {7, 8, 9, 10});
  PrefixMatch m;
  const int64_t ib = sh.admit(b, &m);
  EXPECT_EQ(m.tokens, 10);
  EXPECT_EQ(m.blocks, sh.kv.blocks(ia));
  EXPECT_EQ(sh.kv.refcount(m.blocks[2]), 3);  // a, b and the cache
  std::vector<CopyOp> cow;
  ASSERT_TRUE(sh.kv.reserve(ib, 11, &cow));
  ASSERT_EQ(cow.size(), 1u);
  EXPECT_EQ(cow[0].src, m.blocks[2]);
  sh.apply(cow);
  ASSERT_TRUE(sh.advance(ib, 4));
  EXPECT_EQ(sh.kv.blocks(ib)[0], sh.kv.blocks(ia)[0]);  // full blocks stay shared
  EXPECT_NE(sh.kv.blocks(ib)[2], sh.kv.blocks(ia)[2]);
  sh.verify();
  // a keeps writing its block 2 too: copy-on-write as well (the cache keeps the original).
  sh.seqs.at(ia).tokens.push_back(55);
  ASSERT_TRUE(sh.advance(ia, 1));
  sh.verify();
  // A third request with a's prompt: the same tail, found again.
  const int64_t ic = sh.admit(seq_of({}, 12, 100), &m);
  EXPECT_EQ(m.tokens, 10);
  ASSERT_TRUE(sh.advance(ic, 2));
  sh.verify();
}

TEST(PrefixCache, AHitLeavesTheLastTokenToCompute) {
  Shadow sh(16, 4, 4);
  const auto a = seq_of({}, 8, 1);  // two full blocks, snapshot at 8
  const int64_t ia = sh.admit(a);
  ASSERT_TRUE(sh.advance(ia, 8));
  ASSERT_TRUE(sh.record(ia));
  PrefixMatch m;
  sh.admit(a, &m);  // the same prompt: its logits need position 7 computed
  EXPECT_EQ(m.tokens, 0);
  EXPECT_EQ(m.shared, 8);
  sh.admit(seq_of({}, 9, 1), &m);
  EXPECT_EQ(m.tokens, 8);
  EXPECT_EQ(m.blocks.size(), 2u);
  sh.verify();
}

TEST(PrefixCache, DivergingPromptsShareTheCommonFullBlocksOnly) {
  Shadow sh(32, 4, 8);
  const auto a = seq_of({1, 2, 3, 4, 5, 6}, 6, 100);  // diverges from b at position 6
  const auto b = seq_of({1, 2, 3, 4, 5, 6}, 6, 200);
  const int64_t ia = sh.admit(a);
  ASSERT_TRUE(sh.advance(ia, 12));
  ASSERT_TRUE(sh.record(ia));
  PrefixMatch m;
  const int64_t ib = sh.admit(b, &m);
  EXPECT_EQ(m.tokens, 0);  // a's only snapshot is at 12
  EXPECT_EQ(m.shared, 6);  // but the cache holds b's first 6 tokens
  // b computes its own copy of the common prefix, records at 6, then at its end.
  ASSERT_TRUE(sh.advance(ib, 6));
  const int32_t own0 = sh.kv.blocks(ib)[0];
  ASSERT_TRUE(sh.record(ib));
  EXPECT_EQ(sh.kv.blocks(ib)[0], sh.kv.blocks(ia)[0]);  // its copy of block 0 gave way to the cached one
  EXPECT_EQ(sh.kv.refcount(own0), 0);
  ASSERT_TRUE(sh.advance(ib, 6));
  ASSERT_TRUE(sh.record(ib));
  sh.verify();
  // A third prompt with the same 6 tokens hits b's snapshot at 6.
  const int64_t ic = sh.admit(seq_of({1, 2, 3, 4, 5, 6}, 3, 300), &m);
  EXPECT_EQ(m.tokens, 6);
  ASSERT_TRUE(sh.advance(ic, 3));
  sh.verify();
}

TEST(PrefixCache, BlocksComeBackLeastRecentlyUsedFirstAndOnlyWhenUnread) {
  Shadow sh(6, 4, 4);
  // Two cached prompts of 2 blocks each, then a's is used again.
  const int64_t ia = sh.admit(seq_of({}, 8, 10));
  ASSERT_TRUE(sh.advance(ia, 8));
  ASSERT_TRUE(sh.record(ia));
  sh.free(ia);
  const int64_t ib = sh.admit(seq_of({}, 8, 50));
  ASSERT_TRUE(sh.advance(ib, 8));
  ASSERT_TRUE(sh.record(ib));
  sh.free(ib);
  EXPECT_EQ(sh.kv.used_blocks(), 0);
  EXPECT_EQ(sh.kv.reclaimable_blocks(), 4);
  PrefixMatch m;
  const int64_t ia2 = sh.admit(seq_of({}, 9, 10), &m);
  EXPECT_EQ(m.tokens, 8);
  ASSERT_TRUE(sh.advance(ia2, 1));  // 3 blocks: one free block left of 6, b's 2 reclaimable
  EXPECT_EQ(sh.kv.available_blocks(), 3);
  // A cold 12-token sequence needs 3: the free one and b's two (least recently used, unread).
  const int64_t ic = sh.admit(seq_of({}, 12, 90));
  ASSERT_TRUE(sh.advance(ic, 12));
  EXPECT_GE(sh.cache.evictions(), 2);
  sh.admit(seq_of({}, 9, 50), &m);
  EXPECT_EQ(m.tokens, 0);  // b is gone
  EXPECT_FALSE(sh.advance(sh.next_id - 1, 9));  // and the pool is really full: a's blocks are read by ia2
  sh.verify();
  sh.free(ia2);
  EXPECT_TRUE(sh.advance(sh.next_id - 1, 9));  // a's cached blocks are given back now
  sh.verify();
}

TEST(PrefixCache, SnapshotsGiveWayToSequencesAndTailsGoWithThem) {
  Shadow sh(32, 2, 1);  // 3 slots: two for sequences, one more for snapshots
  const int64_t ia = sh.admit(seq_of({}, 6, 10));  // ends inside block 1: a tail entry
  ASSERT_TRUE(sh.advance(ia, 6));
  ASSERT_TRUE(sh.record(ia));
  sh.free(ia);
  const int64_t ib = sh.admit(seq_of({}, 8, 40));  // ends on a block boundary
  ASSERT_TRUE(sh.advance(ib, 8));
  ASSERT_TRUE(sh.record(ib));
  sh.free(ib);
  EXPECT_EQ(sh.kv.snapshot_slots(), 2);
  EXPECT_EQ(sh.kv.cached_blocks(), 4);
  // Two running sequences take every slot they may: the older snapshot (a's tail) goes, with
  // its partial block; b's full blocks stay (one snapshot still fits).
  const int64_t i1 = sh.admit(seq_of({}, 3, 70));
  const int64_t i2 = sh.admit(seq_of({}, 3, 80));
  ASSERT_GE(i1, 0);
  ASSERT_GE(i2, 0);
  EXPECT_EQ(sh.kv.snapshot_slots(), 1);
  EXPECT_EQ(sh.kv.cached_blocks(), 3);
  EXPECT_EQ(sh.admit(seq_of({}, 3, 90)), -1);  // the sequence limit
  sh.verify();
  PrefixMatch m;
  sh.free(i2);
  sh.admit(seq_of({}, 9, 40), &m);
  EXPECT_EQ(m.tokens, 8);
  sh.verify();
}

// Random admit / compute / record / free over prompts that share prefixes of every length (a
// few "system prompts" plus random suffixes over a small alphabet), in a pool small enough for
// constant eviction. After every operation: both invariant checks and the shadow of every live
// sequence; every hit is checked against the shadow when it happens (Shadow::admit).
TEST(PrefixCache, PropertyRandomOperations) {
  constexpr int kOps = 60000;
  Shadow sh(12, 6, 3);
  std::mt19937_64 rng(7);
  std::vector<std::vector<int32_t>> heads;
  for (int h = 0; h < 4; ++h) {
    std::vector<int32_t> v;
    for (int i = 0, n = 2 + int(rng() % 14); i < n; ++i) v.push_back(int32_t(rng() % 5));
    heads.push_back(v);
  }
  int64_t hits = 0, tail_hits = 0, admits = 0, records = 0, refused = 0, forks = 0;
  auto pick = [&]() {
    auto it = sh.seqs.begin();
    std::advance(it, int64_t(rng() % sh.seqs.size()));
    return it->first;
  };
  for (int op = 0; op < kOps; ++op) {
    const int kind = int(rng() % 100);
    if (kind < 25) {
      std::vector<int32_t> t = heads[rng() % heads.size()];
      t.resize(rng() % (t.size() + 1));
      for (int i = 0, n = 1 + int(rng() % 12); i < n; ++i) t.push_back(int32_t(rng() % 3));
      PrefixMatch m;
      if (sh.admit(t, &m) >= 0) {
        ++admits;
        hits += m.tokens > 0;
        tail_hits += m.tokens % kBt != 0;
      }
    } else if (kind < 60 && !sh.seqs.empty()) {
      const int64_t id = pick();
      if (!sh.advance(id, 1 + int64_t(rng() % 6))) ++refused;
    } else if (kind < 80 && !sh.seqs.empty()) {
      const int64_t id = pick();
      if (sh.seqs.at(id).computed > 0) {
        sh.record(id, rng() % 4 == 0);
        ++records;
      }
    } else if (kind < 85 && !sh.seqs.empty()) {
      const int64_t c = sh.fork(pick());
      if (c >= 0) {
        ++forks;
        sh.seqs.at(c).tokens.push_back(int32_t(rng() % 3));  // the choices go their own ways
      }
    } else if (!sh.seqs.empty()) {
      sh.free(pick());
    }
    sh.verify();
    if (::testing::Test::HasFatalFailure() || ::testing::Test::HasNonfatalFailure()) {
      ADD_FAILURE() << "at operation " << op;
      return;
    }
  }
  while (!sh.seqs.empty()) sh.free(sh.seqs.begin()->first);
  sh.verify();
  EXPECT_EQ(sh.kv.used_blocks(), 0);
  EXPECT_EQ(sh.kv.available_blocks(), 12);
  EXPECT_GT(hits, admits / 10);
  EXPECT_GT(tail_hits, 100);
  EXPECT_GT(sh.cache.evictions(), 1000);
  EXPECT_GT(refused, 100);
  EXPECT_GT(forks, 100);
  std::printf("[prefix property] %d ops: %lld admissions, %lld hits (%lld inside a block), %lld records, %lld forks, "
              "%lld evictions, %lld pool-full refusals\n",
              kOps, (long long)admits, (long long)hits, (long long)tail_hits, (long long)records, (long long)forks,
              (long long)sh.cache.evictions(), (long long)refused);
}

}  // namespace
}  // namespace dil::runtime
