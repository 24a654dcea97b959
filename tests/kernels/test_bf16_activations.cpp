// The CPU reference on bf16 activations (fast numerics, backend.h conventions): every op
// computes as on the widened f32 values and rounds each output once to bf16 (RNE). So for any op,
// bf16 inputs (exactly representable values) must give round_bf16 of the f32 op's output on the
// same values, bit for bit; in-place ops on bf16 tensors too; and moe_experts' round_bf16
// semantic rounds exactly where its comment says.
#include <gtest/gtest.h>

#include "kernels/cpu/cpu_backend.h"
#include "test_util.h"

namespace dil::test {
namespace {

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = f32_to_bf16(v[i]);
  return o;
}
std::vector<float> widen(const std::vector<uint16_t>& v) {
  std::vector<float> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = bf16_to_f32(v[i]);
  return o;
}
std::vector<float> rounded(std::vector<float> v) {
  for (float& f : v) f = round_bf16(f);
  return v;
}
Tensor bview(std::vector<uint16_t>& v, std::initializer_list<int64_t> dims) {
  return Tensor(v.data(), DType::BF16, dims);
}

struct Bf16Acts : ::testing::Test {
  CpuBackend be;
  void SetUp() override { be.set_numerics(Numerics::Fast); }
};

TEST_F(Bf16Acts, RmsNormRopeAndQuantizersRoundOnceToBf16) {
  const int64_t R = 5, d = 128;
  std::vector<uint16_t> xb = to_bf16(random_vec(size_t(R * d), 1, 4.0f));
  std::vector<float> xf = widen(xb);
  std::vector<float> w = random_vec(size_t(d), 2);
  // rms_norm bf16 -> bf16 and f32 -> f32 on the same values.
  std::vector<uint16_t> ob(xb.size());
  std::vector<float> of(xf.size());
  be.rms_norm(bview(xb, {R, d}), view(w, {d}), 1e-6f, bview(ob, {R, d}));
  be.rms_norm(view(xf, {R, d}), view(w, {d}), 1e-6f, view(of, {R, d}));
  EXPECT_TRUE(same_bits(widen(ob), rounded(of)));
  // In place on a bf16 tensor.
  std::vector<uint16_t> ib = xb;
  be.rms_norm(bview(ib, {R, d}), view(w, {d}), 1e-6f, bview(ib, {R, d}));
  EXPECT_EQ(ib, ob);
  // fp8_qdq in place on the first 64 columns: QDQ'd values are exact in bf16, the rest untouched.
  std::vector<uint16_t> qb = xb;
  std::vector<float> qf = xf;
  be.fp8_qdq(bview(qb, {R, d}), 64, 32);
  be.fp8_qdq(view(qf, {R, d}), 64, 32);
  EXPECT_TRUE(same_bits(widen(qb), qf));
  // hadamard rounds its f32 result.
  std::vector<uint16_t> hb = xb;
  std::vector<float> hf = xf;
  be.hadamard(bview(hb, {R, d}));
  be.hadamard(view(hf, {R, d}));
  EXPECT_TRUE(same_bits(widen(hb), rounded(hf)));
}

TEST_F(Bf16Acts, LinearAndAddMixDtypes) {
  const int64_t T = 3, in = 64, out = 48;
  std::vector<float> wv = random_vec(size_t(out * in), 3);
  std::vector<uint16_t> wb = to_bf16(wv);
  Weight w;
  w.kind = Weight::Kind::BF16;
  w.w = Tensor(wb.data(), DType::BF16, {out, in});
  w.out = out;
  w.in = in;
  std::vector<uint16_t> xb = to_bf16(random_vec(size_t(T * in), 4));
  std::vector<float> xf = widen(xb), of(size_t(T * out)), of2(size_t(T * out));
  std::vector<uint16_t> ob(size_t(T * out));
  be.linear(bview(xb, {T, in}), w, 0, bview(ob, {T, out}));  // bf16 -> bf16
  be.linear(bview(xb, {T, in}), w, 0, view(of2, {T, out}));  // bf16 -> f32 (compressor, router)
  be.linear(view(xf, {T, in}), w, 0, view(of, {T, out}));
  EXPECT_TRUE(same_bits(of2, of));
  EXPECT_TRUE(same_bits(widen(ob), rounded(of)));
  // add: f32 + bf16 -> bf16 (the routed sum meeting the shared expert).
  std::vector<uint16_t> sum(ob.size());
  be.add(view(of, {T, out}), bview(ob, {T, out}), bview(sum, {T, out}));
  std::vector<float> want(of.size());
  for (size_t i = 0; i < of.size(); ++i) want[i] = round_bf16(of[i] + bf16_to_f32(ob[i]));
  EXPECT_TRUE(same_bits(widen(sum), want));
}

TEST_F(Bf16Acts, HcPostInPlaceOnBf16Streams) {
  const int64_t T = 2, n = 4, D = 32;
  std::vector<uint16_t> F = to_bf16(random_vec(size_t(T * D), 5)), X = to_bf16(random_vec(size_t(T * n * D), 6));
  std::vector<float> post = random_vec(size_t(T * n), 7), comb = random_vec(size_t(T * n * n), 8);
  std::vector<float> Ff = widen(F), Xf = widen(X), of(Xf.size());
  be.hc_post(view(Ff, {T, D}), view(Xf, {T, n, D}), view(post, {T, n}), view(comb, {T, n, n}), view(of, {T, n, D}));
  be.hc_post(bview(F, {T, D}), bview(X, {T, n, D}), view(post, {T, n}), view(comb, {T, n, n}), bview(X, {T, n, D}));
  EXPECT_TRUE(same_bits(widen(X), rounded(of)));
}

TEST_F(Bf16Acts, MoeRoundBf16RoundsTheExpertOutputs) {
  const int64_t T = 2, D = 64, I = 32;
  const int k = 2;
  auto mk = [](int64_t o, int64_t i, uint32_t seed, std::vector<uint16_t>& store) {
    store = to_bf16(random_vec(size_t(o * i), seed));
    Weight w;
    w.kind = Weight::Kind::BF16;
    w.w = Tensor(store.data(), DType::BF16, {o, i});
    w.out = o;
    w.in = i;
    return w;
  };
  std::vector<uint16_t> s1, s2, s3, s4, s5, s6;
  std::vector<Weight> w1{mk(I, D, 10, s1), mk(I, D, 11, s2)}, w3{mk(I, D, 12, s3), mk(I, D, 13, s4)},
      w2{mk(D, I, 14, s5), mk(D, I, 15, s6)};
  std::vector<uint16_t> x = to_bf16(random_vec(size_t(T * D), 16));
  std::vector<float> rw = random_vec(size_t(T * k), 17);
  std::vector<int32_t> idx{0, 1, 1, 0};
  MoeExpertsArgs a;
  a.w1 = &w1; a.w2 = &w2; a.w3 = &w3;
  a.x = bview(x, {T, D});
  a.route_w = view(rw, {T, k});
  a.route_idx = view(idx, {T, k});
  a.swiglu_limit = 10.0f;
  std::vector<float> plain(size_t(T * D)), fast(size_t(T * D));
  a.out = view(plain, {T, D});
  be.moe_experts(a);
  a.round_bf16 = true;
  a.out = view(fast, {T, D});
  be.moe_experts(a);
  // The same computation by hand with the official BF16 points.
  std::vector<float> want(size_t(T * D), 0.0f);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> acc(size_t(D), 0.0);
    for (int i = 0; i < k; ++i) {
      const int e = idx[size_t(t * k + i)];
      std::vector<float> h(static_cast<size_t>(I));
      for (int64_t c = 0; c < I; ++c) {
        double g = 0, u = 0;
        for (int64_t j = 0; j < D; ++j) {
          const double xv = bf16_to_f32(x[size_t(t * D + j)]);
          g += xv * bf16_to_f32((e ? s2 : s1)[size_t(c * D + j)]);
          u += xv * bf16_to_f32((e ? s4 : s3)[size_t(c * D + j)]);
        }
        const float gf = round_bf16(float(g)), uf = round_bf16(float(u));
        const float gl = std::min(gf, 10.0f), ul = std::clamp(uf, -10.0f, 10.0f);
        const float silu = float(double(gl) / (1.0 + std::exp(-double(gl))));
        h[size_t(c)] = round_bf16(silu * ul * rw[size_t(t * k + i)]);
      }
      for (int64_t o = 0; o < D; ++o) {
        double y = 0;
        for (int64_t c = 0; c < I; ++c) y += double(h[size_t(c)]) * bf16_to_f32((e ? s6 : s5)[size_t(o * I + c)]);
        acc[size_t(o)] += round_bf16(float(y));
      }
    }
    for (int64_t o = 0; o < D; ++o) want[size_t(t * D + o)] = float(acc[size_t(o)]);
  }
  EXPECT_TRUE(same_bits(fast, want));
  EXPECT_FALSE(same_bits(fast, plain));
}

}  // namespace
}  // namespace dil::test
