// Helpers for comparing the model's logits with a fixture's reference logits.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/safetensors.h"
#include "model/model.h"
#include "model/single_sequence.h"

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

// Logits [positions, V] of every position of one sequence on `model`, feeding `ids` in the
// given chunk sizes (which must add up to ids.size()).
inline std::vector<float> run_chunks(Model& model, const std::vector<int32_t>& ids, const std::vector<int>& chunks) {
  SingleSequence seq(model, int(ids.size()));
  std::vector<float> all;
  size_t pos = 0;
  for (int c : chunks) {
    std::vector<int32_t> part(ids.begin() + ptrdiff_t(pos), ids.begin() + ptrdiff_t(pos) + c);
    auto lg = seq.feed(part, true);
    all.insert(all.end(), lg.begin(), lg.end());
    pos += size_t(c);
  }
  EXPECT_EQ(pos, ids.size());
  return all;
}

// A model of a fixture folder on the CPU backend with one of its reference files.
struct ModelFixture {
  std::unique_ptr<Backend> be = make_backend(BackendKind::CPU);
  std::unique_ptr<Model> model;
  SafeTensors ref;
  int64_t V;
  ModelFixture(const std::string& dir, Numerics n, const std::string& ref_file)
      : ref(SafeTensors::open(dir + "/" + ref_file)) {
    ModelOptions o;
    o.numerics = n;
    model = load_model(dir, *be, o);
    V = model->config().vocab_size;
  }
  // Logits of every position, feeding `ids` in the given chunk sizes.
  std::vector<float> run(const std::vector<int32_t>& ids, const std::vector<int>& chunks) {
    return run_chunks(*model, ids, chunks);
  }
  // Logits of the prompt's last position and of each generated id fed back one at a time
  // (all but the last): the rows a greedy decode of `gen` produced.
  std::vector<float> decode(const std::vector<int32_t>& prompt, const std::vector<int32_t>& gen) {
    SingleSequence seq(*model, int(prompt.size() + gen.size()));
    std::vector<float> got = seq.feed(prompt, false);
    for (size_t j = 0; j + 1 < gen.size(); ++j) {
      auto lg = seq.feed({gen[j]}, false);
      got.insert(got.end(), lg.begin(), lg.end());
    }
    return got;
  }
};

inline void expect_within(const Diff& d, double max_abs, double rel_l2, const std::string& what) {
  EXPECT_LE(d.max_abs, max_abs) << what << ": worst position " << d.worst_pos;
  EXPECT_LE(d.max_rel_l2, rel_l2) << what << ": worst position " << d.worst_pos;
  std::printf("[%s] rows %d  max|d| %.3e  worst rel L2 %.3e (pos %d)  total rel L2 %.3e  argmax agree %d/%d\n",
              what.c_str(), d.rows, d.max_abs, d.max_rel_l2, d.worst_pos, d.total_rel_l2, d.argmax_agree, d.rows);
}

// Chunk sizes: a prefill of `prefill` tokens, then single tokens up to `total`.
inline std::vector<int> single_steps(int prefill, int total) {
  std::vector<int> c{prefill};
  for (int i = prefill; i < total; ++i) c.push_back(1);
  return c;
}

// The fixture comparisons for one numerics mode: seq0..2 whole, seq2 in chunks (100, 37, 263)
// and as a 20-token prefill + single steps, and the prompt + decode sequence, each within
// (max_abs, rel_l2) of `ref_file`'s logits.
inline void check_mode(const std::string& dir, Numerics mode, const std::string& ref_file, double max_abs,
                       double rel_l2, const std::string& tag) {
  ModelFixture f(dir, mode, ref_file);
  for (int i = 0; i < 3; ++i) {
    auto ids = ids_of(f.ref, "seq" + std::to_string(i) + ".input_ids");
    auto want = f32_of(f.ref, "seq" + std::to_string(i) + ".logits");
    expect_within(compare_logits(f.run(ids, {int(ids.size())}), want, f.V), max_abs, rel_l2,
                  tag + " seq" + std::to_string(i) + " full");
  }
  auto ids = ids_of(f.ref, "seq2.input_ids");
  auto want = f32_of(f.ref, "seq2.logits");
  ASSERT_EQ(ids.size(), 400u);
  expect_within(compare_logits(f.run(ids, {100, 37, 263}), want, f.V), max_abs, rel_l2, tag + " seq2 chunks 100,37,263");
  expect_within(compare_logits(f.run(ids, single_steps(20, 400)), want, f.V), max_abs, rel_l2,
                tag + " seq2 prefill 20 + 380 steps");
  // Decode: prefill the prompt, then feed the generated ids one at a time.
  auto prompt = ids_of(f.ref, "decode.input_ids");
  auto gen = ids_of(f.ref, "decode.generated_ids");
  auto dwant = f32_of(f.ref, "decode.logits");
  std::vector<float> got = f.decode(prompt, gen);
  expect_within(compare_logits(got, dwant, f.V), max_abs, rel_l2, tag + " decode");
}

}  // namespace dil::test
