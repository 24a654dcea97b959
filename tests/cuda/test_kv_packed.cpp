// The device codecs of the packed KV formats (kernels/cuda/kv_packed.cuh) against the host's
// (core/kv_packed.h, itself checked against the QDQ ops in tests/kernels/test_kv_packed.cpp):
// packed bytes and unpacked values bit for bit. No tolerance: both sides evaluate the same
// f32 formulas (amax, one multiply or divide, the same RNE conversions), which are exact
// operations or correctly rounded ones on both (--fmad=false), so they must agree on every bit.
#include <cstring>

#include "core/kv_packed.h"
#include "kernels/cuda/kv_packed.h"
#include "parity.h"

namespace dil::test {
namespace {

using kvpack::Format;
using kvpack::RowShape;

class CudaKvPacked : public CudaParity {
 protected:
  void run(RowShape s, int R, uint32_t seed) {
    std::vector<float> x = random_vec(size_t(R) * size_t(s.d), seed, 1.0f);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::ldexp(x[i], int((i * 2654435761u + seed) % 40) - 30);
    x[1] = -0.0f;
    const size_t nb = kvpack::row_bytes(s);
    std::vector<uint8_t> want(nb * size_t(R));
    std::vector<float> want_x(x.size());
    for (int r = 0; r < R; ++r) {
      kvpack::pack_row(s, x.data() + size_t(r) * size_t(s.d), want.data() + size_t(r) * nb);
      kvpack::unpack_row(s, want.data() + size_t(r) * nb, want_x.data() + size_t(r) * size_t(s.d));
    }
    Tensor dx = devf(x, {int64_t(R), int64_t(s.d)});
    Tensor rows = poisoned(DType::I32, {int64_t(R), int64_t(nb / 4 + 1)});  // bytes, poisoned
    Tensor back = poisoned(DType::F32, {int64_t(R), int64_t(s.d)});
    cuda::kv_pack_rows(s, dx.ptr<float>(), R, static_cast<uint8_t*>(rows.data), gpu->native_stream());
    cuda::kv_unpack_rows(s, static_cast<uint8_t*>(rows.data), R, back.ptr<float>(), gpu->native_stream());
    gpu->synchronize();
    std::vector<uint8_t> got(nb * size_t(R));
    Tensor bytes(rows.data, DType::I32, {int64_t(nb * size_t(R) / 4)}, Device::CUDA);
    ASSERT_EQ(nb * size_t(R) % 4, 0u);
    gpu->download(got.data(), bytes);
    size_t diff = 0;
    for (size_t i = 0; i < got.size(); ++i) diff += got[i] != want[i];
    EXPECT_EQ(diff, 0u) << "bytes differing of " << got.size();
    EXPECT_TRUE(same_bits(down<float>(back), want_x));
  }
};

TEST_F(CudaKvPacked, V4RowMatchesHostBytes) { run({Format::V4Row, 512, 64}, 33, 1); }
TEST_F(CudaKvPacked, V41SwaRowMatchesHostBytes) { run({Format::Fp8B32, 512, 0}, 33, 2); }
TEST_F(CudaKvPacked, V41MainKvMatchesHostBytes) { run({Format::Fp4E4m3B16, 512, 0}, 33, 3); }
TEST_F(CudaKvPacked, IndexerKeysMatchHostBytes) { run({Format::Fp4B32, 128, 0}, 33, 4); }

}  // namespace
}  // namespace dil::test
