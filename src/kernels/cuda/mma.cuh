// Warp-level BF16 and FP8 tensor-core helpers shared by the tensor-core kernels (indexer_mma.cu,
// indexer_fp8.cu, attention_mma.cu, moe_mma.cu).
#pragma once
#include "kernels/cuda/common.cuh"

namespace dil::cuda {

// d += a . b for one m16n8k16 tile, f32 accumulation (PTX ISA fragment layouts, g = lane / 4,
// t = lane % 4): a0 (row g, k 2t..2t+1), a1 (row g+8, same k), a2 (row g, k 8+2t..), a3 (row
// g+8, k 8+2t..); b0 (k 2t..2t+1, col g), b1 (k 8+2t.., col g); d0, d1 (row g, cols 2t, 2t+1),
// d2, d3 (row g+8). The lower k of each pair sits in the register's low half.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  mma_bf16(d, a, b[0], b[1]);
}

// d = a . b for one m16n8k16 tile of f16 operands, f32 accumulation from zero (the fragments of
// mma_bf16); mma_f16 adds to d. sm_90 has no FP8 mma.sync datapath: ptxas lowers mma_e4m3 to two
// of these after converting every operand register (e4m3 -> f16 is exact), so a kernel that
// keeps an operand in f16 saves those conversions.
__device__ __forceinline__ void mma_f16_zero(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Four e4m3 codes (bytes 0-3 of v) as two f16x2: lo = bytes 0, 1 (byte 0 in the low half), hi =
// bytes 2, 3; exact. (Splitting v with mov lets ptxas read the high half in place, no shift.)
__device__ __forceinline__ void e4m3x4_f16x2(uint32_t v, uint32_t& lo, uint32_t& hi) {
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(v));
}

// d += a . b for one m16n8k32 tile of FP8 e4m3 operands, f32 accumulation (sm_89+; same
// structure as above, 4 values per register, the lowest k in the lowest byte): a0 (row g, k
// 4t..4t+3), a1 (row g+8, same k), a2 (row g, k 16+4t..), a3 (row g+8, k 16+4t..); b0 (k 4t..4t+3,
// col g), b1 (k 16+4t.., col g); d as above.
__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// f32 -> BF16 bits, round to nearest even (exact for values with <= 8 significant bits).
__device__ __forceinline__ uint16_t bf16_bits(float f) { return uint16_t(__float_as_uint(d_round_bf16(f)) >> 16); }
// Two values as bf16 (each rounded once, RNE) in one word: lo in bits 0-15, hi in 16-31.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return uint32_t(bf16_bits(lo)) | (uint32_t(bf16_bits(hi)) << 16);
}

}  // namespace dil::cuda
