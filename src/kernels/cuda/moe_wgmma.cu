// Routed experts on Hopper warpgroup MMA (moe_wgmma.cuh has the numerics). Written here: no
// packaged kernel takes FP4 weights with E8M0 1x32 scales against FP8 activations with 1x128
// scales (CUTLASS's mixed-input GEMMs convert in registers with a group scale and no
// activation block scales; DeepGEMM has no FP4 on SM90).
//
// One persistent kernel per GEMM, 384 threads (3 warpgroups), one CTA per SM:
// - WG0, the converters: thread c owns row c of the CTA's 128 weight rows. Thread 0 loads the
//   FP4 tile of each step by TMA (each expert's weight has its own tensor map, made once per
//   expert list) into a ring kRaw - 1 steps ahead; every thread fetches its row's E8M0 scales
//   with cp.async alongside. Per step a thread waits for a free stage, converts its 64 (FP8) or
//   32 (BF16) bytes through byte-permute lookup tables into the stage's swizzled K-major B
//   tile, and arrives on the stage's full barrier. Thread 0 also issues the stage's TMA loads
//   (the 128 sorted token rows, and their scales on the FP8 path) and writes its metadata;
//   it prefetches those token rows into L2 when it fetches the step's weights (kRaw - 1 steps
//   ahead): the stage's own load can start only when the stage is free, too late to hide a
//   miss to HBM (measured: MMA warps waiting on full stages, converters on empty ones).
// - WG1, WG2, the MMA warpgroups: token rows 0-63 and 64-127 of the tile against all 128 weight
//   rows, 4 wgmma per stage (m64n128, k 32 per instruction for e4m3, 16 for bf16). FP8: the
//   stage's partial sum is promoted into the f32 accumulator with (token scale x block scale);
//   BF16: accumulated across stages in the tensor cores. Every MMA thread arrives on the stage's
//   empty barrier. The epilogue writes BF16 straight from the accumulators.
// A step is one stage: 128 K (FP8) or 64 K (BF16); a work item is (tile, weight-row block),
// items dealt round-robin over the CTAs, the block index fastest (the CTAs of a wave share a
// tile's token rows in L2).
#include <cuda_fp16.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstring>

#include "kernels/cuda/hopper.cuh"
#include "kernels/cuda/moe_wgmma.cuh"

namespace dil::cuda {

// ---- host: tensor maps ----
namespace sm90 {
CUtensorMap make_tmap_2d(const void* base, CUtensorMapDataType dt, uint64_t inner, uint64_t outer, uint64_t row_bytes,
                         uint32_t box_inner, uint32_t box_outer, CUtensorMapSwizzle sw) {
  static_assert(sizeof(CUtensorMap) == 128, "CUtensorMap");
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  DIL_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
  DIL_CHECK(fn != nullptr && q == cudaDriverEntryPointSuccess, "cuTensorMapEncodeTiled not found in the driver");
  auto encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  CUtensorMap m;
  const cuuint64_t dims[2] = {inner, outer};
  const cuuint64_t strides[1] = {row_bytes};
  const cuuint32_t box[2] = {box_inner, box_outer};
  const cuuint32_t estr[2] = {1, 1};
  const CUresult r = encode(&m, dt, 2, const_cast<void*>(base), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            sw, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  DIL_CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (", int(r), ") for [", outer, " x ", inner, "] box [",
            box_outer, " x ", box_inner, "]");
  return m;
}
}  // namespace sm90

namespace {
using namespace sm90;

constexpr int kThreads = 384;
constexpr int kWgSaBox = kWgBM + 4;  // token scales per TMA box: a tile's 128 from an aligned start
constexpr int kProdRegs = 104, kMmaRegs = 200;  // 128 x 104 + 256 x 200 = 65,536

constexpr int align16(int x) { return (x + 15) & ~15; }

template <bool kFp8>
struct Cfg {
  static constexpr int kStepK = kFp8 ? 128 : 64;    // K elements per step: 128-byte operand rows
  static constexpr int kRawBytes = kStepK / 2;       // FP4 bytes of a weight row per step
  static constexpr int kRawTile = 128 * kRawBytes;   // one step's FP4 tile (TMA, 64B / 32B swizzle)
  // MMA stages; FP4 ring depth (weights stream from HBM: the deeper ring keeps ~56 KB in
  // flight per SM, what HBM latency times the MMA's consumption rate needs).
  static constexpr int kStages = kFp8 ? 4 : 5, kRaw = 8;
  static constexpr int kTile = 128 * 128;            // bytes of one A or B stage tile
  static constexpr int oA = 0;                                        // [kStages] A tiles (TMA, 128B swizzle)
  static constexpr int oB = oA + kStages * kTile;                     // [kStages] B tiles (converters)
  static constexpr int oRaw = oB + kStages * kTile;                   // [kRaw][128 rows][kRawBytes] FP4 (swizzled)
  static constexpr int oRsc = oRaw + kRaw * kRawTile;                 // [kRaw][128] uint2: scales, block max
  static constexpr int kSaLd = 640;                                   // bytes per stage: 132 f32 + padding to 128 B
  static constexpr int oSa = oRsc + kRaw * 128 * 8;                   // [kStages][132] f32 token scales
  static constexpr int oMeta = oSa + kStages * kSaLd;                 // [kStages] int4: r0, rows, block, promo
  static constexpr int oRmeta = align16(oMeta + kStages * 16);        // [kRaw] int2: r0, rows (thread 0)
  static constexpr int oLut = align16(oRmeta + kRaw * 8);             // FP8 [16] uint2 / BF16 [256] uint4
  static constexpr int oBar = oLut + (kFp8 ? 16 * 8 : 256 * 16);      // full[kStages], empty[kStages], raw[kRaw]
  static constexpr int kSmem = oBar + (2 * kStages + kRaw) * 8 + 1024; // + the base's 1024-byte alignment
  static_assert(oRaw % 1024 == 0 && oSa % 128 == 0 && oBar % 8 == 0 && kSmem <= 232448, "shared memory layout");
};

// One tile's weight sources (the tile map resolved once per call, so the converters' look-ahead
// needs no dependent loads): the tensor maps of the experts' FP4 weights and their E8M0 scales,
// first (w1 / w2) and second (w3) weight, the tile's first sorted row, its valid rows and expert.
struct TileRec {
  const CUtensorMap* ma;  // FP4 tile maps (device memory)
  const uint8_t* sa;
  const CUtensorMap* mb;
  const uint8_t* sb;
  int r0, rows, e, pad;
};

struct WgArgs {
  const TileRec* recs;
  const int32_t* n_tiles;
  const uint32_t* smax;  // FP8: [E][n_nb][nk] largest E8M0 scale of each 128 x 128 block
  int n_nb, nk;          // weight-row blocks per tile, steps per item
  int64_t K, scale_cols; // GEMM K; E8M0 columns per weight row (K / 32)
  uint16_t* out;         // bf16 [sorted rows, ldo]
  int64_t ldo;
  const float* route_w;  // SwiGLU: [T, k] routing weights, by sorted_pair
  const int32_t* sorted_pair;
  float lim;
};


// 8 e2m1 nibbles -> 8 bf16 in four words, through the group's tables (t.x, t.y: low bytes of the
// bf16 magnitudes 0, .5, .., 6 times 2^(s-127); t.z, t.w: their high bytes).
__device__ __forceinline__ uint4 nib8_bf16(uint32_t w, uint4 t) {
  const uint32_t mag = w & 0x77777777u;
  const uint32_t lo0 = prmt(t.x, t.y, mag), hi0 = prmt(t.z, t.w, mag) | signs_lo(w);
  const uint32_t lo1 = prmt(t.x, t.y, mag >> 16), hi1 = prmt(t.z, t.w, mag >> 16) | signs_hi(w);
  return make_uint4(prmt(lo0, hi0, 0x5140u), prmt(lo0, hi0, 0x7362u), prmt(lo1, hi1, 0x5140u), prmt(lo1, hi1, 0x7362u));
}

__device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {
  return (__float_as_uint(d_round_bf16(lo)) >> 16) | (__float_as_uint(d_round_bf16(hi)) & 0xffff0000u);
}

template <bool kFp8, bool kSwiglu>
__global__ void __launch_bounds__(kThreads, 1)
    moe_wg_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_sa, WgArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = Cfg<kFp8>;
  extern __shared__ uint8_t smem_raw[];
  // 1024-byte aligned base, by an offset into the shared array (so the compiler keeps the
  // accesses in the shared window: LDS/STS, not generic loads).
  uint8_t* sm = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  uint64_t* full = reinterpret_cast<uint64_t*>(sm + C::oBar);
  uint64_t* empty = full + C::kStages;
  uint64_t* rawb = empty + C::kStages;
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      mbar_init(&full[s], 129);   // thread 0's expect_tx arrival + 128 converters (+ the TMA bytes)
      mbar_init(&empty[s], 256);  // every MMA thread
    }
    for (int r = 0; r < C::kRaw; ++r) mbar_init(&rawb[r], 1);  // thread 0's expect_tx (+ the FP4 tile's bytes)
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    prefetch_tmap(&tm_a);
    if (kFp8) prefetch_tmap(&tm_sa);
  }
  // Conversion tables (exact values, so any correct conversion gives the same bytes).
  if (kFp8) {
    // Entry 15 (zeros): a block the load check refused.
    if (tid < 16) reinterpret_cast<uint2*>(sm + C::oLut)[tid] = e2m1_e4m3_table(tid);
  } else if (tid < 256) {  // entry s: bf16 of the magnitudes times 2^(s - 127), low and high bytes
    const float mags[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
    uint32_t lo[2] = {0u, 0u}, hi[2] = {0u, 0u};
    for (int j = 0; j < 8; ++j) {
      const uint32_t bits = __float_as_uint(ldexpf(mags[j], tid - 127)) >> 16;  // exact: low 16 bits are 0
      lo[j / 4] |= (bits & 0xffu) << (8 * (j % 4));
      hi[j / 4] |= (bits >> 8) << (8 * (j % 4));
    }
    reinterpret_cast<uint4*>(sm + C::oLut)[tid] = make_uint4(lo[0], lo[1], hi[0], hi[1]);
  }
  __syncthreads();
  const int total = *a.n_tiles * a.n_nb;

  if (tid < 128) {
    // ---------------- converters (+ TMA issue by thread 0) ----------------
    setmaxnreg_dec<kProdRegs>();
    const int c = tid;
    const bool first = !kSwiglu || c < 64;  // w1 (or w2) row; else the w3 row
    const int64_t row_in = kSwiglu ? (c & 63) : c, blk_rows = kSwiglu ? 64 : 128;
    // Look-ahead iterator: step (f_item, f_kb) of weight-row block f_nb, its tile record, the
    // next item's record.
    int f_item = blockIdx.x, f_kb = 0, f_nb = f_item % a.n_nb;
    TileRec fr{}, fn{};
    if (f_item < total) fr = a.recs[f_item / a.n_nb];
    int f_next = f_item + int(gridDim.x);
    if (f_next < total) fn = a.recs[f_next / a.n_nb];
    int f_slot = 0;
    // Step (f_item, f_kb) into ring slot f_slot: its FP4 tile by TMA (thread 0; the slot was
    // last read in the step before, which every converter has finished: named barrier), and
    // each row's scales by cp.async (one group per step).
    auto fetch = [&]() {
      if (f_item < total) {
        const int nb = f_nb;
        const int64_t row = nb * blk_rows + row_in;
        if (c == 0) {
          // The step's token rows into L2 now, kRaw - 1 steps ahead of their TMA load into a
          // stage (which waits for a free stage, too late to cover a miss to HBM).
          tma_prefetch_2d(&tm_a, f_kb * C::kStepK, fr.r0);
          uint8_t* dst = sm + C::oRaw + f_slot * C::kRawTile;
          mbar_arrive_expect_tx(&rawb[f_slot], C::kRawTile);
          if (kSwiglu) {  // rows 0-63: w1's, 64-127: the same rows of w3
            tma_load_2d(dst, fr.ma, &rawb[f_slot], f_kb * C::kRawBytes, int(nb * 64));
            tma_load_2d(dst + C::kRawTile / 2, fr.mb, &rawb[f_slot], f_kb * C::kRawBytes, int(nb * 64));
          } else {
            tma_load_2d(dst, fr.ma, &rawb[f_slot], f_kb * C::kRawBytes, int(nb * 128));
          }
        }
        uint32_t* rsc = reinterpret_cast<uint32_t*>(sm + C::oRsc) + (f_slot * 128 + c) * 2;
        // FP8: the 4 scales of the step; BF16: the word holding the step's 2 (4-byte aligned).
        cp_async4(rsc, (first ? fr.sa : fr.sb) + row * a.scale_cols + (kFp8 ? f_kb * 4 : (f_kb >> 1) * 4), 4);
        if (kFp8) cp_async4(rsc + 1, a.smax + (int64_t(fr.e) * a.n_nb + nb) * a.nk + f_kb, 4);
        if (c == 0) reinterpret_cast<int2*>(sm + C::oRmeta)[f_slot] = make_int2(fr.r0, fr.rows);
        if (++f_kb == a.nk) {
          f_kb = 0;
          f_item = f_next;
          f_nb = f_item % a.n_nb;
          fr = fn;
          f_next += int(gridDim.x);
          if (f_next < total) fn = a.recs[f_next / a.n_nb];
        }
      }
      cp_async_commit();  // one group per step, empty past the end
      f_slot = f_slot + 1 == C::kRaw ? 0 : f_slot + 1;
    };
#pragma unroll 1
    for (int i = 0; i < C::kRaw - 1; ++i) fetch();

    int s = 0, slot = 0;
    uint32_t ph = 0, rph = 0;
#pragma unroll 1
    for (int item = blockIdx.x; item < total; item += gridDim.x) {
      const int nb = item % a.n_nb;
#pragma unroll 1
      for (int kb = 0; kb < a.nk; ++kb) {
        named_sync(1, 128);  // every converter is done with the previous step's ring slot
        fetch();
        cp_async_wait<C::kRaw - 1>();  // this step's scales (committed kRaw - 1 groups ago) landed
        const uint2 sw = reinterpret_cast<const uint2*>(sm + C::oRsc)[slot * 128 + c];
        const uint8_t* raw = sm + C::oRaw + slot * C::kRawTile + c * C::kRawBytes;
        mbar_wait(&rawb[slot], rph);
        mbar_wait(&empty[s], ph ^ 1);
        uint8_t* bt = sm + C::oB + s * C::kTile;
        if (c == 0) {
          const int2 rm = reinterpret_cast<const int2*>(sm + C::oRmeta)[slot];
          mbar_arrive_expect_tx(&full[s], C::kTile + (kFp8 ? kWgSaBox * 4 : 0));
          tma_load_2d(sm + C::oA + s * C::kTile, &tm_a, &full[s], kb * C::kStepK, rm.x);
          // The scales from the 16-byte-aligned column at or below r0 (a TMA box's inner start
          // must be 16-byte aligned: an unaligned one faults as an illegal instruction).
          if (kFp8) tma_load_2d(sm + C::oSa + s * C::kSaLd, &tm_sa, &full[s], rm.x & ~3, kb);
          // The partial sums' block factor: e4m3 weight values are the true ones times 2^(133 - smax).
          const float promo = kFp8 ? ldexpf(1.0f, int(sw.y) - 133) : 0.f;
          reinterpret_cast<int4*>(sm + C::oMeta)[s] = make_int4(rm.x, rm.y, nb, __float_as_int(promo));
        }
        if (kFp8) {
          const uint2* lut = reinterpret_cast<const uint2*>(sm + C::oLut);
#pragma unroll
          for (int i = 0; i < 4; ++i) {  // scale group i: k 32i..32i+31, chunks 2i and 2i+1
            // 64-byte swizzle: 16-byte chunk i of row c sits at chunk i ^ ((c / 2) % 4).
            const uint4 q = *reinterpret_cast<const uint4*>(raw + 16 * (i ^ ((c >> 1) & 3)));
            const int d = int((sw.x >> (8 * i)) & 0xffu) - int(sw.y) + 6;
            const uint2 t = lut[d >= -8 && d <= 6 ? d + 8 : 15];
            uint4 o0, o1;
            nib8_e4m3(q.x, t, o0.x, o0.y);
            nib8_e4m3(q.y, t, o0.z, o0.w);
            nib8_e4m3(q.z, t, o1.x, o1.y);
            nib8_e4m3(q.w, t, o1.z, o1.w);
            *reinterpret_cast<uint4*>(bt + sw128_offset(c, 2 * i)) = o0;
            *reinterpret_cast<uint4*>(bt + sw128_offset(c, 2 * i + 1)) = o1;
          }
        } else {
          const uint4* lut = reinterpret_cast<const uint4*>(sm + C::oLut);
          const uint32_t sc = (sw.x >> ((kb & 1) * 16)) & 0xffffu;
#pragma unroll
          for (int i = 0; i < 2; ++i) {  // scale group i: k 32i..32i+31, chunks 4i..4i+3
            // 32-byte swizzle: 16-byte chunk i of row c sits at chunk i ^ ((c / 4) % 2).
            const uint4 q = *reinterpret_cast<const uint4*>(raw + 16 * (i ^ ((c >> 2) & 1)));
            const uint4 t = lut[(sc >> (8 * i)) & 0xffu];
            *reinterpret_cast<uint4*>(bt + sw128_offset(c, 4 * i + 0)) = nib8_bf16(q.x, t);
            *reinterpret_cast<uint4*>(bt + sw128_offset(c, 4 * i + 1)) = nib8_bf16(q.y, t);
            *reinterpret_cast<uint4*>(bt + sw128_offset(c, 4 * i + 2)) = nib8_bf16(q.z, t);
            *reinterpret_cast<uint4*>(bt + sw128_offset(c, 4 * i + 3)) = nib8_bf16(q.w, t);
          }
        }
        fence_proxy_async();  // the B tile is read by wgmma (the async proxy)
        mbar_arrive(&full[s]);
        if (++slot == C::kRaw) {
          slot = 0;
          rph ^= 1;
        }
        if (++s == C::kStages) {
          s = 0;
          ph ^= 1;
        }
      }
    }
    cp_async_wait<0>();
  } else {
    // ---------------- MMA warpgroups ----------------
    setmaxnreg_inc<kMmaRegs>();
    const int wg = tid / 128 - 1, warp = (tid / 32) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int lr0 = wg * 64 + warp * 16 + g;  // this thread's accumulator rows: lr0, lr0 + 8
    float acc[64];
    float part[64];  // FP8: one stage's partial sums (unused on the BF16 path)
    // Descriptor low words of stage 0's A (this warpgroup's 64 rows) and B tiles; a stage adds
    // kTile >> 4, a k step 2 (32-bit adds: see desc_k128b_lo).
    const uint32_t a_lo0 = desc_k128b_lo(smem_u32(sm + C::oA + wg * 8192)), b_lo0 = desc_k128b_lo(smem_u32(sm + C::oB));
    int s = 0;
    uint32_t ph = 0;
#pragma unroll 1
    for (int item = blockIdx.x; item < total; item += gridDim.x) {
      int r0 = 0, rows = 0, nb = 0, p0 = -1, p1 = -1;
      float rw0 = 0.f, rw1 = 0.f;
      if constexpr (kFp8) {
        // -0: fma(p, s, -0) is the product p * s exactly as a multiply rounds it, signed zeros
        // included, so every step promotes with one FFMA.
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[i] = -0.0f;
      }
#pragma unroll 1
      for (int kb = 0; kb < a.nk; ++kb) {
        mbar_wait(&full[s], ph);
        const int4 meta = reinterpret_cast<const int4*>(sm + C::oMeta)[s];
        if (kb == 0) {
          r0 = meta.x;
          rows = meta.y;
          nb = meta.z;
          if (kSwiglu) {
            p0 = lr0 < rows ? a.sorted_pair[r0 + lr0] : -1;
            p1 = lr0 + 8 < rows ? a.sorted_pair[r0 + lr0 + 8] : -1;
          }
        }
        const bool active = wg * 64 < rows;  // warpgroup-uniform
        float sc0 = 0.f, sc1 = 0.f;
        if (active) {
          const uint32_t a_lo = a_lo0 + uint32_t(s) * (C::kTile >> 4), b_lo = b_lo0 + uint32_t(s) * (C::kTile >> 4);
          wgmma_fence();
          if constexpr (kFp8) {
            fence_regs(part);
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
              wgmma_m64n128k32_e4m3(part, desc_k128b_from_lo(a_lo + 2 * kk), desc_k128b_from_lo(b_lo + 2 * kk), kk);
          } else {
            fence_regs(acc);
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
              wgmma_m64n128k16_bf16(acc, desc_k128b_from_lo(a_lo + 2 * kk), desc_k128b_from_lo(b_lo + 2 * kk), kb | kk);
          }
          wgmma_commit();
          wgmma_wait<0>();
          if constexpr (kFp8) {
            fence_regs(part);
            const float promo = __int_as_float(meta.w);
            const float* sa = reinterpret_cast<const float*>(sm + C::oSa + s * C::kSaLd) + (meta.x & 3);
            sc0 = sa[lr0] * promo;
            sc1 = sa[lr0 + 8] * promo;
          } else {
            fence_regs(acc);
          }
        }
        mbar_arrive(&empty[s]);
        if (kFp8 && active) {
#pragma unroll
          for (int j = 0; j < 16; ++j) {
            acc[4 * j] = fmaf(part[4 * j], sc0, acc[4 * j]);
            acc[4 * j + 1] = fmaf(part[4 * j + 1], sc0, acc[4 * j + 1]);
            acc[4 * j + 2] = fmaf(part[4 * j + 2], sc1, acc[4 * j + 2]);
            acc[4 * j + 3] = fmaf(part[4 * j + 3], sc1, acc[4 * j + 3]);
          }
        }
        if (kSwiglu && kb == min(1, a.nk - 1)) {  // the pair indices arrived during step 0
          rw0 = p0 >= 0 ? a.route_w[p0] : 0.f;
          rw1 = p1 >= 0 ? a.route_w[p1] : 0.f;
        }
        if (++s == C::kStages) {
          s = 0;
          ph ^= 1;
        }
      }
      if (wg * 64 >= rows) continue;
      // Epilogue: rows lr0 (h = 0) and lr0 + 8 (h = 1) of the tile, columns 8j + 2t, + 1.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int lr = lr0 + 8 * h;
        if (lr >= rows) continue;
        if (kSwiglu) {
          // h = bf16(silu(min(bf16(g), L)) * clamp(bf16(u), -L, L) * w): columns 0-63 are g
          // (w1 rows), 64-127 u (the same features' w3 rows); the CPU fast path's f32 steps.
          const float rw = h ? rw1 : rw0;
          uint16_t* o = a.out + int64_t(r0 + lr) * a.ldo + int64_t(nb) * 64 + 2 * t;
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            float hv[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float gv = fminf(d_round_bf16(acc[4 * j + 2 * h + e]), a.lim);
              const float uv = fminf(fmaxf(d_round_bf16(acc[4 * (j + 8) + 2 * h + e]), -a.lim), a.lim);
              hv[e] = d_silu(gv) * uv * rw;
            }
            *reinterpret_cast<uint32_t*>(o + 8 * j) = bf16x2_bits(hv[0], hv[1]);
          }
        } else {
          uint16_t* o = a.out + int64_t(r0 + lr) * a.ldo + int64_t(nb) * 128 + 2 * t;
#pragma unroll
          for (int j = 0; j < 16; ++j)
            *reinterpret_cast<uint32_t*>(o + 8 * j) = bf16x2_bits(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
        }
      }
    }
  }
#endif
}

// Tile records of one GEMM (tb null: the second weight is unused; ma / mb: the experts' maps).
__global__ void moe_wg_recs_kernel(MoeTileMap map, const WView* ta, const WView* tb, const CUtensorMap* ma,
                                   const CUtensorMap* mb, int max_tiles, TileRec* recs) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= max_tiles || i >= *map.n_tiles) return;
  const int e = map.tile_e[i], r0 = map.tile_r0[i];
  TileRec r;
  r.ma = ma + e;
  r.sa = ta[e].scale;
  r.mb = tb ? mb + e : ma + e;
  r.sb = tb ? tb[e].scale : ta[e].scale;
  r.r0 = r0;
  r.rows = min(kWgBM, map.offsets[e + 1] - r0);
  r.e = e;
  r.pad = 0;
  recs[i] = r;
}

// Largest E8M0 scale of every (expert, weight-row block, 128-K block) as the kernel's CTAs see
// them (pair: 64 rows of ta and the same 64 of tb; else 128 rows of ta), and a flag when a block
// cannot be converted exactly: scales spanning more than 14 binades, a NaN scale (255), or a
// block factor 2^(smax - 133) below f32's normal range (smax < 7).
__global__ void moe_wg_smax_kernel(const WView* ta, const WView* tb, int n_nb, int nk, uint32_t* smax, int* misfit) {
  const int kb = blockIdx.x, nb = blockIdx.y, e = blockIdx.z, c = threadIdx.x;
  const WView& w = (!tb || c < 64) ? ta[e] : tb[e];
  const int64_t row = tb ? int64_t(nb) * 64 + (c & 63) : int64_t(nb) * 128 + c;
  const uint32_t sc = *reinterpret_cast<const uint32_t*>(w.scale + row * w.scale_cols + int64_t(kb) * 4);
  int mx = 0, mn = 255;
  for (int i = 0; i < 4; ++i) {
    const int b = int((sc >> (8 * i)) & 0xffu);
    mx = max(mx, b);
    mn = min(mn, b);
  }
  for (int o = 16; o > 0; o >>= 1) {
    mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    mn = min(mn, __shfl_xor_sync(0xffffffffu, mn, o));
  }
  __shared__ int wmx[4], wmn[4];
  if ((c & 31) == 0) {
    wmx[c / 32] = mx;
    wmn[c / 32] = mn;
  }
  __syncthreads();
  if (c != 0) return;
  for (int i = 1; i < 4; ++i) {
    mx = max(mx, wmx[i]);
    mn = min(mn, wmn[i]);
  }
  smax[(int64_t(e) * n_nb + nb) * nk + kb] = uint32_t(mx);
  if (mx - mn > 14 || mx == 255 || mx < 7) atomicOr(misfit, 1);
}

// Warp per (row, 128 columns), 4 columns per lane; act_block 128 (codes + scales) or 32 (QDQ'd
// bf16), as fp8_qdq: s = pow2_ceil(max(amax, 1e-4) / 448), q = e4m3(clamp(x / s, +-448)).
template <bool kFp8>
__global__ void moe_wg_quant_kernel(const bf16_t* x, const int32_t* gather, const int32_t* n_rows, int64_t rows_max,
                                    int64_t D, uint8_t* q8, float* sx, int64_t ld_sx, bf16_t* qb) {
  const int64_t nc = D / 128;
  const int64_t gw = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (gw >= rows_max * nc) return;
  const int64_t r = gw / nc, cb = gw % nc;
  if (r >= *n_rows) return;
  const int64_t src = gather ? gather[r] : r;
  const uint2 raw = *reinterpret_cast<const uint2*>(x + src * D + cb * 128 + lane * 4);
  float v[4] = {__uint_as_float(raw.x << 16), __uint_as_float(raw.x & 0xffff0000u), __uint_as_float(raw.y << 16),
                __uint_as_float(raw.y & 0xffff0000u)};
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
  for (int o = kFp8 ? 16 : 4; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = d_act_scale(amax);
  for (int e = 0; e < 4; ++e) v[e] = fminf(fmaxf(v[e] / s, -448.f), 448.f);
  const uint32_t codes = e4m3x4(v[0], v[1], v[2], v[3]);
  if (kFp8) {
    *reinterpret_cast<uint32_t*>(q8 + r * D + cb * 128 + lane * 4) = codes;
    if (lane == 0) sx[cb * ld_sx + r] = s;
  } else {
    const float2 a = e4m3x2_value(uint16_t(codes & 0xffffu)), b = e4m3x2_value(uint16_t(codes >> 16));
    *reinterpret_cast<uint2*>(qb + r * D + cb * 128 + lane * 4) =
        make_uint2(bf16x2_bits(a.x * s, a.y * s), bf16x2_bits(b.x * s, b.y * s));  // exact products
  }
}

// out[t] = the sum over the token's k slots (k ascending) of its slot rows of y (bf16), in
// double, rounded once to f32 and then to out's dtype (moe_combine_kernel's order).
template <class TO>
__global__ void moe_wg_combine_kernel(const uint16_t* y, const int32_t* pos_of, int64_t T, int k, int64_t D, TO* out) {
  const int64_t n = T * (D / 8);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / (D / 8), c0 = (i % (D / 8)) * 8;
    double acc[8] = {};
    for (int j = 0; j < k; ++j) {
      const int p = pos_of[t * k + j];
      if (p < 0) continue;
      const uint4 v = *reinterpret_cast<const uint4*>(y + int64_t(p) * D + c0);
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        acc[2 * e] += double(__uint_as_float(w[e] << 16));
        acc[2 * e + 1] += double(__uint_as_float(w[e] & 0xffff0000u));
      }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) st_act(out + t * D + c0 + e, float(acc[e]));
  }
}

int sm_count(int device) {
  int n = 0;
  DIL_CUDA(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  return n;
}

template <bool kFp8, bool kSwiglu>
void launch_gemm(Ctx& c, const CUtensorMap& ta, const CUtensorMap& tsa, const WgArgs& a) {
  auto k = moe_wg_kernel<kFp8, kSwiglu>;
  DIL_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg<kFp8>::kSmem));
  k<<<unsigned(sm_count(c.device)), kThreads, Cfg<kFp8>::kSmem, c.stream>>>(ta, tsa, a);
  DIL_LAUNCH_CHECK("moe_wg_kernel");
}

// Once per expert list (its first call, at load's profiling step): the tensor maps of the
// experts' FP4 weights, and on the FP8 path the block maxima and the fit check.
const Ctx::MoeWgPrep& prepare(Ctx& c, const MoeWgmmaCall& m) {
  std::vector<WView> key;
  for (const std::vector<Weight>* ws : {m.w1, m.w2, m.w3})
    for (const Weight& w : *ws) key.push_back(make_wview(w));
  Ctx::MoeWgPrep& p = c.moe_wg[m.w1];
  if (p.act_block == m.act_block && p.key.size() == key.size() &&
      std::memcmp(p.key.data(), key.data(), key.size() * sizeof(WView)) == 0)
    return p;
  p.key = std::move(key);
  p.act_block = m.act_block;
  const int E = m.E;
  const bool fp8 = m.act_block == 128;
  // Maps: [K/2 bytes, rows] uint8, box (one step's bytes, 64 rows for w1/w3 | 128 for w2),
  // swizzled as the converters read them (64 B rows: 64B swizzle; 32 B rows: 32B).
  {
    const uint32_t box_in = fp8 ? 64 : 32;
    const CUtensorMapSwizzle sw = fp8 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_32B;
    std::vector<CUtensorMap> maps(size_t(3) * E);
    for (int e = 0; e < E; ++e) {
      const Weight* ws[3] = {&(*m.w1)[size_t(e)], &(*m.w3)[size_t(e)], &(*m.w2)[size_t(e)]};
      for (int j = 0; j < 3; ++j) {
        const Weight& w = *ws[j];
        maps[size_t(j) * E + e] = make_tmap_2d(w.w.data, CU_TENSOR_MAP_DATA_TYPE_UINT8, uint64_t(w.in / 2),
                                               uint64_t(w.out), uint64_t(w.in / 2), box_in, j == 2 ? 128 : 64, sw);
      }
    }
    p.maps = c.arena->get(maps.size() * sizeof(CUtensorMap));
    // Synchronous (a pageable source): the maps are in place before any kernel reads them.
    DIL_CUDA(cudaMemcpyAsync(p.maps.data(), maps.data(), maps.size() * sizeof(CUtensorMap), cudaMemcpyHostToDevice,
                             c.stream));
    DIL_CUDA(cudaStreamSynchronize(c.stream));
  }
  if (!fp8) {
    p.fit = true;
    return p;
  }
  const int n13 = int(m.I / 64), nk13 = int(m.D / 128), n2 = int(m.D / 128), nk2 = int(m.I / 128);
  p.smax13 = c.arena->get(size_t(E) * n13 * nk13 * 4);
  p.smax2 = c.arena->get(size_t(E) * n2 * nk2 * 4);
  Buffer flag = c.arena->get(4);
  DIL_CUDA(cudaMemsetAsync(flag.data(), 0, 4, c.stream));
  int* f = static_cast<int*>(flag.data());
  moe_wg_smax_kernel<<<dim3(unsigned(nk13), unsigned(n13), unsigned(E)), 128, 0, c.stream>>>(
      m.t1, m.t3, n13, nk13, static_cast<uint32_t*>(p.smax13.data()), f);
  DIL_LAUNCH_CHECK("moe_wg_smax_kernel");
  moe_wg_smax_kernel<<<dim3(unsigned(nk2), unsigned(n2), unsigned(E)), 128, 0, c.stream>>>(
      m.t2, nullptr, n2, nk2, static_cast<uint32_t*>(p.smax2.data()), f);
  DIL_LAUNCH_CHECK("moe_wg_smax_kernel");
  int misfit = 0;
  // Once per expert list (the first call, at load's profiling step): the host decides the path.
  DIL_CUDA(cudaMemcpyAsync(&misfit, f, 4, cudaMemcpyDeviceToHost, c.stream));
  DIL_CUDA(cudaStreamSynchronize(c.stream));
  p.fit = misfit == 0;
  return p;
}

}  // namespace

bool moe_wgmma_fits(const std::vector<Weight>& w1, const std::vector<Weight>& w2, const std::vector<Weight>& w3,
                    int act_block) {
  if ((act_block != 128 && act_block != 32) || w1.empty() || w2.size() != w1.size() || w3.size() != w1.size())
    return false;
  const int64_t I = w1[0].out, D = w1[0].in;
  for (const std::vector<Weight>* ws : {&w1, &w2, &w3})
    for (const Weight& w : *ws) {
      const bool down = ws == &w2;
      if (w.kind != Weight::Kind::FP4 || w.scale.empty() || w.out != (down ? D : I) || w.in != (down ? I : D) ||
          (reinterpret_cast<uintptr_t>(w.w.data) & 15) != 0 || (reinterpret_cast<uintptr_t>(w.scale.data) & 3) != 0)
        return false;
    }
  return D % 128 == 0 && I % 128 == 0;
}

void moe_wg_quant(Ctx& c, const bf16_t* x, const int32_t* gather, const int32_t* n_rows, int64_t rows_max, int64_t D,
                  int block, uint8_t* q8, float* sx, int64_t ld_sx, bf16_t* qb) {
  DIL_CHECK(D % 128 == 0 && (block == 128 || block == 32), "moe_wg_quant: D ", D, " block ", block);
  const int64_t warps = rows_max * (D / 128);
  if (warps == 0) return;
  if (block == 128)
    moe_wg_quant_kernel<true><<<grid_for(warps * 32, 256), 256, 0, c.stream>>>(x, gather, n_rows, rows_max, D, q8, sx,
                                                                               ld_sx, qb);
  else
    moe_wg_quant_kernel<false><<<grid_for(warps * 32, 256), 256, 0, c.stream>>>(x, gather, n_rows, rows_max, D, q8, sx,
                                                                                ld_sx, qb);
  DIL_LAUNCH_CHECK("moe_wg_quant_kernel");
}

bool moe_wgmma(Ctx& c, const MoeWgmmaCall& m) {
  const bool fp8 = m.act_block == 128;
  DIL_CHECK(moe_wgmma_fits(*m.w1, *m.w2, *m.w3, m.act_block), "moe_wgmma: experts this path cannot run");
  const Ctx::MoeWgPrep& prep = prepare(c, m);
  if (!prep.fit) return false;
  const CUtensorMap* maps = static_cast<const CUtensorMap*>(prep.maps.data());
  const int64_t T = m.T, D = m.D, I = m.I, Tk = T * m.k, Tk_pad = (Tk + 3) / 4 * 4;
  const int32_t* n_rows = m.map.offsets + m.E;  // sorted rows held here (device)
  const int n13 = int(I / 64), n2 = int(D / 128);

  // Tile records (w1/w3 and w2).
  Buffer rb = c.scratch(size_t(m.max_tiles) * 2 * sizeof(TileRec));
  TileRec* rec13 = static_cast<TileRec*>(rb.data());
  TileRec* rec2 = rec13 + m.max_tiles;
  moe_wg_recs_kernel<<<grid_for(m.max_tiles, 128), 128, 0, c.stream>>>(m.map, m.t1, m.t3, maps, maps + m.E,
                                                                       m.max_tiles, rec13);
  DIL_LAUNCH_CHECK("moe_wg_recs_kernel");
  moe_wg_recs_kernel<<<grid_for(m.max_tiles, 128), 128, 0, c.stream>>>(m.map, m.t2, nullptr, maps + 2 * m.E, nullptr,
                                                                       m.max_tiles, rec2);
  DIL_LAUNCH_CHECK("moe_wg_recs_kernel");

  // Operand buffers, sorted rows: tokens and h quantized ([Tk, D] / [Tk, I] e4m3 codes with
  // [K/128, Tk_pad] f32 scales, or QDQ'd bf16), h and y in bf16.
  const size_t ab = fp8 ? 1 : 2;
  Buffer xq = c.scratch(size_t(Tk) * D * ab), hq = c.scratch(size_t(Tk) * I * ab);
  Buffer sx = c.scratch(fp8 ? size_t(D / 128) * Tk_pad * 4 : 16), sh = c.scratch(fp8 ? size_t(I / 128) * Tk_pad * 4 : 16);
  Buffer hb = c.scratch(size_t(Tk) * I * 2), yb = c.scratch(size_t(Tk) * D * 2);
  float* sxp = static_cast<float*>(sx.data());
  float* shp = static_cast<float*>(sh.data());
  moe_wg_quant(c, m.x, m.sorted_tok, n_rows, Tk, D, m.act_block, static_cast<uint8_t*>(xq.data()), sxp, Tk_pad,
               static_cast<bf16_t*>(xq.data()));

  const CUtensorMapDataType adt = fp8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const uint32_t box_k = fp8 ? 128 : 64;
  auto a_map = [&](const Buffer& b, int64_t K) {
    return make_tmap_2d(b.data(), adt, uint64_t(K), uint64_t(Tk), uint64_t(K) * ab, box_k, kWgBM,
                        CU_TENSOR_MAP_SWIZZLE_128B);
  };
  auto s_map = [&](const Buffer& b, int64_t K) {
    return fp8 ? make_tmap_2d(b.data(), CU_TENSOR_MAP_DATA_TYPE_FLOAT32, uint64_t(Tk_pad), uint64_t(K / 128),
                              uint64_t(Tk_pad) * 4, kWgSaBox, 1, CU_TENSOR_MAP_SWIZZLE_NONE)
               : CUtensorMap{};
  };

  WgArgs g13{};
  g13.recs = rec13;
  g13.n_tiles = m.map.n_tiles;
  g13.smax = fp8 ? static_cast<const uint32_t*>(prep.smax13.data()) : nullptr;
  g13.n_nb = n13;
  g13.nk = int(D / (fp8 ? 128 : 64));
  g13.K = D;
  g13.scale_cols = D / 32;
  g13.out = static_cast<uint16_t*>(hb.data());
  g13.ldo = I;
  g13.route_w = m.route_w;
  g13.sorted_pair = m.sorted_pair;
  g13.lim = m.lim;
  const CUtensorMap ax = a_map(xq, D), asx = s_map(sx, D);
  if (fp8) launch_gemm<true, true>(c, ax, asx, g13);
  else launch_gemm<false, true>(c, ax, asx, g13);

  moe_wg_quant(c, static_cast<const bf16_t*>(hb.data()), nullptr, n_rows, Tk, I, m.act_block,
               static_cast<uint8_t*>(hq.data()), shp, Tk_pad, static_cast<bf16_t*>(hq.data()));

  WgArgs g2 = g13;
  g2.recs = rec2;
  g2.smax = fp8 ? static_cast<const uint32_t*>(prep.smax2.data()) : nullptr;
  g2.n_nb = n2;
  g2.nk = int(I / (fp8 ? 128 : 64));
  g2.K = I;
  g2.scale_cols = I / 32;
  g2.out = static_cast<uint16_t*>(yb.data());
  g2.ldo = D;
  const CUtensorMap ah = a_map(hq, I), ash = s_map(sh, I);
  if (fp8) launch_gemm<true, false>(c, ah, ash, g2);
  else launch_gemm<false, false>(c, ah, ash, g2);

  with_act(m.out, "moe_experts out", [&](auto to) {
    using TO = decltype(to);
    const int64_t n = T * (D / 8);
    moe_wg_combine_kernel<TO><<<stride_grid(n), 256, 0, c.stream>>>(
        static_cast<const uint16_t*>(yb.data()), m.pos_of, T, m.k, D, m.out.ptr<TO>());
  });
  DIL_LAUNCH_CHECK("moe_wg_combine_kernel");
  return true;
}

}  // namespace dil::cuda
