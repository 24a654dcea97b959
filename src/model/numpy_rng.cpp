#include "model/numpy_rng.h"

#include <array>

#include "core/check.h"

namespace dil {

namespace {

// numpy/random/bit_generator.pyx SeedSequence constants (32-bit arithmetic throughout).
constexpr uint32_t kInitA = 0x43b0d7e5u, kMultA = 0x931e8875u;
constexpr uint32_t kInitB = 0x8b51f9ddu, kMultB = 0x58f38dedu;
constexpr uint32_t kMixL = 0xca01f9ddu, kMixR = 0x4973f715u;
constexpr int kPoolSize = 4;

uint32_t hashmix(uint32_t value, uint32_t* hash_const) {
  value ^= *hash_const;
  *hash_const *= kMultA;
  value *= *hash_const;
  value ^= value >> 16;
  return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t r = kMixL * x - kMixR * y;
  r ^= r >> 16;
  return r;
}

// SeedSequence(seed).generate_state(n_u64, uint64): the pool is the seed's 32-bit words
// (little-endian, [0] for 0) mixed into 4 words; the output cycles over the pool.
std::vector<uint64_t> seed_sequence_state(uint64_t seed, int n_u64) {
  std::vector<uint32_t> entropy;
  if (seed == 0) entropy.push_back(0);
  for (uint64_t s = seed; s != 0; s >>= 32) entropy.push_back(uint32_t(s));
  std::array<uint32_t, kPoolSize> pool{};
  uint32_t hc = kInitA;
  for (int i = 0; i < kPoolSize; ++i) pool[i] = hashmix(i < int(entropy.size()) ? entropy[i] : 0u, &hc);
  for (int src = 0; src < kPoolSize; ++src)
    for (int dst = 0; dst < kPoolSize; ++dst)
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], &hc));
  for (int src = kPoolSize; src < int(entropy.size()); ++src)
    for (int dst = 0; dst < kPoolSize; ++dst) pool[dst] = mix(pool[dst], hashmix(entropy[src], &hc));
  std::vector<uint32_t> words(size_t(n_u64) * 2);
  uint32_t hb = kInitB;
  for (size_t i = 0; i < words.size(); ++i) {
    uint32_t v = pool[i % kPoolSize];
    v ^= hb;
    hb *= kMultB;
    v *= hb;
    v ^= v >> 16;
    words[i] = v;
  }
  std::vector<uint64_t> out(static_cast<size_t>(n_u64));
  for (int i = 0; i < n_u64; ++i) out[i] = uint64_t(words[2 * i]) | (uint64_t(words[2 * i + 1]) << 32);
  return out;
}

constexpr unsigned __int128 kPcgMult =
    (unsigned __int128)(0x2360ED051FC65DA4ull) << 64 | (unsigned __int128)(0x4385DF649FCCF645ull);

}  // namespace

NumpyPcg64::NumpyPcg64(uint64_t seed) {
  const std::vector<uint64_t> v = seed_sequence_state(seed, 4);
  // pcg64_set_seed: initstate = v[0]:v[1], initseq = v[2]:v[3] (high word first);
  // then PCG's srandom: state = 0, inc = initseq << 1 | 1, step, state += initstate, step.
  const unsigned __int128 initstate = (unsigned __int128)v[0] << 64 | v[1];
  const unsigned __int128 initseq = (unsigned __int128)v[2] << 64 | v[3];
  state_ = 0;
  inc_ = (initseq << 1) | 1;
  state_ = state_ * kPcgMult + inc_;
  state_ += initstate;
  state_ = state_ * kPcgMult + inc_;
}

uint64_t NumpyPcg64::next64() {
  // XSL-RR output of the advanced state.
  state_ = state_ * kPcgMult + inc_;
  const uint64_t hi = uint64_t(state_ >> 64), lo = uint64_t(state_);
  const unsigned rot = unsigned(state_ >> 122);
  const uint64_t x = hi ^ lo;
  return (x >> rot) | (x << ((64 - rot) & 63));
}

std::vector<int64_t> NumpyPcg64::integers(int64_t high, int n) {
  DIL_CHECK(high > 0, "integers: empty range");
  const uint64_t rng = uint64_t(high) - 1;  // inclusive range [0, rng]
  DIL_CHECK(rng > 0xFFFFFFFFull, "integers: numpy's 32-bit bounded path is not implemented (high ", high, ")");
  const uint64_t excl = rng + 1;
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    // numpy bounded_lemire_uint64
    unsigned __int128 m = (unsigned __int128)next64() * excl;
    uint64_t left = uint64_t(m);
    if (left < excl) {
      const uint64_t threshold = (UINT64_MAX - rng) % excl;
      while (left < threshold) {
        m = (unsigned __int128)next64() * excl;
        left = uint64_t(m);
      }
    }
    out[i] = int64_t(uint64_t(m >> 64));
  }
  return out;
}

}  // namespace dil
