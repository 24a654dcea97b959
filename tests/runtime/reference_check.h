// Greedy generation through the engine against a fixture's reference continuation.
#pragma once
#include <gtest/gtest.h>

#include <cmath>

#include "core/safetensors.h"
#include "engine_harness.h"

namespace dil::testing {

inline std::vector<int32_t> i32_tensor(const SafeTensors& st, const std::string& name) {
  const StEntry& e = st.at(name);
  const int32_t* p = reinterpret_cast<const int32_t*>(e.data);
  return std::vector<int32_t>(p, p + e.numel());
}

// `decode.generated_ids` of the fixture's reference.safetensors is the argmax of the HF
// float64 logits (`decode.logits`); the engine's greedy tokens must equal it, and its raw
// logprobs (log_softmax of the model's logits) must lie within twice the model's logit bound
// (max |d| <= 2e-3 against the same reference, tests/model/test_v4*_fixture.cpp).
inline void expect_greedy_matches_reference(const EngineOptions& opts) {
  SafeTensors ref = SafeTensors::open(opts.model_dir + "/reference.safetensors");
  auto prompt = i32_tensor(ref, "decode.input_ids");
  auto want = i32_tensor(ref, "decode.generated_ids");
  const float* logits = reinterpret_cast<const float*>(ref.at("decode.logits").data);  // [40, vocab] f32
  auto e = make_engine(opts);
  GenRequest r;
  r.prompt = prompt;
  r.sampling.temperature = 0;
  r.sampling.logprobs = 0;
  r.stop.max_tokens = int(want.size());
  r.stop.ignore_eos = true;
  Result got = drain(*e->submit(r));
  ASSERT_EQ(got.tokens, want);
  const int64_t V = e->info().vocab_size;
  for (size_t j = 0; j < want.size(); ++j) {
    const float* row = logits + j * V;
    double mx = row[0], sum = 0;
    for (int64_t v = 0; v < V; ++v) mx = std::max<double>(mx, row[v]);
    for (int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - mx);
    EXPECT_NEAR(got.logprobs[j], row[want[j]] - mx - std::log(sum), 4e-3) << "token " << j;
  }
}

}  // namespace dil::testing
