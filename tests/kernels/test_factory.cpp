// The backend factory and its kind parser.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <vector>

#include "backend/backend.h"

namespace dil {
namespace {

TEST(Factory, ParseAndMakeCpu) {
  EXPECT_EQ(parse_backend_kind("cpu"), BackendKind::CPU);
  EXPECT_EQ(parse_backend_kind("cuda"), BackendKind::CUDA);
  EXPECT_THROW(parse_backend_kind("gpu"), Error);
  auto be = make_backend(BackendKind::CPU);
  ASSERT_TRUE(be);
  EXPECT_EQ(be->device(), Device::CPU);
  EXPECT_EQ(be->name(), "cpu");
  // alloc is zero-filled; upload/download/fill/copy round-trip.
  Buffer b = be->alloc(4 * 6);
  Tensor t = b.as(DType::F32, {2, 3});
  for (int i = 0; i < 6; ++i) EXPECT_EQ(t.ptr<float>()[i], 0.0f);
  const float src[6] = {1, 2, 3, 4, 5, 6};
  be->upload(t, src);
  Buffer b2 = be->alloc(4 * 6);
  Tensor t2 = b2.as(DType::F32, {2, 3});
  be->copy(t2, t);
  float dst[6];
  be->download(dst, t2);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(dst[i], src[i]);
  be->fill(t2, -2.5f);
  be->add(t, t2, t2);
  be->download(dst, t2);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(dst[i], src[i] - 2.5f);
}

// alloc_scratch: zero-filled on the CPU unless poisoned; poisoned, every byte 0xff (NaN as f32,
// -1 as i32), while alloc stays zero-filled (state buffers rely on it).
TEST(Memory, ScratchPoisonOnlyWhenAsked) {
  auto plain = make_backend(BackendKind::CPU);
  BackendOptions o;
  o.poison_scratch = true;
  auto poisoned = make_backend(BackendKind::CPU, 0, o);
  for (size_t bytes : {size_t(24), size_t(3) << 20}) {  // host_alloc and mmap sizes
    Buffer a = plain->alloc_scratch(bytes), p = poisoned->alloc_scratch(bytes), z = poisoned->alloc(bytes);
    const auto* pa = static_cast<const uint8_t*>(a.data());
    const auto* pp = static_cast<const uint8_t*>(p.data());
    const auto* pz = static_cast<const uint8_t*>(z.data());
    for (size_t i = 0; i < bytes; i += 4093) {
      EXPECT_EQ(pa[i], 0) << i;
      EXPECT_EQ(pp[i], 0xff) << i;
      EXPECT_EQ(pz[i], 0) << i;
    }
    EXPECT_TRUE(std::isnan(p.as(DType::F32, {int64_t(bytes / 4)}).ptr<float>()[0]));
  }
}

// Programmatic dependent launch (CUDA) is on unless the options or DIL_PDL=0 say otherwise.
TEST(Memory, PdlSwitchFromTheEnvironment) {
  EXPECT_TRUE(make_backend(BackendKind::CPU)->options().pdl);
  BackendOptions o;
  o.pdl = false;
  EXPECT_FALSE(make_backend(BackendKind::CPU, 0, o)->options().pdl);
  ::setenv("DIL_PDL", "0", 1);
  const bool off = !make_backend(BackendKind::CPU)->options().pdl;
  ::setenv("DIL_PDL", "1", 1);
  const bool on = make_backend(BackendKind::CPU)->options().pdl;
  ::unsetenv("DIL_PDL");
  EXPECT_TRUE(off);
  EXPECT_TRUE(on);
}

TEST(Memory, EmbedBf16AndF32Tables) {
  auto be = make_backend(BackendKind::CPU);
  std::vector<uint16_t> tb(5 * 3);
  std::vector<float> tf(5 * 3);
  for (int i = 0; i < 15; ++i) {
    tb[i] = f32_to_bf16(0.37f * (i + 1));
    tf[i] = -1.5f * (i + 1);
  }
  std::vector<int32_t> ids = {4, 0, 4, 2};
  std::vector<float> out(4 * 3);
  Weight wb{Weight::Kind::BF16, Tensor(tb.data(), DType::BF16, {5, 3}), Tensor(), 0, 0, 5, 3};
  be->embed(wb, Tensor(ids.data(), DType::I32, {4}), Tensor(out.data(), DType::F32, {4, 3}));
  for (int t = 0; t < 4; ++t)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(out[t * 3 + c], bf16_to_f32(tb[ids[t] * 3 + c]));
  Weight wf{Weight::Kind::F32, Tensor(tf.data(), DType::F32, {5, 3}), Tensor(), 0, 0, 5, 3};
  be->embed(wf, Tensor(ids.data(), DType::I32, {4}), Tensor(out.data(), DType::F32, {4, 3}));
  for (int t = 0; t < 4; ++t)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(out[t * 3 + c], tf[ids[t] * 3 + c]);
}

}  // namespace
}  // namespace dil
