// Shared by the drafter tests (test_v4_mtp.cpp, test_v41_dspark.cpp): the drafter fixtures'
// folder, a CPU model with or without its drafter, deterministic token ids, one forward step of
// several chunks, and the comparisons the tests make.
#pragma once
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"

namespace dil::test {

// $DIL_DRAFTER_DATA (made elsewhere) or the build folder's (CTest's set-up test drafter_fixtures).
inline std::string drafter_data() {
  const char* env = std::getenv("DIL_DRAFTER_DATA");
  return env && *env ? env : DIL_DRAFTER_DATA;
}

// A model on the CPU backend with its drafter bound (ModelOptions::load_mtp) or not; a cache of
// 16 blocks of 128 tokens and 4 slots.
struct DrafterModel {
  std::unique_ptr<Backend> be = make_backend(BackendKind::CPU);
  std::unique_ptr<Model> model;
  DrafterModel(bool drafter, const std::string& dir, Numerics n) {
    ModelOptions o;
    o.numerics = n;
    o.load_mtp = drafter;
    model = load_model(dir, *be, o);
    model->allocate_cache(16, 4, 128);
  }
};

// n token ids below `vocab`, a different sequence per salt.
inline std::vector<int32_t> tokens(int n, int salt, int vocab) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(int32_t((i * 37 + salt * 101 + (i * i) % 13) % vocab));
  return t;
}

// One step of several chunks: (slot, start, tokens, first block); each chunk's sequence owns the
// 3 blocks from its first (384 positions), the logits of each chunk's last token come back.
struct Part {
  int32_t slot, start;
  std::vector<int32_t> toks;
  int32_t block0;
};
inline std::vector<float> step(Model& m, const std::vector<Part>& parts) {
  StepBatch b;
  for (const Part& p : parts) {
    SeqChunk c;
    c.slot = p.slot;
    c.start_pos = p.start;
    c.n_tokens = int32_t(p.toks.size());
    for (int k = 0; k < 3; ++k) c.blocks.push_back(p.block0 + k);
    b.seqs.push_back(c);
    b.tokens.insert(b.tokens.end(), p.toks.begin(), p.toks.end());
  }
  std::vector<float> lg;
  m.forward(b, &lg);
  return lg;
}

inline std::vector<int32_t> sub(const std::vector<int32_t>& t, int a, int b) {
  return std::vector<int32_t>(t.begin() + a, t.begin() + b);
}

// Bit for bit.
inline bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ||g - w|| / ||w|| over n values, in double.
inline double rel_l2(const float* g, const float* w, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) num += (double(g[i]) - w[i]) * (double(g[i]) - w[i]), den += double(w[i]) * w[i];
  return std::sqrt(num / den);
}

}  // namespace dil::test
