// The arithmetic of the sampler's specification (backend/sampling.h) that the CPU reference and
// the CUDA kernels (kernels/cuda/sample.cu) share, written once for host and device so that both
// compute the same bits: Philox draws, the ordered token keys, and the integer token weights.
//
// Why integer weights: a draw compares a cumulative mass with a target. Sums of doubles depend
// on the order of summation (a sequential loop on the CPU, a tree on the GPU), so the two would
// disagree whenever the target falls within rounding of a boundary. Here the weight of token t
// is W_t = floor(exp(x_t - x_max) * 2^F) with exp evaluated by `exp_nonpos` below (only
// explicitly rounded + - * /, so host and device agree bit for bit), and every mass is an exact
// sum of W in uint64: order-free, so CPU and GPU draws are equal, always. F = 63 - bits(V)
// (capped at 52) keeps any sum of V weights below 2^63. A token whose weight rounds to 0
// (x_t - x_max < -F ln 2, about -31.9 for V4's vocabulary: probability < 2^-46) is never drawn.
//
// Host files that include this header must be compiled with -ffp-contract=off (they are:
// dil_plan, dil_kernels_cpu); nvcc builds the kernels with --fmad=false and the device paths
// below use the _rn intrinsics anyway.
#pragma once
#include <cstdint>
#include <cmath>
#include <cstring>

#if defined(__CUDACC__)
#define DIL_HD __host__ __device__ __forceinline__
#else
#define DIL_HD inline
#endif

namespace dil::sampling {

using std::floor;

DIL_HD double dadd(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
DIL_HD double dmul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
DIL_HD double ddiv(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
DIL_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}
DIL_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}
DIL_HD double pow2(int k) {  // 2^k for -1022 <= k <= 1023, exact
  const uint64_t b = uint64_t(1023 + k) << 52;
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(b));
#else
  double d;
  std::memcpy(&d, &b, 8);
  return d;
#endif
}
DIL_HD float f_inf() { return bits_float(0x7f800000u); }

// Philox4x32-10 (runtime/philox.h, Random123's known answers checked in test_runtime), the
// 53 random bits of draw 0 of the token at `position`: u = bits * 2^-53 in [0, 1).
DIL_HD uint64_t philox_bits53(uint64_t seed, uint64_t position) {
  uint32_t c0 = uint32_t(position), c1 = uint32_t(position >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = uint64_t(0xD2511F53u) * c0;
    const uint64_t p1 = uint64_t(0xCD9E8D57u) * c2;
    const uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0, n1 = uint32_t(p1), n2 = uint32_t(p0 >> 32) ^ c3 ^ k1,
                   n3 = uint32_t(p0);
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return (uint64_t(c0) << 32 | c1) >> 11;
}

// floor(bits * total / 2^53): the draw's target mass, exact (128-bit product).
DIL_HD uint64_t draw_target(uint64_t bits53, uint64_t total) {
#if defined(__CUDA_ARCH__)
  const uint64_t hi = __umul64hi(bits53, total), lo = bits53 * total;
#else
  const unsigned __int128 p = static_cast<unsigned __int128>(bits53) * total;
  const uint64_t hi = uint64_t(p >> 64), lo = uint64_t(p);
#endif
  return hi << 11 | lo >> 53;
}

// exp(d) for d <= 0 from + and * alone: Cody-Waite reduction d = k ln2 + r (fdlibm's split
// ln 2, k ln2_hi exact for |k| < 2^20), |r| <= ln2/2, then the Taylor series to degree 13 in
// Horner form 1 + r/1 (1 + r/2 (1 + ...)) (truncation < 2^-56 relative), times 2^k. r/n is
// r * (1/n) with 1/n a correctly rounded constant (one more rounding per step than a division,
// a few ulps in all): a double division is ~10 FP64 instructions on the GPU and the weights
// are the device sampler's main arithmetic. Its accuracy (a few ulps) does not matter; that
// host and device produce the same bits does. d < -45 returns 0 (every weight below 2^-64,
// so 0 whatever F).
DIL_HD double exp_nonpos(double d) {
  if (!(d >= -45.0)) return 0.0;
  const double kInvLn2 = 1.4426950408889634, kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;
  const double kd = floor(dadd(dmul(d, kInvLn2), 0.5));  // exact on both sides
  const double r = dadd(dadd(d, -dmul(kd, kLn2Hi)), -dmul(kd, kLn2Lo));
  // 1/n for n = 1..13, correctly rounded (Python's (1.0 / n).hex()).
  const double inv[14] = {0.0,
                          0x1.0000000000000p+0, 0x1.0000000000000p-1, 0x1.5555555555555p-2, 0x1.0000000000000p-2,
                          0x1.999999999999ap-3, 0x1.5555555555555p-3, 0x1.2492492492492p-3, 0x1.0000000000000p-3,
                          0x1.c71c71c71c71cp-4, 0x1.999999999999ap-4, 0x1.745d1745d1746p-4, 0x1.5555555555555p-4,
                          0x1.3b13b13b13b14p-4};
  double p = 1.0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int n = 13; n >= 1; --n) p = dadd(1.0, dmul(dmul(r, inv[n]), p));
  return dmul(p, pow2(int(kd)));
}

// Fraction bits of the weights for a vocabulary of v tokens: any sum of v weights < 2^63.
DIL_HD int weight_bits(int64_t v) {
  int b = 0;
  while ((int64_t(1) << b) <= v) ++b;  // bit width of v
  const int f = 63 - b;
  return f < 52 ? f : 52;
}

// W(x) given the row maximum mx (both after every mask; -inf = masked). mx = +inf: the limit of
// the softmax, the +inf tokens share the mass equally.
DIL_HD uint64_t weight(float x, float mx, int f) {
  const float inf = f_inf();
  if (mx == inf) return x == inf ? (uint64_t(1) << f) : 0;
  if (x == -inf) return 0;
  const double e = exp_nonpos(dadd(double(x), -double(mx)));
  return static_cast<uint64_t>(dmul(e, pow2(f)));  // exact product, truncated
}

// Order-preserving uint32 of a float (-0 and +0 equal: the CPU compares values).
DIL_HD uint32_t ordered(float x) {
  const uint32_t u = x == 0.0f ? 0u : float_bits(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
// Bits of the token ids of a vocabulary of v tokens (ids 0..v-1).
DIL_HD int id_bits(int64_t v) {
  int b = 1;
  while ((int64_t(1) << b) < v) ++b;
  return b;
}
// The order "larger value first, ties to the lower id" as one unique integer, larger = first.
DIL_HD uint64_t token_key(float x, int32_t t, int idb) {
  const uint64_t maxid = (uint64_t(1) << idb) - 1;
  return uint64_t(ordered(x)) << idb | (maxid - uint64_t(t));
}

}  // namespace dil::sampling
