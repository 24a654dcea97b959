// Timings of the decode-sized GEMV paths (`gemv` of linear and moe_experts, fast numerics)
// beside the implementation the plan chose before them, in the same run (not tests: DISABLED_
// unless asked for with --gtest_also_run_disabled_tests; scripts/gpu-check runs them). GB/s
// counts the weight bytes (codes + scales) one call must read; every call reads weights that
// are not in L2: linear cycles through enough device copies of its weight to pass 512 MB, the
// MoE holds a distinct copy per expert. Device events around a loop of calls.
#include <algorithm>
#include <functional>
#include <numeric>

#include "parity.h"

namespace dil::test {
namespace {

class CudaBenchGemv : public CudaParity {
 protected:
  static void report(const std::string& op, const std::string& shape, double ms, double bytes) {
    std::printf("BENCH | %-26s | %-34s | %9.4f ms | %8.1f GB/s (weights)\n", op.c_str(), shape.c_str(), ms,
                bytes / ms * 1e-6);
    std::fflush(stdout);
  }
  // A fast-numerics CUDA backend, optionally with one family forced to `impl`.
  static std::unique_ptr<Backend> backend(const std::string& op, const std::string& impl) {
    BackendOptions o = test_options();
    if (!impl.empty()) o.force[op] = impl;
    auto be = make_backend(BackendKind::CUDA, 0, o);
    be->set_numerics(Numerics::Fast);
    return be;
  }
};

TEST_F(CudaBenchGemv, DISABLED_Linear) {
  struct C {
    Weight::Kind k;
    int64_t out, in;
    int block, act;
    int64_t T;
    DType odt;
    const char* old;  // the implementation of the plan before gemv
    const char* what;
  };
  using K = Weight::Kind;
  const DType B = DType::BF16, F = DType::F32;
  for (const C& c : {C{K::FP8, 1024, 4096, 128, 128, 1, B, "cublaslt_fp8", "v4 wq_a fp8 T=1"},
                     C{K::FP8, 1024, 4096, 128, 128, 8, B, "cublaslt_fp8", "v4 wq_a fp8 T=8"},
                     C{K::FP8, 4096, 8192, 128, 128, 1, B, "cublaslt_fp8", "v4 wo_b fp8 T=1"},
                     C{K::FP8, 32768, 1024, 128, 128, 1, B, "cublaslt_fp8", "v4 wq_b fp8 T=1"},
                     C{K::FP8, 32768, 1024, 128, 128, 4, B, "cublaslt_fp8", "v4 wq_b fp8 T=4"},
                     C{K::FP8, 1280, 5120, 32, 32, 1, B, "simt", "v41 wq_a fp8-32 T=1"},
                     C{K::FP8, 1280, 5120, 32, 32, 8, B, "simt", "v41 wq_a fp8-32 T=8"},
                     C{K::FP8, 5120, 2304, 32, 32, 2, B, "simt", "v41 shared w2 fp8-32 T=2"},
                     C{K::FP4, 2048, 4096, 32, 128, 1, B, "simt", "expert w1 fp4 T=1"},
                     C{K::FP4, 2048, 4096, 32, 128, 4, B, "simt", "expert w1 fp4 T=4"},
                     C{K::BF16, 1024, 4096, 0, 0, 1, F, "cublaslt_bf16", "compressor bf16->f32 T=1"},
                     C{K::BF16, 129280, 4096, 0, 0, 1, F, "cublaslt_bf16", "head bf16->f32 T=1"},
                     C{K::BF16, 129280, 4096, 0, 0, 8, F, "cublaslt_bf16", "head bf16->f32 T=8"}}) {
    HostWeight hw = make_weight(c.k, c.out, c.in, c.block, 1500);
    const double wbytes = double(hw.w.size() + hw.scale.size());
    const int copies = int(std::clamp<double>(std::ceil(512e6 / wbytes), 1, 256));
    auto fast = backend("linear", ""), stream = backend("linear", "gemv_stream"), old = backend("linear", c.old);
    std::vector<Weight> ws;
    for (int i = 0; i < copies; ++i) ws.push_back(fast->adopt_weight(hw.wt));
    auto xh = bf16_of(random_vec(size_t(c.T * c.in), 1501, 3.0f));
    Buffer xb = fast->alloc(xh.size() * 2), ob = fast->alloc(size_t(c.T * c.out) * 4);
    Tensor x(xb.data(), DType::BF16, {c.T, c.in}, Device::CUDA), o(ob.data(), c.odt, {c.T, c.out}, Device::CUDA);
    fast->upload(x, xh.data());
    const int reps = std::max(copies, 20);
    for (Backend* be : {fast.get(), stream.get(), old.get()}) {
      const std::string impl = be->impl_for(linear_site(ws[0], c.act, DType::BF16, c.odt, Numerics::Fast), c.T).name;
      const double ms = event_ms_per_call(*be, [&](int i) { be->linear(x, ws[size_t(i % copies)], c.act, o); }, reps);
      report("linear " + impl, c.what, ms, wbytes);
    }
  }
}

// Routed experts at decode sizes: V4 (E 256, D 4096, I 2048, act 128) and V4.1 (E 384, D 5120,
// I 2304, act 32), top-6, T = 1, 8, 64 tokens routed uniformly at random; gemv against the
// tensor-core tiles (mma_bf16) on the same weights. Bytes: the distinct routed experts' w1, w2, w3.
TEST_F(CudaBenchGemv, DISABLED_MoeDecode) {
  struct M {
    int64_t D, I, E;
    int act;
    const char* what;
  };
  for (const M& m : {M{4096, 2048, 256, 128, "v4"}, M{5120, 2304, 384, 32, "v41"}}) {
    const int k = 6, sets = 8;
    auto fast = backend("moe_experts", ""), old = backend("moe_experts", "mma_bf16");
    std::vector<HostWeight> s1, s2, s3;
    for (int i = 0; i < sets; ++i) {
      s1.push_back(make_weight(Weight::Kind::FP4, m.I, m.D, 32, 1510 + 3 * i));
      s2.push_back(make_weight(Weight::Kind::FP4, m.D, m.I, 32, 1511 + 3 * i));
      s3.push_back(make_weight(Weight::Kind::FP4, m.I, m.D, 32, 1512 + 3 * i));
    }
    std::vector<Weight> g1, g2, g3;  // a distinct device copy per expert
    for (int64_t e = 0; e < m.E; ++e) {
      g1.push_back(fast->adopt_weight(s1[size_t(e % sets)].wt));
      g2.push_back(fast->adopt_weight(s2[size_t(e % sets)].wt));
      g3.push_back(fast->adopt_weight(s3[size_t(e % sets)].wt));
    }
    const double per_expert = 3.0 * double(m.D * m.I / 2 + m.D * m.I / 32);
    for (int64_t T : {1, 8, 64}) {
      // kVariants routings, one per call in turn, so that repeated calls do not find the same
      // experts in L2; bytes: their mean count of distinct experts.
      constexpr int kVariants = 8;
      std::mt19937 rng(1520 + uint32_t(T));
      std::vector<std::vector<int32_t>> idx(kVariants, std::vector<int32_t>(size_t(T * k)));
      std::vector<int32_t> all(static_cast<size_t>(m.E));
      double bytes = 0;
      for (auto& v : idx) {
        for (int64_t t = 0; t < T; ++t) {
          std::iota(all.begin(), all.end(), 0);
          std::shuffle(all.begin(), all.end(), rng);
          std::copy_n(all.begin(), k, v.begin() + t * k);
        }
        std::vector<int32_t> distinct(v);
        std::sort(distinct.begin(), distinct.end());
        bytes += per_expert * double(std::unique(distinct.begin(), distinct.end()) - distinct.begin()) / kVariants;
      }
      auto xh = bf16_of(random_vec(size_t(T * m.D), 1530, 2.0f));
      auto rw = random_vec(size_t(T * k), 1531, 1.0f);
      Buffer xb = fast->alloc(xh.size() * 2), wb = fast->alloc(rw.size() * 4),
             ib = fast->alloc(size_t(kVariants * T * k) * 4), ob = fast->alloc(size_t(T * m.D) * 4);
      std::vector<Tensor> idx_dev;  // [T, k] i32 per variant
      for (int v = 0; v < kVariants; ++v) {
        idx_dev.emplace_back(static_cast<int32_t*>(ib.data()) + v * T * k, DType::I32,
                             std::initializer_list<int64_t>{T, int64_t(k)}, Device::CUDA);
        fast->upload(idx_dev.back(), idx[size_t(v)].data());
      }
      MoeExpertsArgs a;
      a.x = Tensor(xb.data(), DType::BF16, {T, m.D}, Device::CUDA);
      a.route_w = Tensor(wb.data(), DType::F32, {T, k}, Device::CUDA);
      a.out = Tensor(ob.data(), DType::F32, {T, m.D}, Device::CUDA);
      fast->upload(a.x, xh.data());
      fast->upload(a.route_w, rw.data());
      a.w1 = &g1;
      a.w2 = &g2;
      a.w3 = &g3;
      a.act_block = m.act;
      a.round_bf16 = true;
      for (Backend* be : {fast.get(), old.get()}) {
        const std::string impl =
            be->impl_for(moe_experts_site(g1[0], m.act, DType::BF16, DType::F32, Numerics::Fast), T).name;
        const double ms = event_ms_per_call(*be, [&](int i) {
          a.route_idx = idx_dev[size_t(i % kVariants)];
          be->moe_experts(a);
        }, 24);
        report("moe_experts " + impl, std::string(m.what) + " E" + std::to_string(m.E) + " k6 T=" + std::to_string(T),
               ms, bytes);
      }
    }
  }
}

}  // namespace
}  // namespace dil::test
