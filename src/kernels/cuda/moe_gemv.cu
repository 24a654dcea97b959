// moe_experts' `gemv` implementation (fast numerics, decode sizes): grouped GEMVs over the
// tile map of kGvMoeRows-row tiles (each tile: up to 4 sorted rows of one expert), the kernel
// of gemv_fast.cuh per tile and block of output columns, so that every active expert's weights
// are streamed once per step (a hot expert with more rows has several tiles, whose re-reads
// mostly hit L2). w1 and w3 rows of the same columns go through one warp together and the
// SwiGLU (clamps, routing weight, the fast bf16 roundings) is fused into that kernel's epilogue.
#include "kernels/cuda/gemv_fast.cuh"

namespace dil::cuda {
namespace {

// Columns (of I) per w13 CTA: each warp takes 2 columns = 4 weight rows (w1 n, w3 n, w1 n+1, w3 n+1).
constexpr int kW13Cols = kGvWarps * kGvRowsPerWarp / 2;
// Rows (of D) per w2 CTA.
constexpr int kW2Rows = kGvWarps * kGvRowsPerWarp;
// Column blocks per CTA: the tile's rows are staged once for kLoop blocks of weights (one block
// alone streamed ~64 KB of weights per staging; measured 1.5 TB/s).
constexpr int kLoop = 4;
constexpr int kRed = kGvWarps * kGvRowsPerWarp * kGvMoeRows;  // floats of one reduction buffer

// The tile's rows: sorted rows [r0, r0 + nr) of expert e (nr 0: no such tile).
struct GvTile {
  int e = 0;
  int64_t r0 = 0;
  int nr = 0;
};
__device__ __forceinline__ GvTile gv_tile(const MoeTileMap& m) {
  GvTile t;
  const int tile = blockIdx.y;
  if (tile >= *m.n_tiles) return t;
  t.e = m.tile_e[tile];
  t.r0 = m.tile_r0[tile];
  t.nr = int(min(int64_t(kGvMoeRows), int64_t(m.offsets[t.e + 1]) - t.r0));
  return t;
}

// gv_warp with R = the tile's row count rounded up to 1, 2 or 4 (a CTA-uniform branch), the
// lane-0 sums written to red [kGvWarps][kGvRowsPerWarp][kGvMoeRows].
template <int FMT, int R>
__device__ __forceinline__ void gv_warp_to(const uint16_t* xs, int64_t K, const GvRow (&rows)[kGvRowsPerWarp], int cps,
                                           float* red) {
  float acc[kGvRowsPerWarp][R];
#pragma unroll
  for (int i = 0; i < kGvRowsPerWarp; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[i][r] = 0.f;
  gv_warp<FMT, R>(xs, K, rows, 0, K / gv_values<FMT>(), cps, acc);
  if ((threadIdx.x & 31) == 0) {
    const int warp = threadIdx.x >> 5;
#pragma unroll
    for (int i = 0; i < kGvRowsPerWarp; ++i)
#pragma unroll
      for (int r = 0; r < R; ++r) red[(warp * kGvRowsPerWarp + i) * kGvMoeRows + r] = acc[i][r];
  }
}
__device__ __forceinline__ void gv_warp_rows(int nr, const uint16_t* xs, int64_t K, const GvRow (&rows)[kGvRowsPerWarp],
                                             int cps, float* red) {
  if (nr <= 1)
    gv_warp_to<3, 1>(xs, K, rows, cps, red);
  else if (nr <= 2)
    gv_warp_to<3, 2>(xs, K, rows, cps, red);
  else
    gv_warp_to<3, 4>(xs, K, rows, cps, red);
}

// h [rows, I] f32 (sorted rows) = SwiGLU(w1 x, w3 x) * route_w; grid (ceil(I / kW13Cols / kLoop), max_tiles).
__global__ void __launch_bounds__(kGvThreads, 2) moe_gemv_w13_kernel(GvMoeArgs a, bool vec, float* h) {
  extern __shared__ __align__(16) uint16_t gv_smem[];
  const GvTile t = gv_tile(a.map);
  if (t.nr <= 0) return;
  const int64_t K = a.D;
  uint16_t* xs = gv_smem;                                                       // [kGvMoeRows, D] bf16
  float* red = reinterpret_cast<float*>(gv_smem + int64_t(kGvMoeRows) * K);     // [2][warps][rows][kGvMoeRows]
  const int32_t* tok = a.sorted_tok + t.r0;
  gv_stage<3>(xs, reinterpret_cast<const uint16_t*>(a.xq), a.D, [tok](int r) { return tok[r]; }, t.nr, kGvMoeRows,
              K, vec);
  __syncthreads();
  const int warp = threadIdx.x >> 5;
  const WView w1 = a.w1[t.e], w3 = a.w3[t.e];
  const int64_t n_cb = (a.I + kW13Cols - 1) / kW13Cols;
  // Block cb's sums into red[cb & 1] (double-buffered: one barrier per block suffices, since a
  // warp reaching block cb + 2's writes has passed block cb + 1's barrier, after every thread
  // finished reading block cb).
  for (int64_t cb = int64_t(blockIdx.x) * kLoop; cb < min(n_cb, int64_t(blockIdx.x + 1) * kLoop); ++cb) {
    float* rb = red + (cb & 1) * kRed;
    const int64_t n0 = cb * kW13Cols + warp * 2;
    GvRow rows[kGvRowsPerWarp];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const bool ok = n0 + j < a.I;
      rows[2 * j] = ok ? gv_row(w1, n0 + j) : GvRow{};
      rows[2 * j + 1] = ok ? gv_row(w3, n0 + j) : GvRow{};
    }
    gv_warp_rows(t.nr, xs, K, rows, 0, rb);
    __syncthreads();
    // Thread per (row, column), columns fastest.
    for (int o = threadIdx.x; o < t.nr * kW13Cols; o += blockDim.x) {
      const int r = o / kW13Cols, lc = o % kW13Cols;
      const int64_t n = cb * kW13Cols + lc;
      if (n >= a.I) continue;
      const int wp = lc / 2, j = lc % 2;
      float g = rb[(wp * kGvRowsPerWarp + 2 * j) * kGvMoeRows + r];
      float u = rb[(wp * kGvRowsPerWarp + 2 * j + 1) * kGvMoeRows + r];
      // As moe_swiglu_kernel (moe.cu), f32 steps in the reference's order.
      if (a.round_bf16) {
        g = d_round_bf16(g);
        u = d_round_bf16(u);
      }
      const float gv = fminf(g, a.limit);
      const float uv = fminf(fmaxf(u, -a.limit), a.limit);
      const int64_t row = t.r0 + r;
      const float hv = d_silu(gv) * uv * a.route_w[a.sorted_pair[row]];
      h[row * a.I + n] = a.round_bf16 ? d_round_bf16(hv) : hv;
    }
  }
}

// y [rows, D] f32 (sorted rows) = w2 . hb; grid (ceil(D / kW2Rows / kLoop), max_tiles).
__global__ void __launch_bounds__(kGvThreads, 2) moe_gemv_w2_kernel(GvMoeArgs a, const uint16_t* hb, bool vec, float* y) {
  extern __shared__ __align__(16) uint16_t gv_smem[];
  const GvTile t = gv_tile(a.map);
  if (t.nr <= 0) return;
  const int64_t K = a.I;
  uint16_t* xs = gv_smem;                                                       // [kGvMoeRows, I] bf16
  float* red = reinterpret_cast<float*>(gv_smem + int64_t(kGvMoeRows) * K);
  const int64_t r0 = t.r0;
  gv_stage<3>(xs, hb, a.I, [r0](int r) { return r0 + r; }, t.nr, kGvMoeRows, K, vec);
  __syncthreads();
  const int warp = threadIdx.x >> 5;
  const WView w2 = a.w2[t.e];
  const int64_t n_cb = (a.D + kW2Rows - 1) / kW2Rows;
  for (int64_t cb = int64_t(blockIdx.x) * kLoop; cb < min(n_cb, int64_t(blockIdx.x + 1) * kLoop); ++cb) {
    float* rb = red + (cb & 1) * kRed;  // double-buffered as in the w13 kernel
    const int64_t n0 = cb * kW2Rows + warp * kGvRowsPerWarp;
    GvRow rows[kGvRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kGvRowsPerWarp; ++i) rows[i] = n0 + i < a.D ? gv_row(w2, n0 + i) : GvRow{};
    gv_warp_rows(t.nr, xs, K, rows, 0, rb);
    __syncthreads();
    for (int o = threadIdx.x; o < t.nr * kW2Rows; o += blockDim.x) {
      const int r = o / kW2Rows, lr = o % kW2Rows;
      const int64_t n = cb * kW2Rows + lr;
      if (n >= a.D) continue;
      y[(t.r0 + r) * a.D + n] = rb[lr * kGvMoeRows + r];
    }
  }
}

size_t moe_smem(int64_t K) { return size_t(kGvMoeRows) * size_t(K) * 2 + size_t(2 * kRed) * 4; }

template <class Kern>
void set_smem(Kern* k, size_t smem) {
  if (smem > 48 * 1024) DIL_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
}

}  // namespace

void moe_gemv_w13(Ctx& c, const GvMoeArgs& a, float* h) {
  const size_t smem = moe_smem(a.D);
  set_smem(moe_gemv_w13_kernel, smem);
  const bool vec = (reinterpret_cast<uintptr_t>(a.xq) & 15) == 0 && a.D % 8 == 0;
  dim3 grid(unsigned(ceil_div(ceil_div(a.I, kW13Cols), kLoop)), unsigned(a.max_tiles));
  moe_gemv_w13_kernel<<<grid, kGvThreads, smem, c.stream>>>(a, vec, h);
  DIL_LAUNCH_CHECK("moe_gemv_w13_kernel");
}

void moe_gemv_w2(Ctx& c, const GvMoeArgs& a, const bf16_t* hb, float* y) {
  const size_t smem = moe_smem(a.I);
  set_smem(moe_gemv_w2_kernel, smem);
  const bool vec = (reinterpret_cast<uintptr_t>(hb) & 15) == 0 && a.I % 8 == 0;
  dim3 grid(unsigned(ceil_div(ceil_div(a.D, kW2Rows), kLoop)), unsigned(a.max_tiles));
  moe_gemv_w2_kernel<<<grid, kGvThreads, smem, c.stream>>>(a, reinterpret_cast<const uint16_t*>(hb), vec, y);
  DIL_LAUNCH_CHECK("moe_gemv_w2_kernel");
}

}  // namespace dil::cuda
