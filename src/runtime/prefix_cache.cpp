#include "runtime/prefix_cache.h"

#include <algorithm>

#include "core/check.h"

namespace dil::runtime {
namespace {

uint64_t mix64(uint64_t x) {  // SplitMix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t hash_string(const std::string& s) {
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return mix64(h);
}

size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

bool same(std::span<const int32_t> a, std::span<const int32_t> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

}  // namespace

PrefixCache::PrefixCache(KvManager& kv, const std::string& salt)
    : kv_(kv), salt_(hash_string(salt)), entries_(size_t(kv.total_blocks())) {}

uint64_t PrefixCache::chain_key(uint64_t parent_key, std::span<const int32_t> block) const {
  uint64_t h = mix64(parent_key ^ 0x5bd1e995u);
  for (int32_t t : block) h = mix64(h ^ (uint64_t(uint32_t(t)) * 0x9E3779B97F4A7C15ull));
  return h;
}

// Snapshots are evicted cold ones first (never hit, not a shared prefix: most prompt ends of
// one-shot requests), then hot ones, each least recently used first: a burst of one-shot
// prompts must not push out the system prompt everybody hits.
std::pair<uint64_t, int32_t> PrefixCache::snap_key(int32_t b) const {
  const Entry& e = entries_[size_t(b)];
  return {(e.hot ? kHot : 0) | e.used, b};
}

void PrefixCache::touch(int32_t b, bool hot) {
  Entry& e = entries_[size_t(b)];
  if (e.used == tick_ && (e.hot || !hot)) return;
  const bool leaf = leaves_.erase({e.used, b}) > 0;
  const bool snap = snapshots_.erase(snap_key(b)) > 0;
  e.used = tick_;
  e.hot = e.hot || hot;
  if (leaf) leaves_.insert({e.used, b});
  if (snap) snapshots_.insert(snap_key(b));
}

PrefixMatch PrefixCache::lookup(std::span<const int32_t> tokens, int64_t limit) {
  ++tick_;
  PrefixMatch m;
  const int64_t B = kv_.block_tokens(), n = int64_t(tokens.size());
  uint64_t key = salt_;
  int32_t parent = -1;
  int64_t depth = 0;  // full blocks matched
  std::vector<int32_t> chain;
  int32_t tail = -1;
  for (;;) {
    // At this node: partial tails the query extends (a hit inside the next block), and how far
    // any child agrees with the query (where it diverges from the cache).
    const auto rest = tokens.subspan(size_t(depth * B), size_t(std::min(B, n - depth * B)));
    for (int32_t c : children_of(parent)) {
      const Entry& e = entries_[size_t(c)];
      const int64_t cp = int64_t(common_prefix(e.tokens, rest));
      m.shared = std::max(m.shared, depth * B + cp);
      if (!e.full && cp == int64_t(e.tokens.size()) && e.snapshot >= 0 && depth * B + cp <= limit &&
          depth * B + cp > m.tokens) {
        m.tokens = depth * B + cp;
        m.snapshot = e.snapshot;
        m.blocks = chain;
        m.blocks.push_back(c);
        tail = c;
      }
    }
    if ((depth + 1) * B > n) break;
    const uint64_t k = chain_key(key, rest);
    auto it = index_.find(k);
    if (it == index_.end()) break;
    const Entry& e = entries_[size_t(it->second)];
    if (e.parent != parent || !same(e.tokens, rest)) break;  // a collision: a miss
    chain.push_back(it->second);
    parent = it->second;
    key = k;
    ++depth;
    if (e.snapshot >= 0 && depth * B <= limit && depth * B > m.tokens) {
      m.tokens = depth * B;
      m.snapshot = e.snapshot;
      m.blocks = chain;
    }
  }
  for (int32_t b : chain) touch(b);
  if (tail >= 0) touch(tail);
  if (m.tokens > 0) touch(m.blocks.back(), true);  // its snapshot was hit
  return m;
}

int32_t PrefixCache::add_entry(int32_t block, int32_t parent, bool full, uint64_t key, std::span<const int32_t> tokens) {
  Entry& e = entries_[size_t(block)];
  DIL_CHECK(!e.live, "block ", block, " is cached already");
  e.live = true;
  e.full = full;
  e.parent = parent;
  e.key = key;
  e.snapshot = -1;
  e.used = tick_;
  e.hot = false;
  e.tokens.assign(tokens.begin(), tokens.end());
  e.children.clear();
  auto& sib = children_of(parent);
  if (parent >= 0 && sib.empty()) leaves_.erase({entries_[size_t(parent)].used, parent});
  sib.push_back(block);
  leaves_.insert({e.used, block});
  if (full) index_[key] = block;
  kv_.cache_block(block);
  return block;
}

bool PrefixCache::insert(int64_t seq, std::span<const int32_t> tokens, int64_t n, bool shared,
                         std::vector<CopyOp>* copies) {
  DIL_CHECK(n > 0 && n <= int64_t(tokens.size()) && n <= kv_.reserved_tokens(seq), "insert of ", n,
            " positions of sequence ", seq);
  ++tick_;
  const int64_t B = kv_.block_tokens(), nfull = n / B, r = n % B;
  uint64_t key = salt_;
  int32_t parent = -1;
  for (int64_t i = 0; i < nfull; ++i) {
    const auto blk = tokens.subspan(size_t(i * B), size_t(B));
    const uint64_t k = chain_key(key, blk);
    int32_t b;
    auto it = index_.find(k);
    if (it != index_.end()) {
      const Entry& e = entries_[size_t(it->second)];
      if (e.parent != parent || !same(e.tokens, blk)) return false;  // a collision: stop here
      b = it->second;
      // Same contents: the sequence reads the cached block from now on and its own copy is freed.
      // Not when others (its forks) read its copy too: they would keep reading the old block
      // while the later blocks they share hang off the cached one, and whoever holds a cached
      // block must hold its parent (else a block nobody holds could not be reclaimed).
      const int32_t own = kv_.blocks(seq)[size_t(i)];
      if (own != b && kv_.refcount(own) > 1) return false;
      kv_.replace_block(seq, size_t(i), b);
    } else {
      b = add_entry(kv_.blocks(seq)[size_t(i)], parent, true, k, blk);
    }
    touch(b);
    parent = b;
    key = k;
  }
  int32_t target = parent;
  if (r > 0) {
    const auto rest = tokens.subspan(size_t(nfull * B), size_t(r));
    target = -1;
    for (int32_t c : children_of(parent))
      if (!entries_[size_t(c)].full && same(entries_[size_t(c)].tokens, rest)) target = c;
    // The sequence keeps writing this block: the cache's reference makes its next write copy it.
    if (target < 0) target = add_entry(kv_.blocks(seq)[size_t(nfull)], parent, false, 0, rest);
  }
  touch(target, shared);
  Entry& e = entries_[size_t(target)];
  if (e.snapshot >= 0) return true;
  const int32_t slot = kv_.take_snapshot_slot();  // may drop older snapshots, never this entry's
  if (slot < 0) {
    if (!e.full) evict(target);  // a tail without its state is of no use
    return false;
  }
  e.snapshot = slot;
  snapshots_.insert(snap_key(target));
  copies->push_back({CopyOp::Kind::Slot, kv_.slot(seq), slot});
  return true;
}

void PrefixCache::drop_snapshot(int32_t b) {
  Entry& e = entries_[size_t(b)];
  DIL_CHECK(e.snapshot >= 0, "entry ", b, " has no snapshot");
  snapshots_.erase(snap_key(b));
  kv_.release_snapshot_slot(e.snapshot);
  e.snapshot = -1;
}

void PrefixCache::evict(int32_t b) {
  Entry& e = entries_[size_t(b)];
  DIL_CHECK(e.live && e.children.empty(), "evict of entry ", b, " that is not a leaf");
  if (e.snapshot >= 0) drop_snapshot(b);
  leaves_.erase({e.used, b});
  if (e.full) index_.erase(e.key);
  auto& sib = children_of(e.parent);
  sib.erase(std::find(sib.begin(), sib.end(), b));
  if (e.parent >= 0 && sib.empty()) leaves_.insert({entries_[size_t(e.parent)].used, e.parent});
  e = Entry{};
  kv_.uncache_block(b);  // freed unless a sequence still reads it (then it just stops being shared)
  ++evictions_;
}

bool PrefixCache::reclaim_block() {
  for (const auto& [used, b] : leaves_) {
    if (kv_.refcount(b) != 1) continue;  // a sequence reads it
    evict(b);
    return true;
  }
  return false;
}

bool PrefixCache::reclaim_slot() {
  if (snapshots_.empty()) return false;
  const int32_t b = snapshots_.begin()->second;
  drop_snapshot(b);
  if (!entries_[size_t(b)].full) evict(b);
  return true;
}

void PrefixCache::check_invariants() const {
  int32_t live = 0;
  size_t n_leaves = 0, n_snaps = 0, n_full = 0;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    const int32_t b = int32_t(i);
    if (!e.live) continue;
    ++live;
    DIL_CHECK(kv_.cached(b), "entry ", b, " without the cache's reference");
    const auto& sib = children_of(e.parent);
    DIL_CHECK(std::count(sib.begin(), sib.end(), b) == 1, "entry ", b, " not once among its parent's children");
    if (e.parent >= 0) {
      const Entry& p = entries_[size_t(e.parent)];
      DIL_CHECK(p.live && p.full, "entry ", b, " hangs off a dead or partial entry ", e.parent);
      // Reclaim reachability: whoever holds a cached block holds its parent.
      DIL_CHECK(kv_.refcount(b) == 1 || kv_.refcount(e.parent) > 1, "entry ", b, " is held but its parent ",
                e.parent, " is not");
    }
    DIL_CHECK(e.full ? e.tokens.size() == size_t(kv_.block_tokens()) : e.tokens.size() < size_t(kv_.block_tokens()),
              "entry ", b, " has ", e.tokens.size(), " tokens");
    DIL_CHECK(e.full || (e.children.empty() && e.snapshot >= 0), "partial entry ", b, " with children or no snapshot");
    DIL_CHECK(e.children.empty() == (leaves_.count({e.used, b}) == 1), "entry ", b, " leaf set membership wrong");
    DIL_CHECK((e.snapshot >= 0) == (snapshots_.count(snap_key(b)) == 1), "entry ", b, " snapshot set membership wrong");
    if (e.full) {
      auto it = index_.find(e.key);
      DIL_CHECK(it != index_.end() && it->second == b, "full entry ", b, " missing from the index");
      ++n_full;
    }
    n_leaves += e.children.empty() ? 1 : 0;
    n_snaps += e.snapshot >= 0 ? 1 : 0;
  }
  for (int32_t c : root_children_) DIL_CHECK(entries_[size_t(c)].live && entries_[size_t(c)].parent == -1, "bad root child ", c);
  DIL_CHECK(live == kv_.cached_blocks(), live, " entries but ", kv_.cached_blocks(), " cached blocks");
  DIL_CHECK(n_leaves == leaves_.size() && n_snaps == snapshots_.size() && n_full == index_.size(),
            "stale LRU sets or index");
  DIL_CHECK(int32_t(n_snaps) == kv_.snapshot_slots(), n_snaps, " snapshots but ", kv_.snapshot_slots(), " slots");
}

}  // namespace dil::runtime
