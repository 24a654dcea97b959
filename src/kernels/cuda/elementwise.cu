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

__global__ void rms_norm_kernel(const float* x, const float* w, float eps, float* out, int64_t d) {
  __shared__ float red[32];
  const float* xr = x + blockIdx.x * d;
  float ss = 0.f;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) ss += xr[c] * xr[c];
  ss = block_sum(ss, red);
  float r = rsqrtf(ss / float(d) + eps);
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float v = xr[c] * r;
    out[blockIdx.x * d + c] = w ? w[c] * v : v;
  }
}

// x [R, H, d]: interleaved pairs of the last rope_dims of each head vector.
__global__ void rope_kernel(float* x, const int32_t* pos, const float* inv_freq, int H, int d, int rd, float sign) {
  int r = blockIdx.x;
  float p = float(pos[r]);
  int half = rd / 2;
  for (int i = threadIdx.x; i < H * half; i += blockDim.x) {
    int h = i / half, k = i % half;
    float phi = p * inv_freq[k];
    float cs = cosf(phi), sn = sign * sinf(phi);
    float* v = x + (int64_t(r) * H + h) * d + (d - rd) + 2 * k;
    float a = v[0], b = v[1];
    v[0] = a * cs - b * sn;
    v[1] = a * sn + b * cs;
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
    amax = fmaxf(amax, 6.0f * ldexpf(1.0f, -9));
    s = d_round_e4m3(amax / 6.0f);
  } else {
    amax = fmaxf(amax, 6.0f * ldexpf(1.0f, -126));
    s = d_pow2_ceil(amax / 6.0f);
  }
  for (int c = b0 + lane; c < b1; c += 32) xr[c] = d_round_e2m1(fminf(fmaxf(xr[c] / s, -6.f), 6.f)) * s;
}

// Fast Walsh-Hadamard transform of one row in shared memory, then * 1/sqrt(d).
__global__ void hadamard_kernel(float* x, int d) {
  extern __shared__ float sh[];
  float* xr = x + int64_t(blockIdx.x) * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) sh[i] = xr[i];
  __syncthreads();
  for (int h = 1; h < d; h <<= 1) {
    for (int i = threadIdx.x; i < d / 2; i += blockDim.x) {
      int j = (i / h) * 2 * h + (i % h);
      float a = sh[j], b = sh[j + h];
      sh[j] = a + b;
      sh[j + h] = a - b;
    }
    __syncthreads();
  }
  float sc = rsqrtf(float(d));
  for (int i = threadIdx.x; i < d; i += blockDim.x) xr[i] = sh[i] * sc;
}

__global__ void swiglu_kernel(const float* g, const float* u, const float* w, float lim, float* out,
                              int64_t rows, int64_t cols) {
  int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float gv = fminf(g[i], lim);
    float uv = fminf(fmaxf(u[i], -lim), lim);
    float h = gv / (1.0f + expf(-gv)) * uv;
    if (w) h *= w[i / cols];
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
  DIL_CHECK(w.empty() || w.dtype == DType::F32, "rms_norm: weight must be f32");
  if (R == 0) return;
  rms_norm_kernel<<<unsigned(R), 256, 0, c.stream>>>(x.ptr<float>(), w.empty() ? nullptr : w.ptr<float>(), eps,
                                                     out.ptr<float>(), d);
  DIL_LAUNCH_CHECK("rms_norm_kernel");
}

void rope(Ctx& c, Tensor x, const Tensor& pos, const RopeTable& t, bool inverse) {
  int64_t R = x.size(0);
  int H = x.ndim == 3 ? int(x.size(1)) : 1;
  int d = int(x.size(-1));
  DIL_CHECK(t.rope_dims <= d && t.rope_dims % 2 == 0, "rope: rope_dims ", t.rope_dims, " d ", d);
  if (R == 0) return;
  rope_kernel<<<unsigned(R), 128, 0, c.stream>>>(x.ptr<float>(), pos.ptr<int32_t>(), t.inv_freq.ptr<float>(), H, d,
                                                 t.rope_dims, inverse ? -1.f : 1.f);
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
  int64_t warps = R * ceil_div(d, block);
  if (warps == 0) return;
  fp4_qdq_kernel<<<grid_for(warps * 32, 256), 256, 0, c.stream>>>(x.ptr<float>(), R, d, block, e4m3_scale);
  DIL_LAUNCH_CHECK("fp4_qdq_kernel");
}

void hadamard(Ctx& c, Tensor x) {
  int64_t d = x.size(-1), R = x.numel() / d;
  DIL_CHECK(d > 0 && (d & (d - 1)) == 0 && d <= 8192, "hadamard: d ", d, " not a power of two");
  if (R == 0) return;
  hadamard_kernel<<<unsigned(R), 128, size_t(d) * 4, c.stream>>>(x.ptr<float>(), int(d));
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
