// RoPE frequency tables (model-spec §3.1): base^(-2i/r) for the rope dims, with the YaRN
// correction for layers that read compressed rows. No attention-scale (mscale) anywhere.
#pragma once
#include <vector>

#include "model/config.h"

namespace dil {

struct YarnRange { int low; int high; };
// The YaRN correction range (low = 15, high = 25 for V4-Flash's compressed layers).
YarnRange yarn_range(int rope_dims, double base, double beta_fast, double beta_slow, double original_seq_len);
// inv_freq [rope_dims/2] f32 for a layer; `compressed` selects compress_rope_theta + YaRN.
std::vector<float> rope_inv_freq(const ModelConfig& c, bool compressed);

}  // namespace dil
