// Helpers for comparing the model's logits with a fixture's reference logits.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/safetensors.h"

namespace dil::test {

inline std::vector<int32_t> ids_of(const SafeTensors& st, const std::string& name) {
  const StEntry& e = st.at(name);
  const int32_t* p = reinterpret_cast<const int32_t*>(e.data);
  return std::vector<int32_t>(p, p + e.numel());
}

inline std::vector<float> f32_of(const SafeTensors& st, const std::string& name) {
  const StEntry& e = st.at(name);
  const float* p = reinterpret_cast<const float*>(e.data);
  return std::vector<float>(p, p + e.numel());
}

struct Diff {
  double max_abs = 0;      // over all positions
  double max_rel_l2 = 0;   // worst position
  double total_rel_l2 = 0; // all positions together
  int worst_pos = -1;
  int argmax_agree = 0;
  int rows = 0;
};

// got/want: [rows, vocab] row-major.
inline Diff compare_logits(const std::vector<float>& got, const std::vector<float>& want, int64_t vocab) {
  Diff d;
  EXPECT_EQ(got.size(), want.size());
  d.rows = int(want.size() / size_t(vocab));
  double num_all = 0, den_all = 0;
  for (int r = 0; r < d.rows; ++r) {
    double num = 0, den = 0;
    int ag = 0, aw = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      size_t i = size_t(r) * size_t(vocab) + size_t(v);
      double a = got[i], b = want[i];
      if (!std::isfinite(a)) { d.max_abs = INFINITY; }
      d.max_abs = std::max(d.max_abs, std::fabs(a - b));
      num += (a - b) * (a - b);
      den += b * b;
      if (got[size_t(r) * size_t(vocab) + size_t(ag)] < a) ag = int(v);
      if (want[size_t(r) * size_t(vocab) + size_t(aw)] < b) aw = int(v);
    }
    double rel = std::sqrt(num / den);
    if (!(rel <= d.max_rel_l2)) { d.max_rel_l2 = rel; d.worst_pos = r; }
    num_all += num;
    den_all += den;
    d.argmax_agree += ag == aw;
  }
  d.total_rel_l2 = std::sqrt(num_all / den_all);
  return d;
}

}  // namespace dil::test
