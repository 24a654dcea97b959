// linear's `gemv_stream` (fast numerics, T <= kGvMaxRows rows): gemv_fast's product with the
// weight streamed through shared memory.
//
// Why: at decode sizes the GEMV is one pass over the weight. gemv_fast's warps load their
// rows' chunks into registers, use them and only then load again, with a CTA barrier per row
// block, so HBM sees bursts separated by round trips. Here each CTA owns a contiguous range of
// whole weight rows, which in the row-major weight is one contiguous byte range, and a producer
// warp keeps kGsStages bulk copies of it in flight into a ring of shared-memory stages; the first
// ones are issued before the kernel waits for the previous kernel (weights are never written by
// the stream), so they overlap its tail. Measured (docs/performance.md, fifteenth session): it
// streams the 1.06 GB head at 4.39 TB/s (gemv_fast 3.84), but on 4-34 MB weights, where a CTA
// serves only one or two stages, it is 3-25% slower than gemv_fast; the plan takes it from
// 256 MB (registry.cpp kStreamMinBytes).
//
// Layout: a stage holds rps whole rows (rps a power of two, rps x row bytes <= kGsStageBytes).
// The 8 consumer warps split a stage's rows: rps < 8 rows are cut into ks = 8 / rps K slices (a
// warp per (row, slice)), else warp w takes rows w, w + 8, .... A warp walks its slice as
// gemv_fast's gv_warp does (lane l: chunks l, l + 32, ...; each chunk's sum in f32 with fmaf,
// k ascending, times its block scale, added into the lane's accumulator; xor-shuffle tree) and
// writes its sums to `red`; the producer warp, once every consumer has released the stage, adds
// the slices in slice order, stores the outputs and refills the stage. So every output is the
// same sum as gemv_fast computes with ks slices (KS <= 8): the bound of gemv_bound.h holds as is.
#include "kernels/cuda/gemv_fast.cuh"

namespace dil::cuda {
namespace {

using sm90::bulk_load, sm90::mbar_arrive, sm90::mbar_arrive_expect_tx, sm90::mbar_init, sm90::mbar_wait;

constexpr int kGsConsumers = kGvWarps;               // consumer warps (gv_stage_qdq's warps)
constexpr int kGsThreads = 32 * (kGsConsumers + 1);  // + the producer warp
constexpr int kGsStages = 4;                         // ring depth: bulk copies in flight per CTA
constexpr int64_t kGsStageBytes = 16384;             // at most, per stage
constexpr int kGsMaxRps = 32;                        // rows per stage, at most
constexpr int kGsRed = kGsMaxRps;                    // red entries per stage and row: rps x ks <= 32

struct GsGeom {
  int64_t row_bytes;    // bytes of one weight row
  int64_t stage_bytes;  // rps x row_bytes
  int rps;              // rows per stage (power of two)
  int ks;               // K slices per row: 8 / rps for rps < 8, else 1
};

template <int FMT>
constexpr int64_t gs_row_bytes(int64_t K) {
  return FMT == 1 ? 2 * K : FMT == 2 ? K : K / 2;
}

// The warp's sums of one weight row (its bytes at `wrow` in shared memory, scale row `srow` in
// global memory) over chunks [c0, c1) with the R staged activation rows: acc[r], every lane
// holding the total. gv_warp's arithmetic for one row; two chunks per lane in flight.
template <int FMT, int R>
__device__ __forceinline__ void gs_row(const uint16_t* xs, int64_t K, const uint8_t* wrow, const uint8_t* srow,
                                       int64_t c0, int64_t c1, int cps, float (&acc)[R]) {
  constexpr int V = gv_values<FMT>(), G = V / 8, U = 2;
  const int64_t C = K / V;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  for (int64_t cb = c0 + lane; cb < c1; cb += 32 * U) {
    uint4 q[U];
    float sc[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = cb + 32 * u;
      const bool ok = c < c1;
      q[u] = ok ? *reinterpret_cast<const uint4*>(wrow + 16 * c) : make_uint4(0, 0, 0, 0);
      if constexpr (FMT != 1) sc[u] = ok ? d_e8m0_fast(__ldg(srow + (c >> cps))) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = cb + 32 * u;
      if (c >= c1) break;
      float part[R];
#pragma unroll
      for (int r = 0; r < R; ++r) part[r] = 0.f;
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float wv[8];
        gv_decode8<FMT>(q[u], g, wv);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const uint4 xv = *reinterpret_cast<const uint4*>(xs + int64_t(r) * K + gv_xpos(c, g, C));
          const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            part[r] = fmaf(gv_lo(xw[j]), wv[2 * j], part[r]);
            part[r] = fmaf(gv_hi(xw[j]), wv[2 * j + 1], part[r]);
          }
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if constexpr (FMT == 1)
          acc[r] += part[r];
        else if constexpr (FMT == 2)
          acc[r] = fmaf(part[r], sc[u], acc[r]);
        else
          acc[r] = fmaf(part[r] * 64.f, sc[u], acc[r]);  // e2m1 = decoded x 2^6
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = warp_sum(acc[r]);
}

// x [T, K] bf16 (row stride ldx) -> out [T, N] (row stride ldo). blockIdx.y: the weight group
// (grouped_linear: x + g * x_gs, weight rows g * N.., out + g * o_gs); blockIdx.x: a contiguous
// range of the group's stages. Shared memory: the ring [kGsStages][stage_bytes], xs [R, K] bf16
// (gv_xpos order), red [kGsStages][kGsRed][R] f32, full / empty mbarriers [kGsStages] each.
template <int FMT, int R, class TO>
__global__ void __launch_bounds__(kGsThreads)
    gemv_stream_kernel(const uint16_t* x, int64_t ldx, int T, WView w, GsGeom geo, bool vec, TO* out, int64_t ldo,
                       int64_t x_gs, int64_t o_gs, int act) {
  extern __shared__ __align__(128) uint8_t gs_smem[];
  const int64_t K = w.k, N = w.n;
  uint8_t* ring = gs_smem;
  uint16_t* xs = reinterpret_cast<uint16_t*>(gs_smem + kGsStages * geo.stage_bytes);
  float* red = reinterpret_cast<float*>(xs + int64_t(R) * K);
  uint64_t* full = reinterpret_cast<uint64_t*>(red + kGsStages * kGsRed * R);
  uint64_t* empty = full + kGsStages;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t g0 = blockIdx.y;
  const int64_t n_st = (N + geo.rps - 1) / geo.rps;
  const int64_t s_begin = n_st * blockIdx.x / gridDim.x, s_end = n_st * (blockIdx.x + 1) / gridDim.x;
  const int64_t n_mine = s_end - s_begin;
  const uint8_t* wg = static_cast<const uint8_t*>(w.w) + g0 * N * geo.row_bytes;  // the group's first row
  const bool producer = warp == kGsConsumers;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kGsStages; ++s) {
      mbar_init(&full[s], 1);              // the producer's expect_tx arrival (+ the copy's bytes)
      mbar_init(&empty[s], kGsConsumers);  // one arrival per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  // Stage i of this CTA (global stage s_begin + i) into slot i % kGsStages.
  auto issue = [&](int64_t i) {
    const int64_t s = s_begin + i;
    const uint32_t bytes = uint32_t(min(int64_t(geo.rps), N - s * geo.rps) * geo.row_bytes);
    uint64_t* bar = &full[i % kGsStages];
    mbar_arrive_expect_tx(bar, bytes);
    bulk_load(ring + (i % kGsStages) * geo.stage_bytes, wg + s * geo.rps * geo.row_bytes, bytes, bar);
  };
  if (producer && lane == 0)
    for (int64_t i = 0; i < min(n_mine, int64_t(kGsStages)); ++i) issue(i);
  pdl_enter();
  x += g0 * x_gs;
  out += g0 * o_gs;
  bool staged = false;
  if constexpr (FMT == 2) {  // activations are quantized in front of FP8 weights (V4: blocks of 128, V4.1: 32)
    if (act == 128)
      gv_stage_qdq<FMT, 128>(xs, x, ldx, T, R, K, vec), staged = true;
    else if (act == 32)
      gv_stage_qdq<FMT, 32>(xs, x, ldx, T, R, K, vec), staged = true;
  }
  if (!staged)
    gv_stage<FMT>(
        xs, x, ldx, [](int r) { return r; }, T, R, K, vec);
  __syncthreads();

  const int64_t C = K / gv_values<FMT>();
  if (producer) {
    // Stage i's outputs once every consumer released it (their red writes are visible: the
    // barrier's arrivals release, the wait acquires), then its slot refilled with stage i + kGsStages.
    for (int64_t i = 0; i < n_mine; ++i) {
      const int slot = int(i % kGsStages);
      mbar_wait(&empty[slot], uint32_t(i / kGsStages) & 1u);
      const int64_t n0 = (s_begin + i) * geo.rps;
      const int nr = int(min(int64_t(geo.rps), N - n0));
      const float* rs = red + slot * kGsRed * R;
      for (int o = lane; o < T * nr; o += 32) {  // rows fastest: coalesced stores
        const int r = o / nr, j = o % nr;
        float s = 0.f;
        for (int sl = 0; sl < geo.ks; ++sl) s += rs[(j * geo.ks + sl) * R + r];
        st_act(out + int64_t(r) * ldo + n0 + j, s);
      }
      __syncwarp();  // every lane's red reads before the slot's next use is let in
      if (lane == 0 && i + kGsStages < n_mine) issue(i + kGsStages);
    }
    return;
  }
  const int rows_step = kGsConsumers / geo.ks, slice = warp % geo.ks;
  const int64_t c0 = slice * C / geo.ks, c1 = (slice + 1) * C / geo.ks;
  const int cps = gv_cps(w);
  for (int64_t i = 0; i < n_mine; ++i) {
    const int slot = int(i % kGsStages);
    mbar_wait(&full[slot], uint32_t(i / kGsStages) & 1u);
    const int64_t n0 = (s_begin + i) * geo.rps;
    const int nr = int(min(int64_t(geo.rps), N - n0));
    const uint8_t* st = ring + slot * geo.stage_bytes;
    float* rs = red + slot * kGsRed * R;
    for (int j = warp / geo.ks; j < nr; j += rows_step) {
      float acc[R];
      gs_row<FMT, R>(xs, K, st + j * geo.row_bytes, FMT == 1 ? nullptr : gv_row(w, g0 * N + n0 + j).s, c0, c1, cps,
                     acc);
      if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) rs[(j * geo.ks + slice) * R + r] = acc[r];
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[slot]);
  }
}

template <int FMT, int R, class TO>
void launch(Ctx& c, const bf16_t* x, int64_t ldx, int64_t T, const WView& w, TO* out, int64_t ldo, const GvGroups& gr,
            int act) {
  GsGeom geo;
  geo.row_bytes = gs_row_bytes<FMT>(w.k);
  geo.rps = 1;
  while (geo.rps < kGsMaxRps && 2 * geo.rps * geo.row_bytes <= kGsStageBytes) geo.rps *= 2;
  geo.stage_bytes = geo.rps * geo.row_bytes;
  geo.ks = geo.rps < kGsConsumers ? kGsConsumers / geo.rps : 1;
  const size_t smem = size_t(kGsStages * geo.stage_bytes) + size_t(R) * size_t(w.k) * 2 +
                      size_t(kGsStages) * kGsRed * R * 4 + 2 * kGsStages * sizeof(uint64_t);
  auto* kern = gemv_stream_kernel<FMT, R, TO>;
  if (smem > 48 * 1024) DIL_CUDA(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const bool vec = (reinterpret_cast<uintptr_t>(x) & 15) == 0 && ldx % 8 == 0;
  // One resident wave over all groups, each CTA a contiguous range of its group's stages.
  const int64_t n_st = ceil_div(w.n, geo.rps), wave = int64_t(c.resident(kern, kGsThreads, smem));
  const dim3 grid(unsigned(std::clamp<int64_t>(wave / gr.n, 1, n_st)), unsigned(gr.n));
  launch_pdl(c, "gemv_stream_kernel", kern, grid, dim3(kGsThreads), smem, reinterpret_cast<const uint16_t*>(x), ldx,
             int(T), w, geo, vec, out, ldo, gr.x_stride, gr.out_stride, act);
}

template <int FMT, class TO>
void launch_rows(Ctx& c, const bf16_t* x, int64_t ldx, int64_t T, const WView& w, TO* out, int64_t ldo,
                 const GvGroups& gr, int act) {
  if (T <= 1)
    launch<FMT, 1>(c, x, ldx, T, w, out, ldo, gr, act);
  else if (T <= 2)
    launch<FMT, 2>(c, x, ldx, T, w, out, ldo, gr, act);
  else if (T <= 4)
    launch<FMT, 4>(c, x, ldx, T, w, out, ldo, gr, act);
  else
    launch<FMT, 8>(c, x, ldx, T, w, out, ldo, gr, act);
}

}  // namespace

template <class TO>
void gemv_stream(Ctx& c, const bf16_t* x, int64_t ldx, int64_t T, const WView& w, TO* out, int64_t ldo,
                 const GvGroups& gr, int act) {
  DIL_CHECK(T >= 1 && T <= kGvMaxRows, "gemv_stream: ", T, " rows (at most ", kGvMaxRows, ")");
  DIL_CHECK(gr.n == 1, "gemv_stream: ", gr.n, " weight groups (grouped_linear runs gemv)");
  DIL_CHECK(act == 0 || (gv_stages_qdq(w.kind, w.k, act) && gr.n == 1), "gemv_stream: activation block ", act,
            " for K ", w.k, " (32 or 128 dividing K, FP8 weights, ungrouped)");
  DIL_CHECK(w.k % 32 == 0 && w.k <= kGvMaxK, "gemv_stream: K ", w.k, " (a multiple of 32, at most ", kGvMaxK, ")");
  DIL_CHECK((reinterpret_cast<uintptr_t>(w.w) & 15) == 0, "gemv_stream: weight rows not 16-byte aligned");
  switch (w.kind) {
    case 1:
      launch_rows<1>(c, x, ldx, T, w, out, ldo, gr, act);
      break;
    case 2:
      DIL_CHECK(gv_block_ok(w.bk), "gemv_stream: FP8 block ", w.bk, " not 16 x a power of two");
      launch_rows<2>(c, x, ldx, T, w, out, ldo, gr, act);
      break;
    case 3:
      launch_rows<3>(c, x, ldx, T, w, out, ldo, gr, act);
      break;
    default:
      DIL_FAIL("gemv_stream: weight kind ", w.kind, " (BF16, FP8 or FP4 only)");
  }
}
template void gemv_stream<float>(Ctx&, const bf16_t*, int64_t, int64_t, const WView&, float*, int64_t, const GvGroups&,
                                 int);
template void gemv_stream<bf16_t>(Ctx&, const bf16_t*, int64_t, int64_t, const WView&, bf16_t*, int64_t,
                                  const GvGroups&, int);

}  // namespace dil::cuda
