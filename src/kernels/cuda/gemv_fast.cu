// linear's `gemv` implementation (fast numerics, T <= kGvMaxRows rows): the kernel of
// gemv_fast.cuh over one weight, KS slices of K per row where the weight is small.
#include "kernels/cuda/gemv_fast.cuh"

namespace dil::cuda {
namespace {

// x [T, K] bf16 (row stride ldx) -> out [T, N] (row stride ldo). A row block: kGvWarps / ks row
// groups of kGvRowsPerWarp weight rows, ks warps (K slices) per group. The grid is at most one
// resident wave: CTA b stages x once and then serves row blocks b, b + gridDim.x, ... (staging x
// and a CTA's start cost as much as a few row blocks' weight loads at decode sizes; the next
// block's first weight lines are prefetched into L2 before the current block's loads are
// consumed). blockIdx.y is the weight group g (grouped_linear): x + g * x_gs, weight rows
// g * N.., out + g * o_gs.
template <int FMT, int R, class TO>
__global__ void __launch_bounds__(kGvThreads) gemv_fast_kernel(const uint16_t* x, int64_t ldx, int T, WView w, int ks,
                                                               bool vec, TO* out, int64_t ldo, int64_t x_gs,
                                                               int64_t o_gs, int act) {
  extern __shared__ __align__(16) uint16_t gv_smem[];
  const int64_t K = w.k, N = w.n;
  uint16_t* xs = gv_smem;                                                   // [R, K] bf16, gv_xpos order
  float* red = reinterpret_cast<float*>(gv_smem + int64_t(R) * K);          // [2][kGvWarps][kGvRowsPerWarp][R]
  const int64_t g0 = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  x += g0 * x_gs;
  out += g0 * o_gs;
  const int grp = warp / ks, slice = warp % ks;
  const int64_t rows_per_cta = int64_t(kGvWarps / ks) * kGvRowsPerWarp;
  const int64_t n_blocks = (N + rows_per_cta - 1) / rows_per_cta;
  const int64_t C = K / gv_values<FMT>();
  const int64_t c0 = slice * C / ks, c1 = (slice + 1) * C / ks;
  // The warp's rows of row block b (padding rows past N are not read).
  auto block_rows = [&](int64_t b, GvRow (&rows)[kGvRowsPerWarp]) {
#pragma unroll
    for (int i = 0; i < kGvRowsPerWarp; ++i) {
      const int64_t n = b * rows_per_cta + grp * kGvRowsPerWarp + i;
      rows[i] = n < N ? gv_row(w, g0 * N + n) : GvRow{};
    }
  };
  GvRow rows[kGvRowsPerWarp];
  block_rows(blockIdx.x, rows);
  // The warp's first weight lines into L2 while the previous kernel ends and x is staged (a
  // hint: weights are never written by a kernel of the stream, and L2 is coherent anyway).
  gv_prefetch(rows, c0, c1);
  pdl_enter();
  bool staged = false;
  if constexpr (FMT == 2) {  // activations are quantized in front of FP8 weights (V4: blocks of 128, V4.1: 32)
    if (act == 128) gv_stage_qdq<FMT, 128>(xs, x, ldx, T, R, K, vec), staged = true;
    else if (act == 32) gv_stage_qdq<FMT, 32>(xs, x, ldx, T, R, K, vec), staged = true;
  }
  if (!staged) gv_stage<FMT>(xs, x, ldx, [](int r) { return r; }, T, R, K, vec);
  __syncthreads();
  int buf = 0;  // red is double-buffered: one barrier per block (block i + 2 writes what block i read
                // before every thread passed block i + 1's barrier)
  for (int64_t b = blockIdx.x; b < n_blocks; b += gridDim.x, buf ^= 1) {
    if (b + gridDim.x < n_blocks) {  // the next block's first lines, while this one's are consumed
      GvRow next[kGvRowsPerWarp];
      block_rows(b + gridDim.x, next);
      gv_prefetch(next, c0, c1);
    }
    float acc[kGvRowsPerWarp][R];
#pragma unroll
    for (int i = 0; i < kGvRowsPerWarp; ++i)
#pragma unroll
      for (int r = 0; r < R; ++r) acc[i][r] = 0.f;
    gv_warp<FMT, R>(xs, K, rows, c0, c1, gv_cps(w), acc);
    float* rb = red + buf * (kGvWarps * kGvRowsPerWarp * R);
    if (lane == 0) {
#pragma unroll
      for (int i = 0; i < kGvRowsPerWarp; ++i)
#pragma unroll
        for (int r = 0; r < R; ++r) rb[(warp * kGvRowsPerWarp + i) * R + r] = acc[i][r];
    }
    __syncthreads();
    // Thread per (activation row, CTA row), rows fastest (coalesced stores); slices summed in order.
    const int64_t nb = b * rows_per_cta;
    for (int64_t o = threadIdx.x; o < int64_t(T) * rows_per_cta; o += blockDim.x) {
      const int r = int(o / rows_per_cta);
      const int lr = int(o % rows_per_cta);
      const int64_t n = nb + lr;
      if (n >= N) continue;
      const int g = lr / kGvRowsPerWarp, i = lr % kGvRowsPerWarp;
      float s = 0.f;
      for (int sl = 0; sl < ks; ++sl) s += rb[((g * ks + sl) * kGvRowsPerWarp + i) * R + r];
      st_act(out + int64_t(r) * ldo + n, s);
    }
    block_rows(b + gridDim.x, rows);
  }
}

template <int FMT, int R, class TO>
void launch(Ctx& c, const bf16_t* x, int64_t ldx, int64_t T, const WView& w, TO* out, int64_t ldo, const GvGroups& gr,
            int act) {
  const int64_t C = w.k / gv_values<FMT>();
  const int ks = gv_ksplit(w.n * gr.n, C);
  const int64_t rows_per_cta = int64_t(kGvWarps / ks) * kGvRowsPerWarp;
  const size_t smem = size_t(R) * size_t(w.k) * 2 + size_t(2 * kGvWarps) * kGvRowsPerWarp * R * 4;
  auto* kern = gemv_fast_kernel<FMT, R, TO>;
  if (smem > 48 * 1024)
    DIL_CUDA(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const bool vec = (reinterpret_cast<uintptr_t>(x) & 15) == 0 && ldx % 8 == 0;
  // At most the resident CTAs (over all groups); each serves its share of the row blocks.
  const int64_t blocks = ceil_div(w.n, rows_per_cta), wave = int64_t(c.resident(kern, kGvThreads, smem));
  const dim3 grid(unsigned(std::clamp<int64_t>(wave / gr.n, 1, blocks)), unsigned(gr.n));
  launch_pdl(c, "gemv_fast_kernel", kern, grid, dim3(kGvThreads), smem, reinterpret_cast<const uint16_t*>(x), ldx, int(T),
             w, ks, vec, out, ldo, gr.x_stride, gr.out_stride, act);
}

template <int FMT, class TO>
void launch_rows(Ctx& c, const bf16_t* x, int64_t ldx, int64_t T, const WView& w, TO* out, int64_t ldo,
                 const GvGroups& gr, int act) {
  if (T <= 1) launch<FMT, 1>(c, x, ldx, T, w, out, ldo, gr, act);
  else if (T <= 2) launch<FMT, 2>(c, x, ldx, T, w, out, ldo, gr, act);
  else if (T <= 4) launch<FMT, 4>(c, x, ldx, T, w, out, ldo, gr, act);
  else launch<FMT, 8>(c, x, ldx, T, w, out, ldo, gr, act);
}

}  // namespace

int gv_ksplit(int64_t n_rows, int64_t chunks) {
  int ks = 1;
  while (ks < kGvWarps) {
    const int64_t ctas = ceil_div(n_rows, int64_t(kGvWarps / ks) * kGvRowsPerWarp);
    if (ctas >= 2 * 132 || chunks / (2 * ks) < 32) break;
    ks *= 2;
  }
  return ks;
}

template <class TO>
void gemv_fast(Ctx& c, const bf16_t* x, int64_t ldx, int64_t T, const WView& w, TO* out, int64_t ldo,
               const GvGroups& gr, int act) {
  DIL_CHECK(T >= 1 && T <= kGvMaxRows, "gemv_fast: ", T, " rows (at most ", kGvMaxRows, ")");
  DIL_CHECK(gr.n >= 1, "gemv_fast: ", gr.n, " groups");
  DIL_CHECK(act == 0 || (gv_stages_qdq(w.kind, w.k, act) && gr.n == 1), "gemv_fast: activation block ", act,
            " for K ", w.k, " (32 or 128 dividing K, FP8 weights, ungrouped)");
  DIL_CHECK(w.k % 32 == 0 && w.k <= kGvMaxK, "gemv_fast: K ", w.k, " (a multiple of 32, at most ", kGvMaxK, ")");
  DIL_CHECK((reinterpret_cast<uintptr_t>(w.w) & 15) == 0, "gemv_fast: weight rows not 16-byte aligned");
  switch (w.kind) {
    case 1: launch_rows<1>(c, x, ldx, T, w, out, ldo, gr, act); break;
    case 2:
      DIL_CHECK(gv_block_ok(w.bk), "gemv_fast: FP8 block ", w.bk, " not 16 x a power of two");
      launch_rows<2>(c, x, ldx, T, w, out, ldo, gr, act);
      break;
    case 3: launch_rows<3>(c, x, ldx, T, w, out, ldo, gr, act); break;
    default: DIL_FAIL("gemv_fast: weight kind ", w.kind, " (BF16, FP8 or FP4 only)");
  }
}
template void gemv_fast<float>(Ctx&, const bf16_t*, int64_t, int64_t, const WView&, float*, int64_t, const GvGroups&,
                               int);
template void gemv_fast<bf16_t>(Ctx&, const bf16_t*, int64_t, int64_t, const WView&, bf16_t*, int64_t,
                                const GvGroups&, int);

}  // namespace dil::cuda
