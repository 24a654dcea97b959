// Hopper (sm_90a) primitives shared by the warpgroup kernels (moe_wgmma.cu): shared-memory
// matrix descriptors, wgmma, mbarriers, TMA tile loads and the tensor maps they read. Written
// here from the PTX ISA (9.7.15 wgmma, 9.7.9.25 cp.async.bulk.tensor, 9.7.13.15 mbarrier); only
// the instruction shapes the kernels use. Device code compiles for sm_90a only (wgmma and
// setmaxnreg do not exist on plain sm_90); the host helpers compile everywhere.
#pragma once
#include <cuda.h>  // CUtensorMap (a plain struct; no driver library is linked: see make_tmap_2d)

#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "kernels/cuda/common.cuh"

namespace dil::cuda::sm90 {

// ---- host ----
// A 2D tiled tensor map over a row-major [outer, inner] tensor of `elem_bytes`-byte elements
// with rows `row_bytes` apart (a multiple of 16), box [box_outer, box_inner] (inner first), the
// given swizzle, out-of-bounds elements read as zero. cuTensorMapEncodeTiled comes from the
// driver through the runtime's entry-point query, so no library beyond cudart is linked.
CUtensorMap make_tmap_2d(const void* base, CUtensorMapDataType dt, uint64_t inner, uint64_t outer,
                         uint64_t row_bytes, uint32_t box_inner, uint32_t box_outer, CUtensorMapSwizzle sw);

// ---- device ----
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

// mbarrier (CTA scope). A phase completes when its pending arrivals reach zero and its
// transaction count is zero; waits name the phase parity they wait for.
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// One arrival that also expects `bytes` more of transactions (TMA completions) this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
// With a suspend-time hint (10 ms, CUTLASS's value): a waiting thread sleeps until the phase
// completes instead of returning at once, so waiting warps do not spin (their try_wait loops
// took issue slots and shared-memory bandwidth from the converters).
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(smem_u32(bar)), "r"(parity), "r"(0x989680u)
      : "memory");
  return ok != 0;
}
// Waits until the phase of parity `parity` has completed. On a fresh barrier (phase 0 in
// progress) parity 1 counts as completed: a producer's first wait on an empty slot returns.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// TMA: box at coordinates (c0 inner, c1 outer) of `map` into shared memory, completing
// `bytes of the box` of transactions on `bar`. The map is a __grid_constant__ kernel parameter.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
      : "memory");
}
// The same box into L2 only (no shared memory, no barrier): a later tma_load_2d of it hits L2.
__device__ __forceinline__ void tma_prefetch_2d(const CUtensorMap* map, int c0, int c1) {
  asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];\n" ::"l"(reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1)
               : "memory");
}
// Bulk copy (TMA without a tensor map) of `bytes` contiguous bytes (a multiple of 16; both
// addresses 16-byte aligned) from global into shared memory, completing `bytes` of transactions
// on `bar`.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}
// The 128-byte line holding p into L2 (a hint: no registers, no completion, never a fault).
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(reinterpret_cast<uint64_t>(p)) : "memory");
}
__device__ __forceinline__ void prefetch_tmap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// cp.async of 16 bytes (.cg: L2 only) or 4 bytes (.ca) to shared memory, of which the first n
// are read from gmem and the rest zeroed (n = 0: nothing is read); one commit group per call of
// cp_async_commit, waited for by cp_async_wait<N> (at most N of this thread's groups pending).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int n) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, int n) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Ordinary shared-memory stores that wgmma (the async proxy) reads next: each writing thread
// fences before the barrier that publishes them.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Named barrier over `threads` threads (a multiple of 32), id 1..15 (0 is __syncthreads).
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Register budget per warpgroup (takes effect with a __launch_bounds__(threads, 1) cap).
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}

// Shared-memory matrix descriptor of a K-major tile whose rows are 128 bytes, stored with the
// 128-byte swizzle (TMA's CU_TENSOR_MAP_SWIZZLE_128B: the 16-byte chunk c of row r sits at
// chunk c ^ (r % 8)), groups of 8 rows 1024 bytes apart; the tile starts 1024-byte aligned.
// Bits: start address >> 4 [0, 14), leading byte offset >> 4 [16, 30) (unused for swizzled
// K-major layouts: 1), stride byte offset >> 4 [32, 46) = 64, base offset [49, 52) = 0,
// layout [62, 64) = 1 (128-byte swizzle). A k step of 32 bytes inside the row adds 2 to the
// start address field (the hardware applies the swizzle to the computed addresses).
__device__ __forceinline__ uint64_t desc_k128b(uint32_t smem_addr) {
  return uint64_t((smem_addr & 0x3ffffu) >> 4) | (uint64_t(1) << 16) | (uint64_t(64) << 32) | (uint64_t(1) << 62);
}
// The same descriptor from its low word (start address and leading byte offset), so that per-stage
// and per-k-step offsets are 32-bit adds: the start address field (14 bits of a shared address
// >> 4) cannot carry into the high word. desc_k128b(a) == desc_k128b_hi | desc_k128b_lo(a).
__device__ __forceinline__ uint32_t desc_k128b_lo(uint32_t smem_addr) { return ((smem_addr & 0x3ffffu) >> 4) | (1u << 16); }
__device__ __forceinline__ uint64_t desc_k128b_from_lo(uint32_t lo) { return (uint64_t(0x40000040u) << 32) | lo; }
// Byte offset of the 16-byte chunk `c` of row `r` in such a tile.
__device__ __forceinline__ uint32_t sw128_offset(int r, int c) { return uint32_t(r * 128 + ((c ^ (r & 7)) << 4)); }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses of accumulator registers across wgmma issue / wait
// (the asm statements do not tell it the registers change asynchronously).
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#define DIL_WGMMA_D64 \
      "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),  \
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),  \
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),  \
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),  \
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),  \
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// d[64] (+)= A[64 x 32] . B[32 x 128]^T, e4m3 operands, f32 accumulation (m64n128k32). A and B
// K-major in shared memory (descriptors above). Accumulator layout (g = lane / 4, t = lane % 4,
// w = warp in the warpgroup): d[4j + 0, 1] = row 16w + g, columns 8j + 2t, + 1; d[4j + 2, 3] =
// row 16w + g + 8, same columns. accumulate = 0 overwrites d.
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
      : DIL_WGMMA_D64
      : "l"(da), "l"(db), "r"(accumulate));
}
// The same for BF16 operands (m64n128k16; both K-major: transpose flags 0).
__device__ __forceinline__ void wgmma_m64n128k16_bf16(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : DIL_WGMMA_D64
      : "l"(da), "l"(db), "r"(accumulate));
}
#undef DIL_WGMMA_D64

// d[16] (+)= A[64 x 16] . B[32 x 16]^T, BF16 operands, both K-major in shared memory (128-byte
// swizzle, desc_k128b), f32 accumulation (m64n32k16). Accumulator layout as for m64n128k32
// (j < 4). accumulate = 0 overwrites d.
__device__ __forceinline__ void wgmma_m64n32k16_bf16(float (&d)[16], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(accumulate));
}

// Shared-memory descriptor of an MN-major B operand stored with the 128-byte swizzle: 128-byte
// lines of 64 consecutive N values (16-bit), one line per K index, 8 lines a 1024-byte swizzle
// atom (sbo: the next 8 K indices), the next 64 N values `lbo` bytes on (measured on the H200:
// the other assignment gives wrong products).
__device__ __forceinline__ uint64_t desc_mn128b(uint32_t smem_addr, uint32_t lbo) {
  return uint64_t((smem_addr & 0x3ffffu) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

#define DIL_WGMMA_D128 \
      "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),  \
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),  \
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),  \
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),  \
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),  \
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),  \
      "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),  \
      "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),  \
      "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),  \
      "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),  \
      "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),  \
      "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),  \
      "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),  \
      "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

// d[128] += A[64 x 16] . B[16 x 256], BF16 operands: A K-major (desc_k128b), B MN-major
// (desc_mn128b: transpose flag 1), f32 accumulation (m64n256k16, always accumulating).
// Accumulator layout as for m64n128k32 (j < 32).
__device__ __forceinline__ void wgmma_m64n256k16_bf16_bmn(float (&d)[128], uint64_t da, uint64_t db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, 1, 1, 1, 0, 1;\n"
      : DIL_WGMMA_D128
      : "l"(da), "l"(db));
}
#undef DIL_WGMMA_D128

// d[N / 2] = A[64 x 32] . B[N x 32]^T for N = 16, 32, 64 (m64nNk32, e4m3 operands, f32
// accumulation; A and B K-major in shared memory), overwriting d (scale-d 0): every call is one
// 32-wide block's sum on its own. Accumulator layout as for m64n128k32 (j < N / 8).
template <int N>
__device__ __forceinline__ void wgmma_m64k32_e4m3_zero(float (&d)[N / 2], uint64_t da, uint64_t db);
template <>
__device__ __forceinline__ void wgmma_m64k32_e4m3_zero<16>(float (&d)[8], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(da), "l"(db), "r"(0));
}
template <>
__device__ __forceinline__ void wgmma_m64k32_e4m3_zero<32>(float (&d)[16], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(0));
}
template <>
__device__ __forceinline__ void wgmma_m64k32_e4m3_zero<64>(float (&d)[32], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(0));
}

// prmt.b32 (generic mode): byte i of the result is byte (s >> 4i) & 7 of {b:a} (a bytes 0-3,
// b bytes 4-7), or, where bit 3 of that selector nibble is set, that byte's sign bit copied to
// all 8 bits.
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(s));
  return d;
}

// Four f32 -> four e4m3 codes (RNE, saturating to +-448; the lowest byte from a).
__device__ __forceinline__ uint32_t e4m3x4(float a, float b, float c, float d) {
  uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(lo) : "f"(b), "f"(a));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(hi) : "f"(d), "f"(c));
  return uint32_t(lo) | (uint32_t(hi) << 16);
}
// Two e4m3 codes (low byte first) -> their exact values.
__device__ __forceinline__ float2 e4m3x2_value(uint16_t v) {
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h) : "h"(v));
  __half2 hh;
  std::memcpy(&hh, &h, 4);
  return __half22float2(hh);
}

// The sign masks of nibbles 0-3 (lo) and 4-7 (hi) of w as bytes 0x80 / 0x00: nibble n's sign,
// bit 4n + 3 of w, is the top bit of byte n/2 of w << 4 (even n) or of w (odd n).
__device__ __forceinline__ uint32_t signs_lo(uint32_t w) { return prmt(w << 4, w, 0xD9C8u) & 0x80808080u; }
__device__ __forceinline__ uint32_t signs_hi(uint32_t w) { return prmt(w << 4, w, 0xFBEAu) & 0x80808080u; }

// 8 e2m1 nibbles (k ascending from the low nibble) -> 8 e4m3 bytes in two words, through the
// block's table t (bytes 0-7: the codes of the magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 times 2^d).
__device__ __forceinline__ void nib8_e4m3(uint32_t w, uint2 t, uint32_t& o0, uint32_t& o1) {
  const uint32_t mag = w & 0x77777777u;
  o0 = prmt(t.x, t.y, mag) | signs_lo(w);
  o1 = prmt(t.x, t.y, mag >> 16) | signs_hi(w);
}
// Entry i of such tables: the codes of 0, .5, 1, 1.5, 2, 3, 4, 6 times 2^d for d = i - 8 in
// [-8, 6] (all exact in e4m3: 2^-9 is its smallest subnormal, 6 * 2^6 = 384 <= 448); entry 15
// (and above) zeros.
__device__ __forceinline__ uint2 e2m1_e4m3_table(int i) {
  const float mags[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  uint32_t b[2] = {0u, 0u};
  if (i < 15)
    for (int j = 0; j < 8; j += 4)
      b[j / 4] = e4m3x4(ldexpf(mags[j], i - 8), ldexpf(mags[j + 1], i - 8), ldexpf(mags[j + 2], i - 8),
                        ldexpf(mags[j + 3], i - 8));
  return make_uint2(b[0], b[1]);
}
}  // namespace dil::cuda::sm90
