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

// ---- Fast numerics: the same ops on bf16 activations (backend.h: computed on the widened
// values, each output rounded once to bf16). Inputs are bf16 values; the CPU runs on the same
// bf16 tensors. Bounds (parity.h compare_bf16): exact ops stay bit-identical; the others keep
// their f32 bound above plus one bf16 ulp per element, since both sides round their own f32
// result once (the f32 kernels above measure 0 difference at these shapes, so in practice the
// bf16 outputs are bit-identical too).

TEST_F(CudaParity, Bf16QuantizersAndHadamard) {
  struct Q8 { int64_t R, d; int cols, block; const char* what; };
  for (Q8 c : {Q8{17, 512, 448, 64, "bf16 swa v4 [17,512] c448 b64"}, Q8{1, 512, 512, 32, "bf16 swa v41 [1,512] b32"},
               Q8{129, 4096, 4096, 128, "bf16 act [129,4096] b128"}, Q8{5, 200, 200, 64, "bf16 ragged [5,200] b64"}}) {
    auto f = random_vec(size_t(c.R * c.d), 11 + c.block, 3.0f);
    for (size_t i = 0; i < f.size(); i += 97) f[i] *= 1e-6f;  // tiny blocks hit the 1e-4 floor
    auto x = bf16_of(f), ref = x;
    cpu->fp8_qdq(bview(ref, {c.R, c.d}), c.cols, c.block);
    Tensor g = devb(x, {c.R, c.d});
    gpu->fp8_qdq(g, c.cols, c.block);
    compare_bf16("fp8_qdq", c.what, downb(g), widen(ref), 0, 0);
  }
  struct Q4 { int64_t R, d; int block; bool e4m3; const char* what; };
  for (Q4 c : {Q4{17 * 64, 128, 32, false, "bf16 indexer q [17*64,128] e8m0"},
               Q4{17, 512, 16, true, "bf16 v41 kv [17,512] b16 e4m3"}, Q4{1, 128, 32, false, "bf16 key [1,128]"}}) {
    auto f = random_vec(size_t(c.R * c.d), 21 + c.block, 2.0f);
    for (size_t i = 0; i < f.size(); i += 61) f[i] *= 1e-5f;
    auto x = bf16_of(f), ref = x;
    cpu->fp4_qdq(bview(ref, {c.R, c.d}), c.block, c.e4m3);
    Tensor g = devb(x, {c.R, c.d});
    gpu->fp4_qdq(g, c.block, c.e4m3);
    compare_bf16("fp4_qdq", c.what, downb(g), widen(ref), 0, 0);
  }
  for (int64_t R : {1, 17 * 64}) {
    auto x = bf16_of(random_vec(size_t(R * 128), 31)), ref = x;
    cpu->hadamard(bview(ref, {R, 128}));
    Tensor g = devb(x, {R, 128});
    gpu->hadamard(g);
    compare_bf16("hadamard", "bf16 [" + std::to_string(R) + ",128]", downb(g), widen(ref), 1e-7, 2e-7);
  }
}

TEST_F(CudaParity, Bf16RmsNormAndRope) {
  // xdt / odt: input and output dtypes (V4.1 norms an f32 compressor output into a bf16 latent).
  struct Case { int64_t R, d; float eps; int wkind; DType xdt, odt; const char* what; };
  const DType B = DType::BF16, F = DType::F32;
  for (Case c : {Case{17, 4096, 1e-6f, 2, B, B, "bf16 v4 [17,4096] bf16 w"}, Case{1, 5120, 1e-20f, 2, B, B, "bf16 v41 [1,5120]"},
                 Case{17 * 64, 512, 1e-6f, 0, B, B, "bf16 q heads [17*64,512] no w"},
                 Case{128, 1024, 1e-6f, 1, B, B, "bf16 [128,1024] f32 w"},
                 Case{17, 512, 1e-20f, 2, F, B, "f32->bf16 v41 latent [17,512]"},
                 Case{3, 512, 1e-6f, 2, B, F, "bf16->f32 [3,512]"}}) {
    auto xf = random_vec(size_t(c.R * c.d), 41, 4.0f);
    auto xb = bf16_of(xf);
    if (c.xdt == B) xf = widen(xb);
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
    std::vector<uint16_t> ref_b(xb.size());
    std::vector<float> ref_f(xf.size());
    Tensor hx = c.xdt == B ? bview(xb, {c.R, c.d}) : view(xf, {c.R, c.d});
    Tensor hout = c.odt == B ? bview(ref_b, {c.R, c.d}) : view(ref_f, {c.R, c.d});
    cpu->rms_norm(hx, hw, c.eps, hout);
    Tensor gx = c.xdt == B ? devb(xb, {c.R, c.d}) : devf(xf, {c.R, c.d});
    Tensor go = poisoned(c.odt, {c.R, c.d});
    gpu->rms_norm(gx, gw, c.eps, go);
    if (c.odt == B) compare_bf16("rms_norm", c.what, downb(go), widen(ref_b), 1e-7, 3e-7);
    else compare("rms_norm", c.what, down<float>(go), ref_f, 1e-7, 3e-7);
    if (c.xdt == B && c.odt == B) {  // in place, as the model's per-head norm may run
      gpu->rms_norm(gx, gw, c.eps, gx);
      compare_bf16("rms_norm in place", c.what, downb(gx), widen(ref_b), 1e-7, 3e-7);
    }
  }
  struct RCase { int64_t R, H, d; bool inverse; const char* what; };
  for (RCase c : {RCase{17, 64, 512, false, "bf16 q [17,64,512]"}, RCase{17, 64, 512, true, "bf16 o inverse [17,64,512]"},
                  RCase{1, 1, 512, false, "bf16 kv [1,1,512]"}, RCase{129, 64, 128, false, "bf16 idx q [129,64,128]"}}) {
    auto x = bf16_of(random_vec(size_t(c.R * c.H * c.d), 51));
    auto pos = rnd_int(size_t(c.R), 52, 0, 1 << 20);
    std::vector<float> f(32);
    for (int i = 0; i < 32; ++i) {  // the YaRN table of a ratio > 0 layer (as Rope above)
      double fi = std::pow(160000.0, -2.0 * i / 64);
      double ramp = std::min(1.0, std::max(0.0, (i - 15) / 10.0));
      f[size_t(i)] = float(fi / 16 * ramp + fi * (1 - ramp));
    }
    RopeTable hc{view(f, {32}), 64}, gc{devf(f, {32}), 64};
    auto ref = x;
    cpu->rope(bview(ref, {c.R, c.H, c.d}), view(pos, {c.R}), hc, c.inverse);
    Tensor g = devb(x, {c.R, c.H, c.d});
    gpu->rope(g, devi(pos, {c.R}), gc, c.inverse);
    compare_bf16("rope", c.what, downb(g), widen(ref), 1e-7, 3e-7);
  }
}

TEST_F(CudaParity, Bf16EmbedAddSwiglu) {
  const int64_t V = 4096, D = 4096;
  auto table = rnd_bf16(size_t(V * D), 61);
  Weight hw;
  hw.kind = Weight::Kind::BF16;
  hw.out = V;
  hw.in = D;
  hw.w = Tensor(table.data(), DType::BF16, {V, D});
  Weight gw = gpu->adopt_weight(hw);
  for (int64_t T : {1, 17, 129}) {
    const std::string sh = "T=" + std::to_string(T);
    auto ids = rnd_int(size_t(T), 62, 0, int(V - 1));
    std::vector<uint16_t> ref(size_t(T * D));
    cpu->embed(hw, view(ids, {T}), bview(ref, {T, D}));
    Tensor go = poisoned(DType::BF16, {T, D});
    gpu->embed(gw, devi(ids, {T}), go);
    compare_bf16("embed", "bf16 out [4096,4096] " + sh, downb(go), widen(ref), 0, 0);

    // add with mixed dtypes: the f32 routed sum + the bf16 shared expert -> bf16 (the MoE
    // output), bf16 + bf16 -> bf16, bf16 + f32 -> f32.
    auto af = random_vec(size_t(T * D), 63);
    auto bb = bf16_of(random_vec(size_t(T * D), 64)), ab = bf16_of(af);
    std::vector<uint16_t> s1(size_t(T * D)), s2(size_t(T * D));
    std::vector<float> s3(size_t(T * D));
    cpu->add(view(af, {T, D}), bview(bb, {T, D}), bview(s1, {T, D}));
    cpu->add(bview(ab, {T, D}), bview(bb, {T, D}), bview(s2, {T, D}));
    cpu->add(bview(bb, {T, D}), view(af, {T, D}), view(s3, {T, D}));
    Tensor gaf = devf(af, {T, D}), gab = devb(ab, {T, D}), gbb = devb(bb, {T, D});
    Tensor o1 = poisoned(DType::BF16, {T, D}), o2 = poisoned(DType::BF16, {T, D}), o3 = poisoned(DType::F32, {T, D});
    gpu->add(gaf, gbb, o1);
    gpu->add(gab, gbb, o2);
    gpu->add(gbb, gaf, o3);
    compare_bf16("add f32+bf16->bf16", sh, downb(o1), widen(s1), 0, 0);
    compare_bf16("add bf16+bf16->bf16", sh, downb(o2), widen(s2), 0, 0);
    compare("add bf16+f32->f32", sh, down<float>(o3), s3, 0, 0);
    gpu->add(gab, gbb, gab);  // in place
    compare_bf16("add in place", sh, downb(gab), widen(s2), 0, 0);
  }
  const int64_t T = 17, I = 2048;
  auto g = bf16_of(random_vec(size_t(T * I), 65, 14.0f)), u = bf16_of(random_vec(size_t(T * I), 66, 14.0f));
  auto w = random_vec(size_t(T), 67);
  for (int with_w = 0; with_w < 2; ++with_w) {
    std::vector<uint16_t> ref2(g.size());
    cpu->swiglu(bview(g, {T, I}), bview(u, {T, I}), with_w ? view(w, {T}) : Tensor(), 10.0f, bview(ref2, {T, I}));
    Tensor o = poisoned(DType::BF16, {T, I});
    gpu->swiglu(devb(g, {T, I}), devb(u, {T, I}), with_w ? devf(w, {T}) : Tensor(), 10.0f, o);
    compare_bf16("swiglu", with_w ? "bf16 [17,2048] limit 10, w" : "bf16 [17,2048] limit 10", downb(o), widen(ref2),
                 1e-7, 3e-7);
  }
}

TEST_F(CudaParity, Bf16HyperConnections) {
  // The residual streams X and the sublayer output F in bf16 (fast numerics); pre, post and comb
  // stay f32 and keep their f32 bounds (their inputs are the same bf16 values on both sides).
  const int n = 4;
  for (int64_t D : {4096, 5120}) {
    for (int64_t T : {1, 17}) {
      std::string sh = "bf16 T=" + std::to_string(T) + " D=" + std::to_string(D);
      const int64_t nD = n * D, M = n * (2 + n);
      auto X = bf16_of(random_vec(size_t(T * nD), 71, 2.0f));
      auto fn = random_vec(size_t(M * nD), 72, 0.05f), base = random_vec(size_t(M), 73), scale = random_vec(3, 74, 2.0f);
      float norm_eps = D == 4096 ? 1e-6f : 1e-20f;
      HcArgs ha{view(fn, {M, nD}), view(base, {M}), view(scale, {3}), n, 20, norm_eps, 1e-6f};
      HcArgs ga{devf(fn, {M, nD}), devf(base, {M}), devf(scale, {3}), n, 20, norm_eps, 1e-6f};
      std::vector<float> pre(size_t(T * n)), post(size_t(T * n)), comb(size_t(T * n * n));
      cpu->hc_mix(bview(X, {T, n, D}), ha, view(pre, {T, n}), view(post, {T, n}), view(comb, {T, n, n}));
      Tensor gX = devb(X, {T, n, D});
      Tensor gpre = poisoned(DType::F32, {T, n}), gpost = poisoned(DType::F32, {T, n}),
             gcomb = poisoned(DType::F32, {T, n, n});
      gpu->hc_mix(gX, ga, gpre, gpost, gcomb);
      compare("hc_mix pre", sh, down<float>(gpre), pre, 1e-6, 1e-6);
      compare("hc_mix post", sh, down<float>(gpost), post, 1e-6, 1e-6);
      compare("hc_mix comb (sinkhorn)", sh, down<float>(gcomb), comb, 1e-5, 1e-5);
      std::vector<uint16_t> u(size_t(T * D));
      cpu->hc_collapse(bview(X, {T, n, D}), view(pre, {T, n}), bview(u, {T, D}));
      Tensor gu = poisoned(DType::BF16, {T, D});
      gpu->hc_collapse(gX, devf(pre, {T, n}), gu);
      compare_bf16("hc_collapse", sh, downb(gu), widen(u), 1e-7, 3e-7);
      auto F = bf16_of(random_vec(size_t(T * D), 77));
      std::vector<uint16_t> Xo(X.size());
      cpu->hc_post(bview(F, {T, D}), bview(X, {T, n, D}), view(post, {T, n}), view(comb, {T, n, n}),
                   bview(Xo, {T, n, D}));
      Tensor gXo = poisoned(DType::BF16, {T, n, D});
      gpu->hc_post(devb(F, {T, D}), gX, devf(post, {T, n}), devf(comb, {T, n, n}), gXo);
      compare_bf16("hc_post", sh, downb(gXo), widen(Xo), 1e-7, 3e-7);
      gpu->hc_post(devb(F, {T, D}), gX, devf(post, {T, n}), devf(comb, {T, n, n}), gX);  // in place
      compare_bf16("hc_post in place", sh, downb(gX), widen(Xo), 1e-7, 3e-7);
      std::vector<uint16_t> Xe(X.size());
      cpu->hc_expand(bview(F, {T, D}), n, bview(Xe, {T, n, D}));
      Tensor gXe = poisoned(DType::BF16, {T, n, D});
      gpu->hc_expand(devb(F, {T, D}), n, gXe);
      compare_bf16("hc_expand", sh, downb(gXe), widen(Xe), 0, 0);
    }
  }
}

// Zero-row calls (an idle expert-parallel rank, an empty emit plan) launch nothing and fail
// nothing, in both activation dtypes.
TEST_F(CudaParity, ZeroRowsAreNoOps) {
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor x = poisoned(dt, {0, 512}), y = poisoned(dt, {0, 512});
    gpu->rms_norm(x, Tensor(), 1e-6f, y);
    gpu->add(x, y, y);
    gpu->fp8_qdq(x, 448, 64);
    gpu->fp4_qdq(x, 32, false);
    gpu->hadamard(x);
    gpu->swiglu(x, y, Tensor(), 10.0f, y);
    gpu->synchronize();
  }
  SUCCEED();
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
