// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// counter-based generator. The sampler keys it by (seed, token position, draw index), so a
// request's draws depend on nothing but its own seed and positions: not on the batch it ran
// in, the step, or whether it was preempted and recomputed (serving-notes §2.9).
#pragma once
#include <array>
#include <cstdint>

namespace dil::runtime {

inline std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;  // round multipliers
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;      // Weyl key increments
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = uint64_t(kMul0) * ctr[0];
    uint64_t p1 = uint64_t(kMul1) * ctr[2];
    ctr = {uint32_t(p1 >> 32) ^ ctr[1] ^ key[0], uint32_t(p1), uint32_t(p0 >> 32) ^ ctr[3] ^ key[1], uint32_t(p0)};
    key[0] += kW0;
    key[1] += kW1;
  }
  return ctr;
}

// A uniform double in [0, 1) with 53 random bits, for draw `draw` of the token at `position`.
inline double philox_uniform(uint64_t seed, uint64_t position, uint32_t draw = 0) {
  auto o = philox4x32_10({uint32_t(position), uint32_t(position >> 32), draw, 0},
                         {uint32_t(seed), uint32_t(seed >> 32)});
  uint64_t bits = (uint64_t(o[0]) << 32 | o[1]) >> 11;
  return double(bits) * 0x1.0p-53;
}

}  // namespace dil::runtime
