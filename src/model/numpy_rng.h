// numpy's default random generator, bit-exact: `numpy.random.default_rng(seed)` (SeedSequence
// -> PCG64) and `Generator.integers(0, high, dtype=int64)`. V4.1's Engram hash multipliers are
// drawn this way at training time (HF41 `compute_hash_multipliers`), and they depend on the
// config (the bound comes from engram_compressed_vocab_size), so we compute them rather than
// store constants. Only what that needs is implemented: an integer seed that fits in 64 bits
// and 64-bit bounded draws.
#pragma once
#include <cstdint>
#include <vector>

namespace dil {

class NumpyPcg64 {
 public:
  // default_rng(seed): SeedSequence(seed).generate_state(4, uint64) seeds PCG64.
  explicit NumpyPcg64(uint64_t seed);
  uint64_t next64();
  // Generator.integers(0, high, size=n, dtype=int64) (high exclusive; Lemire's method).
  // `high - 1` must exceed 2^32 - 1 (numpy takes a 32-bit path below; not needed here).
  std::vector<int64_t> integers(int64_t high, int n);

 private:
  unsigned __int128 state_ = 0, inc_ = 0;
};

}  // namespace dil
