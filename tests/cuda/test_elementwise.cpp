// Parity of the token-wise ops: QDQ codecs, Hadamard, RMSNorm, RoPE, embedding, add, SwiGLU,
// mHC, state reset, at V4-Flash / V4.1-Flash widths and awkward row counts.
#include <cmath>

#include "parity.h"

namespace dil::test {
namespace {

TEST_F(CudaParity, Fp8Qdq) {
  struct Case { int64_t R, d; int cols, block; const char* what; };
  // SWA rows (V4: 448 nope dims, blocks of 64; V4.1: all 512, blocks of 32), act quant 128.
  for (Case c : {Case{17, 512, 448, 64, "swa v4 [17,512] c448 b64"}, Case{1, 512, 512, 32, "swa v41 [1,512] b32"},
                 Case{17, 4096, 4096, 128, "act [17,4096] b128"}, Case{5, 200, 200, 64, "ragged [5,200] b64"}}) {
    auto x = random_vec(size_t(c.R * c.d), 11 + c.block, 3.0f);
    for (size_t i = 0; i < x.size(); i += 97) x[i] *= 1e-6f;  // tiny blocks hit the 1e-4 floor
    auto ref = x;
    cpu->fp8_qdq(view(ref, {c.R, c.d}), c.cols, c.block);
    Tensor g = devf(x, {c.R, c.d});
    gpu->fp8_qdq(g, c.cols, c.block);
    compare("fp8_qdq", c.what, down<float>(g), ref, 0, 0);
  }
}

TEST_F(CudaParity, Fp4Qdq) {
  struct Case { int64_t R, d; int block; bool e4m3; const char* what; };
  for (Case c : {Case{17 * 64, 128, 32, false, "indexer q [17*64,128] b32 e8m0"},
                 Case{17, 512, 16, true, "v41 kv [17,512] b16 e4m3"}, Case{1, 128, 32, false, "key [1,128] b32"}}) {
    auto x = random_vec(size_t(c.R * c.d), 21 + c.block, 2.0f);
    for (size_t i = 0; i < x.size(); i += 61) x[i] *= 1e-5f;
    auto ref = x;
    cpu->fp4_qdq(view(ref, {c.R, c.d}), c.block, c.e4m3);
    Tensor g = devf(x, {c.R, c.d});
    gpu->fp4_qdq(g, c.block, c.e4m3);
    compare("fp4_qdq", c.what, down<float>(g), ref, 0, 0);
  }
}

TEST_F(CudaParity, Hadamard) {
  for (int64_t R : {1, 17 * 64}) {
    auto x = random_vec(size_t(R * 128), 31);
    auto ref = x;
    cpu->hadamard(view(ref, {R, 128}));
    Tensor g = devf(x, {R, 128});
    gpu->hadamard(g);
    compare("hadamard", "[" + std::to_string(R) + ",128]", down<float>(g), ref, 1e-7, 2e-7);
  }
}

TEST_F(CudaParity, RmsNorm) {
  struct Case { int64_t R, d; float eps; int wkind; const char* what; };  // wkind 0 none, 1 f32, 2 bf16
  for (Case c : {Case{17, 4096, 1e-6f, 2, "v4 [17,4096] bf16 w"}, Case{1, 5120, 1e-20f, 2, "v41 [1,5120] eps 1e-20"},
                 Case{17 * 64, 512, 1e-6f, 0, "q heads [17*64,512] no w"}, Case{3, 1024, 1e-6f, 1, "[3,1024] f32 w"}}) {
    auto x = random_vec(size_t(c.R * c.d), 41, 4.0f);
    auto wf = random_vec(size_t(c.d), 42, 2.0f);
    auto wb = rnd_bf16(size_t(c.d), 43, 2.0f);
    Tensor hw, gw;
    if (c.wkind == 1) {
      hw = view(wf, {c.d});
      gw = devf(wf, {c.d});
    } else if (c.wkind == 2) {
      hw = Tensor(wb.data(), DType::BF16, {c.d});
      gw = dev(wb, DType::BF16, {c.d});
    }
    std::vector<float> ref(x.size());
    cpu->rms_norm(view(x, {c.R, c.d}), hw, c.eps, view(ref, {c.R, c.d}));
    Tensor gx = devf(x, {c.R, c.d}), go = poisoned(DType::F32, {c.R, c.d});
    gpu->rms_norm(gx, gw, c.eps, go);
    compare("rms_norm", c.what, down<float>(go), ref, 1e-7, 3e-7);
  }
}

// YaRN-corrected table of a ratio>0 layer (model-spec §3.1), f32.
std::vector<float> yarn_table(int rd, double base) {
  std::vector<float> f(size_t(rd / 2));
  for (int i = 0; i < rd / 2; ++i) {
    double fi = std::pow(base, -2.0 * i / rd);
    double ramp = std::min(1.0, std::max(0.0, (i - 15) / 10.0));
    f[i] = float(fi / 16 * ramp + fi * (1 - ramp));
  }
  return f;
}

TEST_F(CudaParity, Rope) {
  struct Case { int64_t R, H, d; bool inverse; const char* what; };
  for (Case c : {Case{17, 64, 512, false, "q [17,64,512]"}, Case{17, 64, 512, true, "o inverse [17,64,512]"},
                 Case{1, 1, 512, false, "kv [1,1,512]"}, Case{17, 64, 128, false, "idx q [17,64,128]"}}) {
    auto x = random_vec(size_t(c.R * c.H * c.d), 51);
    auto pos = rnd_int(size_t(c.R), 52, 0, 1 << 20);
    auto f = yarn_table(64, 160000.0);
    RopeTable hc{view(f, {32}), 64}, gc{devf(f, {32}), 64};
    auto ref = x;
    cpu->rope(view(ref, {c.R, c.H, c.d}), view(pos, {c.R}), hc, c.inverse);
    Tensor g = devf(x, {c.R, c.H, c.d});
    gpu->rope(g, devi(pos, {c.R}), gc, c.inverse);
    compare("rope", c.what, down<float>(g), ref, 1e-7, 3e-7);
  }
}

TEST_F(CudaParity, EmbedAddSwiglu) {
  const int64_t V = 4096, D = 4096, T = 17;
  auto table = rnd_bf16(size_t(V * D), 61);
  Weight hw;
  hw.kind = Weight::Kind::BF16;
  hw.out = V;
  hw.in = D;
  hw.w = Tensor(table.data(), DType::BF16, {V, D});
  Weight gw = gpu->adopt_weight(hw);
  auto ids = rnd_int(size_t(T), 62, 0, int(V - 1));
  std::vector<float> ref(size_t(T * D));
  cpu->embed(hw, view(ids, {T}), view(ref, {T, D}));
  Tensor go = poisoned(DType::F32, {T, D});
  gpu->embed(gw, devi(ids, {T}), go);
  compare("embed", "bf16 [4096,4096] T=17", down<float>(go), ref, 0, 0);

  auto a = random_vec(size_t(T * D), 63), b = random_vec(size_t(T * D), 64);
  std::vector<float> sum(a.size());
  cpu->add(view(a, {T, D}), view(b, {T, D}), view(sum, {T, D}));
  Tensor gs = poisoned(DType::F32, {T, D});
  gpu->add(devf(a, {T, D}), devf(b, {T, D}), gs);
  compare("add", "[17,4096]", down<float>(gs), sum, 0, 0);

  const int64_t I = 2048;
  auto g = random_vec(size_t(T * I), 65, 14.0f), u = random_vec(size_t(T * I), 66, 14.0f), w = random_vec(size_t(T), 67);
  for (int with_w = 0; with_w < 2; ++with_w) {
    std::vector<float> ref2(g.size());
    cpu->swiglu(view(g, {T, I}), view(u, {T, I}), with_w ? view(w, {T}) : Tensor(), 10.0f,
                view(ref2, {T, I}));
    Tensor o = poisoned(DType::F32, {T, I});
    gpu->swiglu(devf(g, {T, I}), devf(u, {T, I}), with_w ? devf(w, {T}) : Tensor(), 10.0f, o);
    compare("swiglu", with_w ? "[17,2048] limit 10, w" : "[17,2048] limit 10", down<float>(o), ref2, 1e-7, 3e-7);
  }
}

TEST_F(CudaParity, HyperConnections) {
  const int n = 4;
  for (int64_t D : {4096, 5120}) {
    for (int64_t T : {1, 17}) {
      std::string sh = "T=" + std::to_string(T) + " D=" + std::to_string(D);
      const int64_t nD = n * D, M = n * (2 + n);
      auto X = random_vec(size_t(T * nD), 71, 2.0f);
      auto fn = random_vec(size_t(M * nD), 72, 0.05f), base = random_vec(size_t(M), 73), scale = random_vec(3, 74, 2.0f);
      auto hfn = random_vec(size_t(n * nD), 75, 0.05f), hbase = random_vec(size_t(n), 76);
      float norm_eps = D == 4096 ? 1e-6f : 1e-20f;
      HcArgs ha{view(fn, {M, nD}), view(base, {M}), view(scale, {3}), n, 20, norm_eps, 1e-6f};
      HcArgs ga{devf(fn, {M, nD}), devf(base, {M}), devf(scale, {3}), n, 20, norm_eps, 1e-6f};
      std::vector<float> pre(size_t(T * n)), post(size_t(T * n)), comb(size_t(T * n * n));
      cpu->hc_mix(view(X, {T, n, D}), ha, view(pre, {T, n}), view(post, {T, n}),
                  view(comb, {T, n, n}));
      Tensor gX = devf(X, {T, n, D});
      Tensor gpre = poisoned(DType::F32, {T, n}), gpost = poisoned(DType::F32, {T, n}),
             gcomb = poisoned(DType::F32, {T, n, n});
      gpu->hc_mix(gX, ga, gpre, gpost, gcomb);
      compare("hc_mix pre", sh, down<float>(gpre), pre, 1e-6, 1e-6);
      compare("hc_mix post", sh, down<float>(gpost), post, 1e-6, 1e-6);
      compare("hc_mix comb (sinkhorn)", sh, down<float>(gcomb), comb, 1e-5, 1e-5);
      // Head variant: n rows, pre only.
      HcArgs hh{view(hfn, {n, nD}), view(hbase, {n}), view(scale, {1}), n, 20, norm_eps, 1e-6f};
      HcArgs gh{devf(hfn, {n, nD}), devf(hbase, {n}), devf(scale, {1}), n, 20, norm_eps, 1e-6f};
      std::vector<float> hpre(size_t(T * n));
      cpu->hc_mix(view(X, {T, n, D}), hh, view(hpre, {T, n}), Tensor(), Tensor());
      Tensor ghpre = poisoned(DType::F32, {T, n});
      gpu->hc_mix(gX, gh, ghpre, Tensor(), Tensor());
      compare("hc_mix head pre", sh, down<float>(ghpre), hpre, 1e-6, 1e-6);
      // collapse / post / expand on the CPU's mixes (so each op is checked on its own).
      std::vector<float> u(size_t(T * D));
      cpu->hc_collapse(view(X, {T, n, D}), view(pre, {T, n}), view(u, {T, D}));
      Tensor gu = poisoned(DType::F32, {T, D});
      gpu->hc_collapse(gX, devf(pre, {T, n}), gu);
      compare("hc_collapse", sh, down<float>(gu), u, 1e-7, 3e-7);
      auto F = random_vec(size_t(T * D), 77);
      std::vector<float> Xo(X.size());
      cpu->hc_post(view(F, {T, D}), view(X, {T, n, D}), view(post, {T, n}),
                   view(comb, {T, n, n}), view(Xo, {T, n, D}));
      Tensor gXo = poisoned(DType::F32, {T, n, D});
      gpu->hc_post(devf(F, {T, D}), gX, devf(post, {T, n}), devf(comb, {T, n, n}), gXo);
      compare("hc_post", sh, down<float>(gXo), Xo, 1e-7, 3e-7);
      // In place (out aliases X), as the model calls it.
      gpu->hc_post(devf(F, {T, D}), gX, devf(post, {T, n}), devf(comb, {T, n, n}), gX);
      compare("hc_post in place", sh, down<float>(gX), Xo, 1e-7, 3e-7);
      std::vector<float> Xe(X.size());
      cpu->hc_expand(view(F, {T, D}), n, view(Xe, {T, n, D}));
      Tensor gXe = poisoned(DType::F32, {T, n, D});
      gpu->hc_expand(devf(F, {T, D}), n, gXe);
      compare("hc_expand", sh, down<float>(gXe), Xe, 0, 0);
    }
  }
}

TEST_F(CudaParity, ResetState) {
  const int64_t S = 5, rows = 8, C = 1024;
  auto kv = random_vec(size_t(S * rows * C), 81), sc = random_vec(size_t(S * rows * C), 82);
  std::vector<int32_t> slots = {3, 0};
  Tensor gkv = devf(kv, {S, rows, C}), gsc = devf(sc, {S, rows, C});
  cpu->reset_state(view(kv, {S, rows, C}), view(sc, {S, rows, C}), slots);
  gpu->reset_state(gkv, gsc, slots);
  compare("reset_state kv", "[5,8,1024] slots {3,0}", down<float>(gkv), kv, 0, 0);
  compare("reset_state score", "[5,8,1024] slots {3,0}", down<float>(gsc), sc, 0, 0);
}

}  // namespace
}  // namespace dil::test

namespace dil::test {
namespace {

// Device-event timing: marks do not wait for the stream, elapsed_ms waits for the later mark
// and measures the work between the marks (a 1 GiB fill takes well over a microsecond).
TEST_F(CudaParity, EventTiming) {
  const int64_t n = int64_t(1) << 28;  // 1 GiB of f32
  Tensor big = poisoned(DType::F32, {n});
  int a = gpu->record_event();
  gpu->fill(big, 1.5f);
  int b = gpu->record_event();
  gpu->fill(big, 2.5f);
  gpu->fill(big, 3.5f);
  int c = gpu->record_event();
  double one = gpu->elapsed_ms(a, b), two = gpu->elapsed_ms(b, c);
  std::printf("EVENTS | 1 GiB fill %.3f ms, two fills %.3f ms\n", one, two);
  EXPECT_GT(one, 0.01);
  EXPECT_GT(two, one);
  EXPECT_LT(one, 1000.0);
  gpu->clear_events();
  EXPECT_EQ(gpu->record_event(), 0);
  std::vector<float> probe(4);
  gpu->download(probe.data(), big.rows(n - 4, n));
  EXPECT_EQ(probe[3], 3.5f);
}

}  // namespace
}  // namespace dil::test
