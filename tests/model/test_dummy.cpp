// --load-format dummy: random weights in the official formats drive the real forward.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/backend.h"
#include "model/dummy_weights.h"
#include "model/model.h"
#include "model/schema.h"
#include "model/single_sequence.h"

using namespace dil;

static const std::string kCfg = std::string(DIL_SOURCE_DIR) + "/tests/data/v4-tiny/config.json";

TEST(Dummy, CheckpointMatchesTheSchemaAndIsRandom) {
  ModelConfig c = load_config(kCfg);
  SafeTensors st = make_dummy_checkpoint(c, {}, 7);
  ValidationReport r = validate_checkpoint(st, expected_tensors(c, false));
  for (const auto& e : r.errors) ADD_FAILURE() << e;
  // FP8 weights use many codes and no NaN code; FP4 bytes vary; scales are sane powers of two.
  const StEntry& w = st.at("layers.2.attn.wq_b.weight");
  std::vector<int> hist(256);
  for (size_t i = 0; i < w.nbytes; ++i) hist[w.data[i]]++;
  int used = 0;
  for (int v : hist) used += v > 0;
  EXPECT_GT(used, 100);
  EXPECT_EQ(hist[0x7f] + hist[0xff], 0);
  const StEntry& s = st.at("layers.2.attn.wq_b.scale");
  for (size_t i = 0; i < s.nbytes; ++i) EXPECT_TRUE(s.data[i] > 100 && s.data[i] < 130) << int(s.data[i]);
  // A layer subset holds only those layers.
  SafeTensors sub = make_dummy_checkpoint(c, {3}, 7);
  EXPECT_NE(sub.find("layers.3.attn.wkv.weight"), nullptr);
  EXPECT_EQ(sub.find("layers.2.attn.wkv.weight"), nullptr);
}

TEST(Dummy, ForwardIsFiniteAndChunkInvariant) {
  auto be = make_backend(BackendKind::CPU);
  ModelOptions o;
  o.load_format = "dummy";
  o.layers = {1, 3, 4};
  auto model = load_model(kCfg, *be, o);
  std::vector<int32_t> ids;
  for (int i = 0; i < 150; ++i) ids.push_back((i * 37 + 11) % 1024);
  SingleSequence a(*model, 150);
  auto full = a.feed(ids, true);
  double sum = 0, sq = 0;
  for (float v : full) {
    ASSERT_TRUE(std::isfinite(v));
    sum += v;
    sq += double(v) * v;
  }
  EXPECT_GT(sq / double(full.size()) - (sum / double(full.size())) * (sum / double(full.size())), 1e-6);
  SingleSequence b(*model, 150);
  auto p1 = b.feed(std::vector<int32_t>(ids.begin(), ids.begin() + 70), true);
  auto p2 = b.feed(std::vector<int32_t>(ids.begin() + 70, ids.end()), true);
  p1.insert(p1.end(), p2.begin(), p2.end());
  ASSERT_EQ(p1.size(), full.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < full.size(); ++i) {
    num += (p1[i] - full[i]) * double(p1[i] - full[i]);
    den += double(full[i]) * full[i];
  }
  EXPECT_LE(std::sqrt(num / den), 1e-6);
}
