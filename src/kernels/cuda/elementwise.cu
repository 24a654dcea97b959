// Token-wise and elementwise ops: fill, add, embed, RMSNorm, RoPE, FP8/FP4 QDQ, Hadamard,
// SwiGLU, recurrent-state reset. One thread block per row where a row reduction is needed.
#include "kernels/cuda/ops.cuh"

namespace dil::cuda {
namespace {

__global__ void fill_kernel(float* p, int64_t n, float v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = v;
}

__global__ void add_kernel(const float* a, const float* b, float* o, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    o[i] = a[i] + b[i];
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

__global__ void embed_kernel(WView w, const int32_t* ids, float* out, int64_t d) {
  int t = blockIdx.x;
  int64_t r = ids[t];
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) out[t * d + c] = decode_elem(w, r, c);
}

// r = f32(1 / sqrt(sum(x^2)/d + eps)) with the sum in double; y = w * (x * r) in f32.
__global__ void rms_norm_kernel(const float* x, const void* w, bool w_bf16, float eps, float* out, int64_t d) {
  __shared__ double red[32];
  const float* xr = x + blockIdx.x * d;
  double ss = 0.0;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) ss += double(xr[c]) * xr[c];
  ss = block_sum_d(ss, red);
  const float r = float(1.0 / sqrt(ss / double(d) + double(eps)));
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float v = xr[c] * r;
    if (w) v = (w_bf16 ? d_bf16_to_f32(static_cast<const uint16_t*>(w)[c]) : static_cast<const float*>(w)[c]) * v;
    out[blockIdx.x * d + c] = v;
  }
}

// x [R, H, d]: interleaved pairs of the last rope_dims of each head vector. phi in f32;
// cos/sin in double rounded to f32; each output in double rounded once (as the reference).
__global__ void rope_kernel(float* x, const int32_t* pos, const float* inv_freq, int H, int d, int rd, bool inverse) {
  int r = blockIdx.x;
  float p = float(pos[r]);
  int half = rd / 2;
  for (int i = threadIdx.x; i < H * half; i += blockDim.x) {
    int h = i / half, k = i % half;
    float phi = p * inv_freq[k];
    double cs = float(cos(double(phi)));
    double sn = float(sin(double(phi)));
    if (inverse) sn = -sn;
    float* v = x + (int64_t(r) * H + h) * d + (d - rd) + 2 * k;
    double a = v[0], b = v[1];
    v[0] = float(a * cs - b * sn);
    v[1] = float(a * sn + b * cs);
  }
}

// One warp per (row, block): ue8m0 FP8 QDQ, s = pow2_ceil(max(amax, 1e-4) * (1/448)).
__global__ void fp8_qdq_kernel(float* x, int64_t rows, int64_t ld, int cols, int block) {
  int nb = (cols + block - 1) / block;
  int64_t gw = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  int lane = threadIdx.x & 31;
  if (gw >= rows * nb) return;
  int64_t r = gw / nb;
  int b0 = int(gw % nb) * block, b1 = min(b0 + block, cols);
  float* xr = x + r * ld;
  float amax = 0.f;
  for (int c = b0 + lane; c < b1; c += 32) amax = fmaxf(amax, fabsf(xr[c]));
  amax = fmaxf(warp_max(amax), 1e-4f);
  float s = d_pow2_ceil(amax * (1.0f / 448.0f));
  for (int c = b0 + lane; c < b1; c += 32) xr[c] = d_round_e4m3(fminf(fmaxf(xr[c] / s, -448.f), 448.f)) * s;
}

// One warp per (row, block): FP4 e2m1 QDQ with an E8M0 (power of two) or E4M3 scale.
__global__ void fp4_qdq_kernel(float* x, int64_t rows, int64_t d, int block, bool e4m3_scale) {
  int nb = int((d + block - 1) / block);
  int64_t gw = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  int lane = threadIdx.x & 31;
  if (gw >= rows * nb) return;
  int64_t r = gw / nb;
  int b0 = int(gw % nb) * block, b1 = int(min(int64_t(b0 + block), d));
  float* xr = x + r * d;
  float amax = 0.f;
  for (int c = b0 + lane; c < b1; c += 32) amax = fmaxf(amax, fabsf(xr[c]));
  amax = warp_max(amax);
  float s;
  if (e4m3_scale) {
    amax = fmaxf(amax, ldexpf(6.0f, -9));
    s = d_round_e4m3(fminf(amax / 6.0f, 448.0f));
  } else {
    amax = fmaxf(amax, ldexpf(6.0f, -126));
    s = d_pow2_ceil(amax * (1.0f / 6.0f));
  }
  for (int c = b0 + lane; c < b1; c += 32) xr[c] = d_round_e2m1(fminf(fmaxf(xr[c] / s, -6.f), 6.f)) * s;
}

// Fast Walsh-Hadamard transform of one row in shared memory, in double (as the reference),
// scaled by d^-0.5 and rounded once.
__global__ void hadamard_kernel(float* x, int d) {
  extern __shared__ double sh[];
  float* xr = x + int64_t(blockIdx.x) * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) sh[i] = xr[i];
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
  for (int i = threadIdx.x; i < d; i += blockDim.x) xr[i] = float(sh[i] * sc);
}

__global__ void swiglu_kernel(const float* g, const float* u, const float* w, float lim, float* out,
                              int64_t rows, int64_t cols) {
  int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float gv = fminf(g[i], lim);
    float uv = fminf(fmaxf(u[i], -lim), lim);
    float h = d_silu(gv) * uv;
    if (w) h = h * w[i / cols];
    out[i] = h;
  }
}

unsigned stride_grid(int64_t n) { return unsigned(std::min<int64_t>(ceil_div(n, 256), 132 * 16)); }

}  // namespace

void fill_f32(Ctx& c, float* p, int64_t n, float v) {
  if (n == 0) return;
  fill_kernel<<<stride_grid(n), 256, 0, c.stream>>>(p, n, v);
  DIL_LAUNCH_CHECK("fill_kernel");
}

void add(Ctx& c, const Tensor& a, const Tensor& b, Tensor out) {
  DIL_CHECK(a.numel() == b.numel() && a.numel() == out.numel(), "add: size mismatch");
  if (out.numel() == 0) return;
  add_kernel<<<stride_grid(out.numel()), 256, 0, c.stream>>>(a.ptr<float>(), b.ptr<float>(), out.ptr<float>(),
                                                             out.numel());
  DIL_LAUNCH_CHECK("add_kernel");
}

void embed(Ctx& c, const Weight& table, const Tensor& ids, Tensor out) {
  int64_t T = ids.numel(), d = table.in;
  DIL_CHECK(out.numel() == T * d, "embed: out ", out.shape_str(), " vs ", T, "x", d);
  if (T == 0) return;
  embed_kernel<<<unsigned(T), 256, 0, c.stream>>>(make_wview(table), ids.ptr<int32_t>(), out.ptr<float>(), d);
  DIL_LAUNCH_CHECK("embed_kernel");
}

void rms_norm(Ctx& c, const Tensor& x, const Tensor& w, float eps, Tensor out) {
  int64_t d = x.size(-1), R = x.numel() / d;
  DIL_CHECK(w.empty() || w.numel() == d, "rms_norm: weight ", w.shape_str(), " vs d=", d);
  DIL_CHECK(w.empty() || w.dtype == DType::F32 || w.dtype == DType::BF16, "rms_norm: weight must be f32 or bf16");
  if (R == 0) return;
  rms_norm_kernel<<<unsigned(R), 256, 0, c.stream>>>(x.ptr<float>(), w.empty() ? nullptr : w.data,
                                                     w.dtype == DType::BF16, eps, out.ptr<float>(), d);
  DIL_LAUNCH_CHECK("rms_norm_kernel");
}

void rope(Ctx& c, Tensor x, const Tensor& pos, const RopeTable& t, bool inverse) {
  int64_t R = x.size(0);
  int d = int(x.size(-1));
  int H = R ? int(x.numel() / (R * d)) : 1;
  DIL_CHECK(t.rope_dims <= d && t.rope_dims % 2 == 0, "rope: rope_dims ", t.rope_dims, " d ", d);
  if (R == 0) return;
  rope_kernel<<<unsigned(R), 128, 0, c.stream>>>(x.ptr<float>(), pos.ptr<int32_t>(), t.inv_freq.ptr<float>(), H, d,
                                                 t.rope_dims, inverse);
  DIL_LAUNCH_CHECK("rope_kernel");
}

void fp8_qdq(Ctx& c, float* x, int64_t rows, int64_t ld, int cols, int block) {
  DIL_CHECK(block > 0 && cols <= ld, "fp8_qdq: block ", block, " cols ", cols);
  int64_t warps = rows * ceil_div(cols, block);
  if (warps == 0) return;
  fp8_qdq_kernel<<<grid_for(warps * 32, 256), 256, 0, c.stream>>>(x, rows, ld, cols, block);
  DIL_LAUNCH_CHECK("fp8_qdq_kernel");
}

void fp4_qdq(Ctx& c, Tensor x, int block, bool e4m3_scale) {
  int64_t d = x.size(-1), R = x.numel() / d;
  DIL_CHECK(block > 0 && d % block == 0, "fp4_qdq: width ", d, " not a multiple of block ", block);
  int64_t warps = R * ceil_div(d, block);
  if (warps == 0) return;
  fp4_qdq_kernel<<<grid_for(warps * 32, 256), 256, 0, c.stream>>>(x.ptr<float>(), R, d, block, e4m3_scale);
  DIL_LAUNCH_CHECK("fp4_qdq_kernel");
}

void hadamard(Ctx& c, Tensor x) {
  int64_t d = x.size(-1), R = x.numel() / d;
  DIL_CHECK(d > 0 && (d & (d - 1)) == 0 && d <= 4096, "hadamard: d ", d, " not a power of two <= 4096");
  if (R == 0) return;
  hadamard_kernel<<<unsigned(R), 128, size_t(d) * 8, c.stream>>>(x.ptr<float>(), int(d));
  DIL_LAUNCH_CHECK("hadamard_kernel");
}

void swiglu(Ctx& c, const Tensor& g, const Tensor& u, const Tensor& w, float limit, Tensor out) {
  int64_t cols = g.size(-1), rows = g.numel() / cols;
  if (rows == 0) return;
  swiglu_kernel<<<stride_grid(rows * cols), 256, 0, c.stream>>>(
      g.ptr<float>(), u.ptr<float>(), w.empty() ? nullptr : w.ptr<float>(), limit, out.ptr<float>(), rows, cols);
  DIL_LAUNCH_CHECK("swiglu_kernel");
}

void reset_state(Ctx& c, Tensor kv, Tensor score, const std::vector<int32_t>& slots) {
  int64_t per = kv.numel() / kv.size(0);
  for (int32_t s : slots) {
    DIL_CHECK(s >= 0 && s < kv.size(0), "reset_state: slot ", s);
    DIL_CUDA(cudaMemsetAsync(kv.ptr<float>() + s * per, 0, size_t(per) * 4, c.stream));
    fill_f32(c, score.ptr<float>() + s * per, per, -INFINITY);
  }
}

}  // namespace dil::cuda
