#include "model/rope.h"

#include <algorithm>
#include <cmath>

namespace dil {

namespace {
double correction_dim(double rotations, int dim, double base, double max_seq) {
  return dim * std::log(max_seq / (rotations * 2 * M_PI)) / (2 * std::log(base));
}
}  // namespace

YarnRange yarn_range(int rope_dims, double base, double beta_fast, double beta_slow, double original_seq_len) {
  int low = int(std::floor(correction_dim(beta_fast, rope_dims, base, original_seq_len)));
  int high = int(std::ceil(correction_dim(beta_slow, rope_dims, base, original_seq_len)));
  return {std::max(low, 0), std::min(high, rope_dims - 1)};
}

std::vector<float> rope_inv_freq(const ModelConfig& c, bool compressed) {
  const int r = c.rope_dims;
  const double base = compressed ? c.compress_rope_theta : c.rope_theta;
  std::vector<float> f(size_t(r / 2));
  // fp32 like the official precompute_freqs_cis: 1 / base^(arange(0, r, 2)/r).
  for (int i = 0; i < r / 2; ++i) {
    float e = float(2 * i) / float(r);
    f[size_t(i)] = 1.0f / std::pow(float(base), e);
  }
  if (compressed && c.yarn && c.original_seq_len > 0) {
    YarnRange yr = yarn_range(r, base, c.beta_fast, c.beta_slow, double(c.original_seq_len));
    float lo = float(yr.low), hi = float(yr.high == yr.low ? yr.high + 0.001 : yr.high);
    for (int i = 0; i < r / 2; ++i) {
      float ramp = std::clamp((float(i) - lo) / (hi - lo), 0.0f, 1.0f);
      float smooth = 1.0f - ramp;
      f[size_t(i)] = f[size_t(i)] / float(c.rope_factor) * (1.0f - smooth) + f[size_t(i)] * smooth;
    }
  }
  return f;
}

}  // namespace dil
