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

}  // namespace dil::test
