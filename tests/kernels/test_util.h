// Small helpers for the CPU kernel tests: host arrays viewed as Tensors, seeded random data.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <vector>

#include "backend/backend.h"

namespace dil::test {

inline Tensor view(std::vector<float>& v, std::initializer_list<int64_t> dims) {
  return Tensor(v.data(), DType::F32, dims);
}
inline Tensor view(std::vector<int32_t>& v, std::initializer_list<int64_t> dims) {
  return Tensor(v.data(), DType::I32, dims);
}

// Uniform values in [-a, a] that are never exactly zero.
inline std::vector<float> random_vec(size_t n, uint32_t seed, float a = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-a, a);
  std::vector<float> v(n);
  for (auto& x : v) {
    do x = u(rng); while (x == 0.0f);
  }
  return v;
}

// One-sequence or multi-sequence StepMeta from (start_pos, len, slot) per sequence, tokens
// laid out sequence after sequence; block_table given per sequence (padded with -1).
struct SeqSpec { int start_pos, len, slot; std::vector<int32_t> blocks; };
inline StepMeta make_meta(const std::vector<SeqSpec>& seqs, int block_tokens = 128) {
  StepMeta m;
  m.n_seqs = int(seqs.size());
  m.block_tokens = block_tokens;
  for (const auto& s : seqs) m.max_blocks = std::max<int>(m.max_blocks, int(s.blocks.size()));
  int q = 0;
  for (int i = 0; i < m.n_seqs; ++i) {
    const auto& s = seqs[i];
    m.h_q_start.push_back(q);
    m.h_len.push_back(s.len);
    m.h_start_pos.push_back(s.start_pos);
    m.h_slot.push_back(s.slot);
    for (int j = 0; j < s.len; ++j) {
      m.h_tok_pos.push_back(s.start_pos + j);
      m.h_tok_seq.push_back(i);
    }
    for (int b = 0; b < m.max_blocks; ++b) m.h_block_table.push_back(b < int(s.blocks.size()) ? s.blocks[b] : -1);
    q += s.len;
  }
  m.n_tokens = q;
  return m;
}

// Bitwise equality of float arrays (NaN-free data).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0) return false;
  return true;
}

// Reference roundings re-derived by exhaustive search over the code tables (independent of
// the codecs under test).
// Nearest e4m3 value to |v| <= 448 by search over all finite codes; ties to the even code.
inline float nearest_e4m3(float v) {
  const double a = std::fabs(double(v));
  int best = 0;
  for (int c = 1; c < 0x7f; ++c) {
    const double d = std::fabs(e4m3_to_f32(uint8_t(c)) - a), db = std::fabs(e4m3_to_f32(uint8_t(best)) - a);
    if (d < db || (d == db && c % 2 == 0)) best = c;
  }
  return std::copysign(e4m3_to_f32(uint8_t(best)), v);
}

// Nearest e2m1 value to |v| <= 6; ties to the even code.
inline float nearest_e2m1(float v) {
  static const double kMag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  const double a = std::fabs(double(v));
  int best = 0;
  for (int c = 1; c < 8; ++c) {
    const double d = std::fabs(kMag[c] - a), db = std::fabs(kMag[best] - a);
    if (d < db || (d == db && c % 2 == 0)) best = c;
  }
  return float(std::copysign(kMag[best], double(v)));
}

// Smallest power of two >= v (v > 0), by repeated doubling/halving.
inline float pow2_at_least(float v) {
  double s = 1.0;
  while (s < v) s *= 2;
  while (s / 2 >= v) s /= 2;
  return float(s);
}

// The spec's act_quant on x[0, cols) of each row, blocks of `block` (ragged last block).
inline std::vector<float> ref_act_quant(std::vector<float> x, int64_t d, int64_t cols, int block) {
  for (size_t r = 0; r < x.size() / d; ++r)
    for (int64_t b0 = 0; b0 < cols; b0 += block) {
      const int64_t b1 = std::min<int64_t>(cols, b0 + block);
      float amax = 1e-4f;
      for (int64_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(x[r * d + i]));
      const float prod = float(double(amax) * double(1.0f / 448.0f));  // one fp32 rounding
      const float s = pow2_at_least(prod);
      for (int64_t i = b0; i < b1; ++i) {
        float& v = x[r * d + i];
        v = nearest_e4m3(std::clamp(v / s, -448.0f, 448.0f)) * s;
      }
    }
  return x;
}

}  // namespace dil::test
