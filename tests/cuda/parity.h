// Helpers of the CPU-vs-CUDA parity tests: a fixture holding both backends (skipping when no
// GPU is visible), seeded random host data (never zeros), device copies, NaN-poisoned
// outputs, and an element-by-element comparison that prints one PARITY line per check
// (scripts/gpu-check collects them into its summary table).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "kernels/cuda/cuda_backend.h"
#include "test_util.h"  // tests/kernels: view, random_vec, SeqSpec, make_meta

namespace dil::test {

// Backend options of the CUDA test binaries, from the test environment (never read by the
// backends): DIL_TEST_KERNELS="op=impl,..." forces implementations (scripts/gpu-check runs the
// exact SIMT GEMMs with linear=simt,grouped_linear=simt,moe_experts=simt), DIL_TEST_LT_LAYOUT="ab"
// probes cuBLASLt's FP8 scale layouts.
inline BackendOptions test_options() {
  BackendOptions o;
  if (const char* k = std::getenv("DIL_TEST_KERNELS")) parse_kernel_overrides(k, &o);
  if (const char* l = std::getenv("DIL_TEST_LT_LAYOUT")) o.lt_fp8_layout = l;
  return o;
}
inline bool forced(const char* op) { return test_options().force.count(op) > 0; }

inline std::vector<int32_t> rnd_int(size_t n, uint32_t seed, int lo, int hi) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> u(lo, hi);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// Random checkpoint bytes: FP8 e4m3 codes without the NaN codes, E8M0 scales near 2^0.
inline std::vector<uint8_t> rnd_fp8(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) {
    do b = uint8_t(rng()); while ((b & 0x7f) == 0x7f);
  }
  return v;
}
inline std::vector<uint8_t> rnd_e8m0(size_t n, uint32_t seed, int lo = 117, int hi = 127) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> u(lo, hi);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = uint8_t(u(rng));
  return v;
}
// Fast numerics round every routed expert's output y to bf16, so a token with exactly one routed
// slot (idx [T, k], experts [0, E)) has a bf16-exact output row (out [T, D]): the count of its
// outputs that are not, over all such tokens (*one: how many tokens had one slot).
inline size_t moe_one_slot_not_bf16(const std::vector<int32_t>& idx, int k, int64_t E, const std::vector<float>& out,
                                    int64_t D, size_t* one) {
  size_t bad = 0;
  *one = 0;
  for (size_t j = 0; j < idx.size() / size_t(k); ++j) {
    int routed = 0;
    for (int slot = 0; slot < k; ++slot) routed += idx[j * k + slot] >= 0 && idx[j * k + slot] < E;
    if (routed != 1) continue;
    ++*one;
    for (int64_t n = 0; n < D; ++n) bad += round_bf16(out[j * D + n]) != out[j * D + n];
  }
  return bad;
}
inline std::vector<uint8_t> rnd_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = uint8_t(rng());
  return v;
}
inline std::vector<uint16_t> rnd_bf16(size_t n, uint32_t seed, float a = 1.0f) {
  auto f = random_vec(n, seed, a);
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = f32_to_bf16(f[i]);
  return v;
}

// A checkpoint weight in host memory (storage kept alive by the struct).
struct HostWeight {
  std::vector<uint8_t> w, scale;
  Weight wt;
};
inline HostWeight make_weight(Weight::Kind kind, int64_t out, int64_t in, int block, uint32_t seed) {
  HostWeight h;
  Weight& w = h.wt;
  w.kind = kind;
  w.out = out;
  w.in = in;
  switch (kind) {
    case Weight::Kind::F32: {
      auto f = random_vec(size_t(out * in), seed, 0.5f);
      h.w.resize(f.size() * 4);
      std::memcpy(h.w.data(), f.data(), h.w.size());
      w.w = Tensor(h.w.data(), DType::F32, {out, in});
      break;
    }
    case Weight::Kind::BF16: {
      auto b = rnd_bf16(size_t(out * in), seed, 0.5f);
      h.w.resize(b.size() * 2);
      std::memcpy(h.w.data(), b.data(), h.w.size());
      w.w = Tensor(h.w.data(), DType::BF16, {out, in});
      break;
    }
    case Weight::Kind::FP8: {
      h.w = rnd_fp8(size_t(out * in), seed);
      int64_t so = (out + block - 1) / block, si = (in + block - 1) / block;
      h.scale = rnd_e8m0(size_t(so * si), seed + 1);
      w.w = Tensor(h.w.data(), DType::F8E4M3, {out, in});
      w.scale = Tensor(h.scale.data(), DType::E8M0, {so, si});
      w.block_out = w.block_in = block;
      break;
    }
    case Weight::Kind::FP4: {
      h.w = rnd_bytes(size_t(out * in / 2), seed);
      h.scale = rnd_e8m0(size_t(out * (in / 32)), seed + 1, 120, 124);
      w.w = Tensor(h.w.data(), DType::I8, {out, in / 2});
      w.scale = Tensor(h.scale.data(), DType::E8M0, {out, in / 32});
      w.block_out = 1;
      w.block_in = 32;
      break;
    }
  }
  return h;
}

// Host bf16 data: v rounded to bf16 (RNE), and bf16 values widened to f32 (exact).
inline std::vector<uint16_t> bf16_of(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = f32_to_bf16(v[i]);
  return o;
}
inline std::vector<float> widen(const std::vector<uint16_t>& v) {
  std::vector<float> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = bf16_to_f32(v[i]);
  return o;
}
inline Tensor bview(std::vector<uint16_t>& v, std::initializer_list<int64_t> dims) {
  return Tensor(v.data(), DType::BF16, dims);
}

struct Stats {
  double max_abs = 0, rel_l2 = 0, max_ref = 0;
  size_t bad = 0;  // non-finite outputs or elements over the per-element bound
};

class CudaParity : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    cpu = make_backend(BackendKind::CPU);
    gpu = make_backend(BackendKind::CUDA, 0, test_options());
  }

  // Milliseconds per call of fn(i) (i = call number) between two events on `be`'s stream, over
  // `reps` back-to-back calls after 3 warm-ups (the benches of single kernels: no host gaps).
  static double event_ms_per_call(Backend& be, const std::function<void(int)>& fn, int reps) {
    for (int i = 0; i < 3; ++i) fn(i);
    be.synchronize();
    const int a = be.record_event();
    for (int i = 0; i < reps; ++i) fn(i);
    const int b = be.record_event();
    const double ms = be.elapsed_ms(a, b) / reps;
    be.clear_events();
    return ms;
  }
  // Median wall-clock milliseconds of fn over `reps` runs after 2 warm-ups, waiting for `be`:
  // the backend whose stream fn's ops run on (a backend made with forced kernels has its own).
  static double median_wall_ms(Backend& be, const std::function<void()>& fn, int reps = 10) {
    fn();
    fn();
    be.synchronize();
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      fn();
      be.synchronize();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }

  // Device copy of host data (kept alive by the fixture).
  template <typename T>
  Tensor dev(const std::vector<T>& h, DType dt, std::initializer_list<int64_t> dims) {
    Tensor t(nullptr, dt, dims, Device::CUDA);
    bufs.push_back(gpu->alloc(t.nbytes() ? t.nbytes() : 1));
    t.data = bufs.back().data();
    if (t.nbytes()) gpu->upload(t, h.data());
    return t;
  }
  Tensor devf(const std::vector<float>& h, std::initializer_list<int64_t> dims) { return dev(h, DType::F32, dims); }
  Tensor devi(const std::vector<int32_t>& h, std::initializer_list<int64_t> dims) { return dev(h, DType::I32, dims); }
  // A device output filled with NaN (i32 outputs get the NaN bit pattern, an invalid index;
  // bf16 outputs the bf16 NaN 0x7fc0).
  Tensor poisoned(DType dt, std::initializer_list<int64_t> dims) {
    Tensor t(nullptr, dt, dims, Device::CUDA);
    bufs.push_back(gpu->alloc(t.nbytes() ? t.nbytes() : 4));
    t.data = bufs.back().data();
    if (t.numel() == 0) return t;
    if (dt == DType::BF16) {
      gpu->upload(t, std::vector<uint16_t>(size_t(t.numel()), 0x7fc0).data());
      return t;
    }
    Tensor f = t;
    f.dtype = DType::F32;
    gpu->fill(f, NAN);
    return t;
  }
  // bf16 activations (fast numerics): device copies of host bf16 data, and bf16 outputs
  // downloaded widened to f32 (exact).
  Tensor devb(const std::vector<uint16_t>& h, std::initializer_list<int64_t> dims) { return dev(h, DType::BF16, dims); }
  std::vector<float> downb(const Tensor& t) { return widen(down<uint16_t>(t)); }
  template <typename T>
  std::vector<T> down(const Tensor& t) {
    std::vector<T> h(size_t(t.numel()));
    if (!h.empty()) gpu->download(h.data(), t);
    return h;
  }
  // StepMeta with device copies of the host fields.
  void upload_meta(StepMeta& m) {
    m.q_start = devi(m.h_q_start, {int64_t(m.h_q_start.size())});
    m.len = devi(m.h_len, {int64_t(m.h_len.size())});
    m.start_pos = devi(m.h_start_pos, {int64_t(m.h_start_pos.size())});
    m.slot = devi(m.h_slot, {int64_t(m.h_slot.size())});
    m.tok_pos = devi(m.h_tok_pos, {int64_t(m.h_tok_pos.size())});
    m.tok_seq = devi(m.h_tok_seq, {int64_t(m.h_tok_seq.size())});
    if (!m.h_block_table.empty()) m.block_table = devi(m.h_block_table, {int64_t(m.h_block_table.size())});
  }
  Weight dev_weight(const HostWeight& h) { return gpu->adopt_weight(h.wt); }

  // Compares every element; `rel_tol` bounds ||gpu-cpu|| / ||cpu||, `abs_tol` each element's
  // |gpu-cpu| relative to max|cpu| (0, 0: bit-identical required).
  Stats compare(const std::string& op, const std::string& shape, const std::vector<float>& got,
                const std::vector<float>& ref, double rel_tol, double abs_tol) {
    Stats s;
    EXPECT_EQ(got.size(), ref.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size() && i < got.size(); ++i) s.max_ref = std::max(s.max_ref, std::fabs(double(ref[i])));
    for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
      double d = double(got[i]) - double(ref[i]);
      bool exact = std::memcmp(&got[i], &ref[i], 4) == 0;
      if (!std::isfinite(got[i]) && !exact) {
        ++s.bad;
        continue;
      }
      if (exact) d = 0;
      s.max_abs = std::max(s.max_abs, std::fabs(d));
      if (std::fabs(d) > abs_tol * std::max(1.0, s.max_ref)) ++s.bad;
      num += d * d;
      den += double(ref[i]) * ref[i];
    }
    s.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    std::printf("PARITY | %-22s | %-34s | max_abs %.3e | rel_l2 %.3e | tol rel %.0e abs %.0e | %s\n", op.c_str(),
                shape.c_str(), s.max_abs, s.rel_l2, rel_tol, abs_tol,
                (s.bad == 0 && s.rel_l2 <= rel_tol) ? "ok" : "FAIL");
    std::fflush(stdout);
    EXPECT_EQ(s.bad, 0u) << op << " " << shape << ": elements non-finite or over the bound";
    EXPECT_LE(s.rel_l2, rel_tol) << op << " " << shape;
    return s;
  }
  // bf16 outputs (fast numerics), each side rounded once (RNE) from its own f32 result; rel_tol
  // and abs_tol bound those f32 results as compare() does ((0, 0): bit-identical required).
  // Rounding keeps each within half a bf16 ulp of its f32 value, so per element
  //   |got - ref| <= abs_tol * max(1, max|ref|) + ulp_bf16(max(|got|, |ref|)),
  // one bf16 ulp (2^-7 relative at most) more than the f32 bound. In L2: the outputs differ
  // only where a rounding midpoint lies between the two f32 results, i.e. (their position within
  // an ulp being uniform) with probability |d_i| / ulp_i, by one ulp: E||got - ref||^2 =
  // sum |d_i| ulp_i <= ||d|| ||ulp||, so E rel_l2 <= sqrt(rel_tol * 2^-7); the check allows
  // rel_tol + 2 sqrt(rel_tol * 2^-7). got / ref: the bf16 values widened to f32.
  Stats compare_bf16(const std::string& op, const std::string& shape, const std::vector<float>& got,
                     const std::vector<float>& ref, double rel_tol, double abs_tol) {
    Stats s;
    EXPECT_EQ(got.size(), ref.size());
    const bool exact = rel_tol == 0 && abs_tol == 0;
    const double l2_tol = exact ? 0.0 : rel_tol + 2.0 * std::sqrt(rel_tol * 0x1p-7);
    double num = 0, den = 0;
    size_t differ = 0;
    for (size_t i = 0; i < ref.size() && i < got.size(); ++i) s.max_ref = std::max(s.max_ref, std::fabs(double(ref[i])));
    for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
      const bool same = std::memcmp(&got[i], &ref[i], 4) == 0;
      if (!same) ++differ;
      if (!std::isfinite(got[i]) && !same) {
        ++s.bad;
        continue;
      }
      const double d = same ? 0.0 : double(got[i]) - double(ref[i]);
      s.max_abs = std::max(s.max_abs, std::fabs(d));
      const double allowed =
          exact ? 0.0 : abs_tol * std::max(1.0, s.max_ref) + ulp_bf16(std::max(std::fabs(got[i]), std::fabs(ref[i])));
      if (std::fabs(d) > allowed) ++s.bad;
      num += d * d;
      den += double(ref[i]) * ref[i];
    }
    s.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    std::printf("PARITY | %-22s | %-34s | max_abs %.3e | rel_l2 %.3e | tol rel %.0e abs %.0e bf16 +1ulp, %zu of %zu "
                "differ | %s\n",
                op.c_str(), shape.c_str(), s.max_abs, s.rel_l2, rel_tol, abs_tol, differ, ref.size(),
                (s.bad == 0 && s.rel_l2 <= l2_tol) ? "ok" : "FAIL");
    std::fflush(stdout);
    EXPECT_EQ(s.bad, 0u) << op << " " << shape << ": elements non-finite or over the bound";
    EXPECT_LE(s.rel_l2, l2_tol) << op << " " << shape;
    return s;
  }
  // One unit in the last place of a bf16 value of magnitude a (8 significant bits).
  static double ulp_bf16(double a) {
    if (!(a > 0)) return std::ldexp(1.0, -133);
    int e;
    std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
    return std::ldexp(1.0, std::max(e - 8, -133));
  }
  void compare_exact_i32(const std::string& op, const std::string& shape, const std::vector<int32_t>& got,
                         const std::vector<int32_t>& ref) {
    size_t diff = 0;
    EXPECT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < ref.size() && i < got.size(); ++i) diff += got[i] != ref[i];
    std::printf("PARITY | %-22s | %-34s | %zu of %zu indices differ | exact | %s\n", op.c_str(), shape.c_str(), diff,
                ref.size(), diff == 0 ? "ok" : "FAIL");
    std::fflush(stdout);
    EXPECT_EQ(diff, 0u) << op << " " << shape;
  }

  std::unique_ptr<Backend> cpu, gpu;
  std::vector<Buffer> bufs;
};

// Distinct physical blocks for every sequence: seq i gets blocks base + i*n_blocks + j, in a
// shuffled order so logical and physical indices differ.
inline std::vector<int32_t> block_list(int n, int base, uint32_t seed) {
  std::vector<int32_t> b(n);
  for (int j = 0; j < n; ++j) b[j] = base + j;
  std::mt19937 rng(seed);
  std::shuffle(b.begin(), b.end(), rng);
  return b;
}

// Official-numerics indexer inputs: each 32-value block scaled by 2^u, u uniform in
// [-spread, spread] (the blocks' scales differ, as across a real head), then FP4-QDQ'd on the
// host reference (e2m1 times a power of two per 32 values) in place. v: [rows, 128].
// spread 8: q and key block scales then differ by at most 2^32 per product, within the 2^39
// for which the dot products are exact (indexer_mma.cu).
inline void fp4_blocks_inplace(Backend& cpu, std::vector<float>& v, uint32_t seed, int spread = 8) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> u(-spread, spread);
  for (size_t b = 0; b < v.size() / 32; ++b) {
    const float s = std::ldexp(1.0f, u(rng));
    for (size_t i = 0; i < 32; ++i) v[b * 32 + i] *= s;
  }
  Tensor t = view(v, {int64_t(v.size() / 128), 128});
  cpu.fp4_qdq(t, 32, false);
}

}  // namespace dil::test
