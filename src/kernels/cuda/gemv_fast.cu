// linear's `gemv` implementation (fast numerics, T <= kGvMaxRows rows): the kernel of
// gemv_fast.cuh over one weight, KS slices of K per row where the weight is small.
#include "kernels/cuda/gemv_fast.cuh"

namespace dil::cuda {
namespace {

// x [T, K] bf16 (row stride ldx) -> out [T, N] (row stride ldo). One CTA: kGvWarps / ks row
// groups of kGvRowsPerWarp weight rows, ks warps (K slices) per group.
template <int FMT, int R, class TO>
__global__ void __launch_bounds__(kGvThreads) gemv_fast_kernel(const uint16_t* x, int64_t ldx, int T, WView w, int ks,
                                                               bool vec, TO* out, int64_t ldo) {
  extern __shared__ __align__(16) uint16_t gv_smem[];
  const int64_t K = w.k, N = w.n;
  uint16_t* xs = gv_smem;                                                   // [R, K] bf16, gv_xpos order
  float* red = reinterpret_cast<float*>(gv_smem + int64_t(R) * K);          // [kGvWarps][kGvRowsPerWarp][R]
  gv_stage<FMT>(xs, x, ldx, [](int r) { return r; }, T, R, K, vec);
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int grp = warp / ks, slice = warp % ks;
  const int64_t rows_per_cta = int64_t(kGvWarps / ks) * kGvRowsPerWarp;
  const int64_t nb = int64_t(blockIdx.x) * rows_per_cta;
  GvRow rows[kGvRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kGvRowsPerWarp; ++i) {
    const int64_t n = nb + grp * kGvRowsPerWarp + i;
    rows[i] = n < N ? gv_row(w, n) : GvRow{};
  }
  const int64_t C = K / gv_values<FMT>();
  const int64_t c0 = slice * C / ks, c1 = (slice + 1) * C / ks;
  float acc[kGvRowsPerWarp][R];
#pragma unroll
  for (int i = 0; i < kGvRowsPerWarp; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[i][r] = 0.f;
  gv_warp<FMT, R>(xs, K, rows, c0, c1, gv_cpb(w), acc);
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < kGvRowsPerWarp; ++i)
#pragma unroll
      for (int r = 0; r < R; ++r) red[(warp * kGvRowsPerWarp + i) * R + r] = acc[i][r];
  }
  __syncthreads();
  // Thread per (activation row, CTA row), rows fastest (coalesced stores); slices summed in order.
  for (int64_t o = threadIdx.x; o < int64_t(T) * rows_per_cta; o += blockDim.x) {
    const int r = int(o / rows_per_cta);
    const int lr = int(o % rows_per_cta);
    const int64_t n = nb + lr;
    if (n >= N) continue;
    const int g = lr / kGvRowsPerWarp, i = lr % kGvRowsPerWarp;
    float s = 0.f;
    for (int sl = 0; sl < ks; ++sl) s += red[((g * ks + sl) * kGvRowsPerWarp + i) * R + r];
    st_act(out + int64_t(r) * ldo + n, s);
  }
}

template <int FMT, int R, class TO>
void launch(Ctx& c, const bf16_t* x, int64_t ldx, int64_t T, const WView& w, TO* out, int64_t ldo) {
  const int64_t C = w.k / gv_values<FMT>();
  const int ks = gv_ksplit(w.n, C);
  const int64_t rows_per_cta = int64_t(kGvWarps / ks) * kGvRowsPerWarp;
  const size_t smem = size_t(R) * size_t(w.k) * 2 + size_t(kGvWarps) * kGvRowsPerWarp * R * 4;
  auto* kern = gemv_fast_kernel<FMT, R, TO>;
  if (smem > 48 * 1024)
    DIL_CUDA(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const bool vec = (reinterpret_cast<uintptr_t>(x) & 15) == 0 && ldx % 8 == 0;
  kern<<<unsigned(ceil_div(w.n, rows_per_cta)), kGvThreads, smem, c.stream>>>(
      reinterpret_cast<const uint16_t*>(x), ldx, int(T), w, ks, vec, out, ldo);
  DIL_LAUNCH_CHECK("gemv_fast_kernel");
}

template <int FMT, class TO>
void launch_rows(Ctx& c, const bf16_t* x, int64_t ldx, int64_t T, const WView& w, TO* out, int64_t ldo) {
  if (T <= 1) launch<FMT, 1>(c, x, ldx, T, w, out, ldo);
  else if (T <= 2) launch<FMT, 2>(c, x, ldx, T, w, out, ldo);
  else if (T <= 4) launch<FMT, 4>(c, x, ldx, T, w, out, ldo);
  else launch<FMT, 8>(c, x, ldx, T, w, out, ldo);
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
void gemv_fast(Ctx& c, const bf16_t* x, int64_t ldx, int64_t T, const WView& w, TO* out, int64_t ldo) {
  DIL_CHECK(T >= 1 && T <= kGvMaxRows, "gemv_fast: ", T, " rows (at most ", kGvMaxRows, ")");
  DIL_CHECK(w.k % 32 == 0 && w.k <= kGvMaxK, "gemv_fast: K ", w.k, " (a multiple of 32, at most ", kGvMaxK, ")");
  DIL_CHECK((reinterpret_cast<uintptr_t>(w.w) & 15) == 0, "gemv_fast: weight rows not 16-byte aligned");
  switch (w.kind) {
    case 1: launch_rows<1>(c, x, ldx, T, w, out, ldo); break;
    case 2:
      DIL_CHECK(w.bk % 16 == 0, "gemv_fast: FP8 block ", w.bk, " not a multiple of 16");
      launch_rows<2>(c, x, ldx, T, w, out, ldo);
      break;
    case 3: launch_rows<3>(c, x, ldx, T, w, out, ldo); break;
    default: DIL_FAIL("gemv_fast: weight kind ", w.kind, " (BF16, FP8 or FP4 only)");
  }
}
template void gemv_fast<float>(Ctx&, const bf16_t*, int64_t, int64_t, const WView&, float*, int64_t);
template void gemv_fast<bf16_t>(Ctx&, const bf16_t*, int64_t, int64_t, const WView&, bf16_t*, int64_t);

}  // namespace dil::cuda
