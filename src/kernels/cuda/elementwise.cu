// Token-wise and elementwise ops: fill, add, embed, RMSNorm, RoPE, FP8/FP4 QDQ, Hadamard,
// SwiGLU, dtype conversion, recurrent-state reset. One thread block per row where a row
// reduction is needed. Activations are f32 or bf16 (backend.h): every kernel here is one
// template over the storage types of its activation tensors (common.cuh ld_act / st_act),
// instantiated by its launcher through with_act; the arithmetic is the f32 kernel's on the
// widened values, each output rounded once to its tensor's dtype.
#include "kernels/cuda/ops.cuh"

namespace dil::cuda {
namespace {

constexpr int kMaxRopeHalf = 256;  // rope_dims / 2 at most (V4 / V4.1: 32)

__global__ void fill_kernel(float* p, int64_t n, float v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = v;
}

// o = a + b in f32. o may alias a or b (same dtype): each element is read before it is written.
template <class TA, class TB, class TO>
__global__ void add_kernel(const TA* a, const TB* b, TO* o, int64_t n) {
  pdl_enter();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    st_act(o + i, ld_act(a[i]) + ld_act(b[i]));
}

template <class TI, class TO>
__global__ void convert_kernel(const TI* in, TO* out, int64_t n) {
  pdl_enter();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    st_act(out + i, ld_act(in[i]));
}

// Decode one element of a weight row (embedding tables: BF16, F32 or FP8 with block scales).
__device__ float decode_elem(const WView& w, int64_t r, int64_t c) {
  switch (w.kind) {
    case 0: return static_cast<const float*>(w.w)[r * w.k + c];
    case 1: return d_bf16_to_f32(static_cast<const uint16_t*>(w.w)[r * w.k + c]);
    case 2: return d_e4m3_to_f32(static_cast<const uint8_t*>(w.w)[r * w.k + c]) *
                   d_e8m0_to_f32(w.scale[(r / w.bn) * w.scale_cols + c / w.bk]);
    default: {
      uint8_t b = static_cast<const uint8_t*>(w.w)[r * (w.k / 2) + c / 2];
      return d_e2m1_to_f32((c & 1) ? (b >> 4) : (b & 15)) * d_e8m0_to_f32(w.scale[r * w.scale_cols + c / 32]);
    }
  }
}

// out [T, d]: row t = table row ids[t], decoded to f32, rounded to out's dtype.
template <class TO>
__global__ void embed_kernel(WView w, const int32_t* ids, TO* out, int64_t d) {
  pdl_enter();
  int t = blockIdx.x;
  int64_t r = ids[t];
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) st_act(out + t * d + c, decode_elem(w, r, c));
}

// r = f32(1 / sqrt(sum(x^2)/d + eps)) with the sum in double; y = w * (x * r) in f32. out may
// alias x (TX == TO): every element is read in the first loop, before the block reduction's
// barriers, and written in the second by the thread that reads it.
template <class TX, class TO>
__global__ void rms_norm_kernel(const TX* x, const void* w, bool w_bf16, float eps, TO* out, int64_t d) {
  pdl_enter();
  __shared__ double red[32];
  const TX* xr = x + blockIdx.x * d;
  double ss = 0.0;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    const double v = ld_act(xr[c]);
    ss += v * v;
  }
  ss = block_sum_d(ss, red);
  const float r = float(1.0 / sqrt(ss / double(d) + double(eps)));
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float v = ld_act(xr[c]) * r;
    if (w) v = (w_bf16 ? d_bf16_to_f32(static_cast<const uint16_t*>(w)[c]) : static_cast<const float*>(w)[c]) * v;
    st_act(out + blockIdx.x * d + c, v);
  }
}

// x [R, H, d]: interleaved pairs of the last rope_dims of each head vector. phi in f32;
// cos/sin in double rounded to f32; each output in double rounded once to f32 (as the
// reference), then to x's dtype. One block per (row, kRopeHeads heads): the row's rope_dims / 2
// angles are evaluated once per block into shared memory and shared by its heads (the double
// sin / cos were the whole cost when every (head, pair) evaluated them: 16 us for one 64-head
// decode row; one block for all 64 heads then took 11 us, each thread's 16 pairs one after the
// other, every load waiting for the previous pair's store).
constexpr int kRopeHeads = 8;
template <class T>
__global__ void rope_kernel(T* x, const int32_t* pos, const float* inv_freq, int H, int d, int rd, bool inverse) {
  pdl_enter();
  __shared__ float cs_s[kMaxRopeHalf], sn_s[kMaxRopeHalf];  // [rd / 2] f32 cos / sin of the row
  int r = blockIdx.x, h0 = blockIdx.y * kRopeHeads, nh = min(kRopeHeads, H - h0);
  float p = float(pos[r]);
  int half = rd / 2;
  for (int k = threadIdx.x; k < half; k += blockDim.x) {
    float phi = p * inv_freq[k];
    cs_s[k] = float(cos(double(phi)));
    float sn = float(sin(double(phi)));
    sn_s[k] = inverse ? -sn : sn;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < nh * half; i += blockDim.x) {
    int h = h0 + i / half, k = i % half;
    double cs = cs_s[k], sn = sn_s[k];
    T* v = x + (int64_t(r) * H + h) * d + (d - rd) + 2 * k;
    double a = ld_act(v[0]), b = ld_act(v[1]);
    st_act(v, float(a * cs - b * sn));
    st_act(v + 1, float(a * sn + b * cs));
  }
}

// One warp per (row, block): ue8m0 FP8 QDQ, s = pow2_ceil(max(amax, 1e-4) * (1/448)), of
// in's columns [0, cols) into out (in place when out == in with the same ld: each lane reads
// its elements before writing them). QDQ'd values are exact in bf16.
template <class TI, class TO>
__global__ void fp8_qdq_kernel(const TI* in, int64_t ld_in, TO* out, int64_t ld_out, int64_t rows, int cols,
                               int block) {
  pdl_enter();
  int nb = (cols + block - 1) / block;
  int64_t gw = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  int lane = threadIdx.x & 31;
  if (gw >= rows * nb) return;
  int64_t r = gw / nb;
  int b0 = int(gw % nb) * block, b1 = min(b0 + block, cols);
  const TI* xr = in + r * ld_in;
  TO* yr = out + r * ld_out;
  float amax = 0.f;
  for (int c = b0 + lane; c < b1; c += 32) amax = fmaxf(amax, fabsf(ld_act(xr[c])));
  const float s = d_act_scale(warp_max(amax));
  for (int c = b0 + lane; c < b1; c += 32) st_act(yr + c, d_act_round(ld_act(xr[c]), s) * s);
}

// One warp per (row, block), in place: FP4 e2m1 QDQ with an E8M0 (power of two) or E4M3 scale.
// The results (e2m1 times a scale of at most 4 significant bits) are exact in bf16.
template <class T>
__global__ void fp4_qdq_kernel(T* x, int64_t rows, int64_t d, int block, bool e4m3_scale) {
  pdl_enter();
  int nb = int((d + block - 1) / block);
  int64_t gw = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  int lane = threadIdx.x & 31;
  if (gw >= rows * nb) return;
  int64_t r = gw / nb;
  int b0 = int(gw % nb) * block, b1 = int(min(int64_t(b0 + block), d));
  T* xr = x + r * d;
  float amax = 0.f;
  for (int c = b0 + lane; c < b1; c += 32) amax = fmaxf(amax, fabsf(ld_act(xr[c])));
  amax = warp_max(amax);
  float s;
  if (e4m3_scale) {
    amax = fmaxf(amax, ldexpf(6.0f, -9));
    s = d_round_e4m3(fminf(amax / 6.0f, 448.0f));
  } else {
    amax = fmaxf(amax, ldexpf(6.0f, -126));
    s = d_pow2_ceil(amax * (1.0f / 6.0f));
  }
  for (int c = b0 + lane; c < b1; c += 32) st_act(xr + c, d_round_e2m1(fminf(fmaxf(ld_act(xr[c]) / s, -6.f), 6.f)) * s);
}

// Fast Walsh-Hadamard transform of one row in shared memory, in double (as the reference),
// scaled by d^-0.5 and rounded once to f32, then to x's dtype.
template <class T>
__global__ void hadamard_kernel(T* x, int d) {
  pdl_enter();
  extern __shared__ double sh[];
  T* xr = x + int64_t(blockIdx.x) * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) sh[i] = ld_act(xr[i]);
  __syncthreads();
  for (int h = 1; h < d; h <<= 1) {
    for (int i = threadIdx.x; i < d / 2; i += blockDim.x) {
      int j = (i / h) * 2 * h + (i % h);
      double a = sh[j], b = sh[j + h];
      sh[j] = a + b;
      sh[j + h] = a - b;
    }
    __syncthreads();
  }
  double sc = pow(double(d), -0.5);
  for (int i = threadIdx.x; i < d; i += blockDim.x) st_act(xr + i, float(sh[i] * sc));
}

// out = silu(min(g, lim)) * clamp(u, -lim, lim) [* w[row]], f32 steps, silu in double.
template <class TG, class TU, class TO>
__global__ void swiglu_kernel(const TG* g, const TU* u, const float* w, float lim, TO* out, int64_t rows,
                              int64_t cols) {
  pdl_enter();
  int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float gv = fminf(ld_act(g[i]), lim);
    float uv = fminf(fmaxf(ld_act(u[i]), -lim), lim);
    float h = d_silu(gv) * uv;
    if (w) h = h * w[i / cols];
    st_act(out + i, h);
  }
}

// One thread spins on the global timer (ns) until `ns` have passed since it started.
__global__ void hold_kernel(uint64_t ns) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(10000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

}  // namespace

void hold_stream(Ctx& c, double ms) {
  if (!(ms > 0)) return;
  hold_kernel<<<1, 1, 0, c.stream>>>(uint64_t(ms * 1e6));
  DIL_LAUNCH_CHECK("hold_kernel");
}

void fill_f32(Ctx& c, float* p, int64_t n, float v) {
  if (n == 0) return;
  fill_kernel<<<stride_grid(n), 256, 0, c.stream>>>(p, n, v);
  DIL_LAUNCH_CHECK("fill_kernel");
}

template <class TI, class TO>
void convert(Ctx& c, const TI* in, TO* out, int64_t n) {
  if (n == 0) return;
  launch_pdl(c, "convert_kernel", convert_kernel<TI, TO>, dim3(stride_grid(n)), dim3(256), 0, in, out, n);
}
template void convert<float, bf16_t>(Ctx&, const float*, bf16_t*, int64_t);
template void convert<bf16_t, float>(Ctx&, const bf16_t*, float*, int64_t);

void to_f32(Ctx& c, const Tensor& in, float* out) {
  with_act(in, "to_f32", [&](auto ti) {
    using TI = decltype(ti);
    if constexpr (std::is_same_v<TI, float>) {
      if (in.numel()) DIL_CUDA(cudaMemcpyAsync(out, in.data, in.nbytes(), cudaMemcpyDeviceToDevice, c.stream));
    } else {
      convert(c, in.ptr<TI>(), out, in.numel());
    }
  });
}

void add(Ctx& c, const Tensor& a, const Tensor& b, Tensor out) {
  DIL_CHECK(a.numel() == b.numel() && a.numel() == out.numel(), "add: size mismatch ", a.shape_str(), " ",
            b.shape_str(), " ", out.shape_str());
  const int64_t n = out.numel();
  if (n == 0) return;
  with_act(a, "add a", [&](auto ta) {
    using TA = decltype(ta);
    with_act(b, "add b", [&](auto tb) {
      using TB = decltype(tb);
      with_act(out, "add out", [&](auto to) {
        using TO = decltype(to);
        launch_pdl(c, "add_kernel", add_kernel<TA, TB, TO>, dim3(stride_grid(n)), dim3(256), 0, a.ptr<TA>(), b.ptr<TB>(), out.ptr<TO>(), n);
      });
    });
  });
}

void embed(Ctx& c, const Weight& table, const Tensor& ids, Tensor out) {
  int64_t T = ids.numel(), d = table.in;
  DIL_CHECK(out.numel() == T * d, "embed: out ", out.shape_str(), " vs ", T, "x", d);
  if (T == 0) return;
  with_act(out, "embed out", [&](auto to) {
    using TO = decltype(to);
    launch_pdl(c, "embed_kernel", embed_kernel<TO>, dim3(unsigned(T)), dim3(256), 0, make_wview(table), ids.ptr<int32_t>(), out.ptr<TO>(), d);
  });
}

void rms_norm(Ctx& c, const Tensor& x, const Tensor& w, float eps, Tensor out) {
  int64_t d = x.size(-1), R = d ? x.numel() / d : 0;
  DIL_CHECK(out.numel() == x.numel(), "rms_norm: out ", out.shape_str(), " x ", x.shape_str());
  DIL_CHECK(w.empty() || w.numel() == d, "rms_norm: weight ", w.shape_str(), " vs d=", d);
  DIL_CHECK(w.empty() || w.dtype == DType::F32 || w.dtype == DType::BF16, "rms_norm: weight must be f32 or bf16");
  if (R == 0) return;
  with_act(x, "rms_norm x", [&](auto tx) {
    using TX = decltype(tx);
    with_act(out, "rms_norm out", [&](auto to) {
      using TO = decltype(to);
      launch_pdl(c, "rms_norm_kernel", rms_norm_kernel<TX, TO>, dim3(unsigned(R)), dim3(256), 0, x.ptr<TX>(), w.empty() ? nullptr : w.data,
                                                                 w.dtype == DType::BF16, eps, out.ptr<TO>(), d);
    });
  });
}

void rope(Ctx& c, Tensor x, const Tensor& pos, const RopeTable& t, bool inverse) {
  int64_t R = x.size(0);
  int d = int(x.size(-1));
  int H = R ? int(x.numel() / (R * d)) : 1;
  DIL_CHECK(t.rope_dims <= d && t.rope_dims % 2 == 0 && t.rope_dims / 2 <= kMaxRopeHalf, "rope: rope_dims ",
            t.rope_dims, " d ", d);
  DIL_CHECK(pos.numel() == R, "rope: pos ", pos.shape_str(), " for x ", x.shape_str());
  if (R == 0) return;
  with_act(x, "rope x", [&](auto tx) {
    using T = decltype(tx);
    launch_pdl(c, "rope_kernel", rope_kernel<T>, dim3(unsigned(R), unsigned(ceil_div(H, kRopeHeads))), dim3(128), 0, x.ptr<T>(), pos.ptr<int32_t>(), t.inv_freq.ptr<float>(), H, d,
                                                      t.rope_dims, inverse);
  });
}

template <class TI, class TO>
void fp8_qdq(Ctx& c, const TI* in, int64_t ld_in, TO* out, int64_t ld_out, int64_t rows, int cols, int block) {
  DIL_CHECK(block > 0 && cols <= ld_in && cols <= ld_out, "fp8_qdq: block ", block, " cols ", cols, " ld ", ld_in,
            " / ", ld_out);
  DIL_CHECK(static_cast<const void*>(in) != static_cast<const void*>(out) || ld_in == ld_out,
            "fp8_qdq: in place needs one row stride");
  int64_t warps = rows * ceil_div(cols, block);
  if (warps == 0) return;
  launch_pdl(c, "fp8_qdq_kernel", fp8_qdq_kernel<TI, TO>, dim3(grid_for(warps * 32, 256)), dim3(256), 0, in, ld_in, out, ld_out, rows, cols, block);
}
template void fp8_qdq<float, float>(Ctx&, const float*, int64_t, float*, int64_t, int64_t, int, int);
template void fp8_qdq<bf16_t, bf16_t>(Ctx&, const bf16_t*, int64_t, bf16_t*, int64_t, int64_t, int, int);
template void fp8_qdq<float, bf16_t>(Ctx&, const float*, int64_t, bf16_t*, int64_t, int64_t, int, int);
template void fp8_qdq<bf16_t, float>(Ctx&, const bf16_t*, int64_t, float*, int64_t, int64_t, int, int);

void fp8_qdq(Ctx& c, Tensor x, int cols, int block) {
  const int64_t d = x.ndim ? x.size(-1) : 0, R = d ? x.numel() / d : 0;
  DIL_CHECK(cols >= 0 && cols <= d, "fp8_qdq: cols ", cols, " for width ", d);
  with_act(x, "fp8_qdq x", [&](auto tx) {
    using T = decltype(tx);
    fp8_qdq(c, x.ptr<T>(), d, x.ptr<T>(), d, R, cols, block);
  });
}

void fp4_qdq(Ctx& c, Tensor x, int block, bool e4m3_scale) {
  int64_t d = x.size(-1), R = x.numel() / d;
  DIL_CHECK(block > 0 && d % block == 0, "fp4_qdq: width ", d, " not a multiple of block ", block);
  int64_t warps = R * ceil_div(d, block);
  if (warps == 0) return;
  with_act(x, "fp4_qdq x", [&](auto tx) {
    using T = decltype(tx);
    launch_pdl(c, "fp4_qdq_kernel", fp4_qdq_kernel<T>, dim3(grid_for(warps * 32, 256)), dim3(256), 0, x.ptr<T>(), R, d, block, e4m3_scale);
  });
}

void hadamard(Ctx& c, Tensor x) {
  int64_t d = x.size(-1), R = x.numel() / d;
  DIL_CHECK(d > 0 && (d & (d - 1)) == 0 && d <= 4096, "hadamard: d ", d, " not a power of two <= 4096");
  if (R == 0) return;
  with_act(x, "hadamard x", [&](auto tx) {
    using T = decltype(tx);
    launch_pdl(c, "hadamard_kernel", hadamard_kernel<T>, dim3(unsigned(R)), dim3(128), size_t(d) * 8, x.ptr<T>(), int(d));
  });
}

void swiglu(Ctx& c, const Tensor& g, const Tensor& u, const Tensor& w, float limit, Tensor out) {
  int64_t cols = g.size(-1), rows = cols ? g.numel() / cols : 0;
  DIL_CHECK(u.numel() == g.numel() && out.numel() == g.numel(), "swiglu: sizes differ ", g.shape_str(), " ",
            u.shape_str(), " ", out.shape_str());
  if (!w.empty()) {
    check_f32(w, "swiglu w");
    DIL_CHECK(w.numel() == rows, "swiglu: w ", w.shape_str(), " for ", rows, " rows");
  }
  if (rows == 0) return;
  with_act(g, "swiglu g", [&](auto tg) {
    using TG = decltype(tg);
    with_act(u, "swiglu u", [&](auto tu) {
      using TU = decltype(tu);
      with_act(out, "swiglu out", [&](auto to) {
        using TO = decltype(to);
        launch_pdl(c, "swiglu_kernel", swiglu_kernel<TG, TU, TO>, dim3(stride_grid(rows * cols)), dim3(256), 0,
            g.ptr<TG>(), u.ptr<TU>(), w.empty() ? nullptr : w.ptr<float>(), limit, out.ptr<TO>(), rows, cols);
      });
    });
  });
}

void reset_state(Ctx& c, Tensor kv, Tensor score, const std::vector<int32_t>& slots) {
  check_f32(kv, "reset_state kv");
  check_f32(score, "reset_state score");
  int64_t per = kv.numel() / kv.size(0);
  for (int32_t s : slots) {
    DIL_CHECK(s >= 0 && s < kv.size(0), "reset_state: slot ", s);
    DIL_CUDA(cudaMemsetAsync(kv.ptr<float>() + s * per, 0, size_t(per) * 4, c.stream));
    fill_f32(c, score.ptr<float>() + s * per, per, -INFINITY);
  }
}

}  // namespace dil::cuda
