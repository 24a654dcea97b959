// The three numerics modes (design.md "Numerics"). A model is built in one mode; the backend's
// kernel plan (backend/plan.h) is resolved for it.
#pragma once
#include <string>

#include "core/dtype.h"

namespace dil {

enum class Numerics {
  // No quantization simulation, f32 activations: compared with HF transformers in float64.
  Reference,
  // The official quantization points (FP8 activation quant before every FP8/FP4 GEMM, the KV
  // and indexer round trips) with f32 activations and exact kernels: the verification oracle.
  Official,
  // Production: the official quantization points, BF16 activations where DeepSeek's
  // inference/model.py keeps its native BF16 (linear and norm outputs, residual streams, KV
  // rows), tensor-core arithmetic as FlashMLA / DeepGEMM do it (fp32 accumulation).
  Fast,
};

Numerics parse_numerics(const std::string& s);  // "reference" | "official" | "fast"; throws dil::Error
const char* numerics_name(Numerics n);
// Every mode's name, in the order above ("reference|official|fast"), for help texts.
const char* numerics_choices();
// The dtype of activations between ops: BF16 in fast numerics, F32 otherwise.
inline DType activation_dtype(Numerics n) { return n == Numerics::Fast ? DType::BF16 : DType::F32; }
// Whether the mode applies the official quantization points.
inline bool quantizes(Numerics n) { return n != Numerics::Reference; }

}  // namespace dil
