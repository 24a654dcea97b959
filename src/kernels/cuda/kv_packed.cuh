// Device twins of core/kv_packed.h: the official packed KV row formats, byte for byte (the
// layouts, the quantization formulas and why unpack(pack(x)) equals the QDQ'd row are in that
// header; tests/cuda/test_kv_packed.cpp checks these against it bit for bit).
//
// Byte layouts (d = row width):
//   V4Row      [nope e4m3][rope bf16][nope/64 ue8m0][pad to 8]   (512 = 448 + 64: 584 B)
//   Fp8B32     [d e4m3][d/32 ue8m0]                              (V4.1 SWA, 528 B)
//   Fp4E4m3B16 [d/2 e2m1, dim 2k low nibble][d/16 e4m3]          (V4.1 main KV, 288 B)
//   Fp4B32     [d/2 e2m1][d/32 ue8m0]                            (indexer keys, 68 B at d = 128)
//
// Readers: kv_unpack<N>(shape, row, c0, out) dequantizes dims [c0, c0 + N) of one row (the
// interface a kernel's row loader calls; kv_unpack_one for a single dim). Writers: one warp
// per scale block, kv_pack_block(shape, x, b, row, lane) for b < kv_scale_blocks(shape), x the
// row's f32 values; a V4Row has one more "block", b = nope/64: its bf16 rope dims and the pad.
#pragma once
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "core/kv_packed.h"
#include "kernels/cuda/common.cuh"

namespace dil::cuda {

struct KvRow {
  kvpack::Format format = kvpack::Format::V4Row;
  int d = 0, rope = 0;
};

__host__ __device__ inline int kv_row_bytes(const KvRow& s) {
  switch (s.format) {
    case kvpack::Format::V4Row: {
      const int nope = s.d - s.rope;
      return (nope + 2 * s.rope + nope / 64 + 7) / 8 * 8;
    }
    case kvpack::Format::Fp8B32: return s.d + s.d / 32;
    case kvpack::Format::Fp4E4m3B16: return s.d / 2 + s.d / 16;
    case kvpack::Format::Fp4B32: return s.d / 2 + s.d / 32;
  }
  return 0;
}

// Values per scale block, and the number of blocks kv_pack_block covers (V4Row: the nope
// blocks, then one "block" of the rope dims and the pad).
__host__ __device__ inline int kv_block_len(const KvRow& s) {
  return s.format == kvpack::Format::V4Row ? 64 : s.format == kvpack::Format::Fp4E4m3B16 ? 16 : 32;
}
__host__ __device__ inline int kv_scale_blocks(const KvRow& s) {
  return s.format == kvpack::Format::V4Row ? (s.d - s.rope) / 64 + 1 : s.d / kv_block_len(s);
}

__device__ __forceinline__ uint8_t kv_ue8m0_of(float s) { return uint8_t((__float_as_uint(s) >> 23) & 0xff); }
__device__ __forceinline__ uint8_t kv_e2m1_code(float v) {
  const float r = d_round_e2m1(v);
  const float a = fabsf(r);
  const uint8_t code = a < 2.0f ? uint8_t(a * 2.0f) : a == 2.0f ? 4 : a == 3.0f ? 5 : a == 4.0f ? 6 : 7;
  return uint8_t((signbit(r) ? 8 : 0) | code);
}

// Writes scale block b of a row (its codes and its scale byte) from x [d] (f32, the row), by
// the 32 lanes of a warp together (every lane calls it with the same b; lane = its lane id):
// the block's amax by a warp max (exact, any order), then each lane its values' codes.
// V4Row: b < nope/64 are the e4m3 blocks; b == nope/64 writes the bf16 rope dims and the pad.
__device__ inline void kv_pack_block(const KvRow& s, const float* x, int b, uint8_t* row, int lane) {
  const int d = s.d;
  if (s.format == kvpack::Format::V4Row || s.format == kvpack::Format::Fp8B32) {
    const int B = s.format == kvpack::Format::V4Row ? 64 : 32;
    const int nq = s.format == kvpack::Format::V4Row ? d - s.rope : d;  // e4m3 dims
    uint8_t* scales = row + (s.format == kvpack::Format::V4Row ? nq + 2 * s.rope : d);
    if (s.format == kvpack::Format::V4Row && b == nq / 64) {
      for (int i = lane; i < s.rope; i += 32) {
        const uint32_t bits = __float_as_uint(d_round_bf16(x[nq + i]));
        row[nq + 2 * i] = uint8_t(bits >> 16);
        row[nq + 2 * i + 1] = uint8_t(bits >> 24);
      }
      for (int i = nq + 2 * s.rope + nq / 64 + lane; i < kv_row_bytes(s); i += 32) row[i] = 0;
      return;
    }
    const int b0 = b * B;
    float amax = 0.0f;
    for (int i = b0 + lane; i < b0 + B; i += 32) amax = fmaxf(amax, fabsf(x[i]));
    const float sc = d_act_scale(warp_max(amax));
    if (lane == 0) scales[b] = kv_ue8m0_of(sc);
    for (int i = b0 + lane; i < b0 + B; i += 32) row[i] = d_f32_to_e4m3(d_act_round(x[i], sc));
    return;
  }
  const bool e4m3 = s.format == kvpack::Format::Fp4E4m3B16;
  const int B = e4m3 ? 16 : 32, b0 = b * B;
  const float amax = warp_max(lane < B ? fmaxf(0.0f, fabsf(x[b0 + lane])) : 0.0f);  // a NaN drops out, as in a chain from 0
  float sc;
  if (e4m3) {
    sc = d_round_e4m3(fminf(fmaxf(amax, 6.0f * 0x1p-9f) / 6.0f, 448.0f));
    if (lane == 0) row[d / 2 + b] = d_f32_to_e4m3(sc);
  } else {
    sc = d_pow2_ceil(fmaxf(amax, 6.0f * 0x1p-126f) * (1.0f / 6.0f));
    if (lane == 0) row[d / 2 + b] = kv_ue8m0_of(sc);
  }
  if (2 * lane < B) {
    const int i = b0 + 2 * lane;
    const uint8_t lo = kv_e2m1_code(fminf(fmaxf(x[i] / sc, -6.0f), 6.0f));
    const uint8_t hi = kv_e2m1_code(fminf(fmaxf(x[i + 1] / sc, -6.0f), 6.0f));
    row[i / 2] = uint8_t(lo | (hi << 4));
  }
}

// Dequantized dim c of a packed row.
__device__ __forceinline__ float kv_unpack_one(const KvRow& s, const uint8_t* row, int c) {
  const int d = s.d;
  switch (s.format) {
    case kvpack::Format::V4Row: {
      const int nope = d - s.rope;
      if (c >= nope) {
        const uint32_t lo = row[nope + 2 * (c - nope)], hi = row[nope + 2 * (c - nope) + 1];
        return __uint_as_float((hi << 24) | (lo << 16));
      }
      return d_e4m3_to_f32(row[c]) * d_e8m0_to_f32(row[nope + 2 * s.rope + c / 64]);
    }
    case kvpack::Format::Fp8B32: return d_e4m3_to_f32(row[c]) * d_e8m0_to_f32(row[d + c / 32]);
    case kvpack::Format::Fp4E4m3B16:
    case kvpack::Format::Fp4B32: {
      const uint8_t byte = row[c / 2];
      const uint8_t nib = uint8_t(c & 1 ? byte >> 4 : byte & 0xf);
      const bool e4m3 = s.format == kvpack::Format::Fp4E4m3B16;
      const uint8_t sb = row[d / 2 + c / (e4m3 ? 16 : 32)];
      return d_e2m1_to_f32(nib) * (e4m3 ? d_e4m3_to_f32(sb) : d_e8m0_to_f32(sb));
    }
  }
  return 0.0f;
}

// Dims [c0, c0 + N) of a packed row -> out[0, N) f32 (exact: the stored values).
template <int N>
__device__ __forceinline__ void kv_unpack(const KvRow& s, const uint8_t* row, int c0, float (&out)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = kv_unpack_one(s, row, c0 + i);
}

// ---- 8-value readers for the attention row loaders (the hot path) ----
// Two e4m3 codes (low byte first) as f32, by the hardware conversion (exact).
__device__ __forceinline__ float2 kv_e4m3x2(uint16_t codes) {
  return __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(codes), __NV_E4M3)));
}
// Two values exact in bf16 packed as bf16x2 (lo in the low half): one cvt, which only packs.
__device__ __forceinline__ uint32_t kv_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
// 8 e4m3 codes (a uint2, dim order) times a scale -> 8 bf16.
__device__ __forceinline__ uint4 kv_e4m3x8_bf16(uint2 c, float sc) {
  const float2 a = kv_e4m3x2(uint16_t(c.x)), b = kv_e4m3x2(uint16_t(c.x >> 16));
  const float2 e = kv_e4m3x2(uint16_t(c.y)), f = kv_e4m3x2(uint16_t(c.y >> 16));
  return make_uint4(kv_bf16x2(a.x * sc, a.y * sc), kv_bf16x2(b.x * sc, b.y * sc), kv_bf16x2(e.x * sc, e.y * sc),
                    kv_bf16x2(f.x * sc, f.y * sc));
}
// e2m1 code (sign bit 3) as f32, by its bits.
__device__ __forceinline__ float kv_e2m1(uint32_t nib) {
  const uint32_t em = nib & 7u;
  const uint32_t mag = em >= 2 ? (((em >> 1) + 126u) << 23) | ((em & 1u) << 22) : em == 1 ? (126u << 23) : 0u;
  return __uint_as_float(mag | ((nib & 8u) << 28));
}

// 8 e2m1 codes (a word, dim 2k in the low nibble of byte k) times a scale -> 8 bf16.
__device__ __forceinline__ uint4 kv_e2m1x8_bf16(uint32_t w, float sc) {
  uint32_t o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) o[i] = kv_bf16x2(kv_e2m1(w >> (8 * i)) * sc, kv_e2m1(w >> (8 * i + 4)) * sc);
  return make_uint4(o[0], o[1], o[2], o[3]);
}

// Dims [8 seg, 8 seg + 8) of a packed row as 8 bf16 values (uint4, dim order), equal to
// bf16(kv_unpack_one): every stored value has at most 6 significant bits (e4m3 x 2^k, e2m1 x
// e4m3) and a normal exponent, so the bf16 is exact. The row's byte alignment: 8 (V4Row rows
// are 584 B apart), so loads are at most 8 bytes.
__device__ __forceinline__ uint4 kv_unpack8_bf16(const KvRow& s, const uint8_t* row, int seg) {
  const int c0 = 8 * seg;
  switch (s.format) {
    case kvpack::Format::V4Row: {
      const int nope = s.d - s.rope;
      if (c0 >= nope) {  // bf16 rope dims as stored
        const uint2* r = reinterpret_cast<const uint2*>(row + nope + 2 * (c0 - nope));
        const uint2 a = r[0], b = r[1];
        return make_uint4(a.x, a.y, b.x, b.y);
      }
      return kv_e4m3x8_bf16(*reinterpret_cast<const uint2*>(row + c0), d_e8m0_fast(row[nope + 2 * s.rope + c0 / 64]));
    }
    case kvpack::Format::Fp8B32:
      return kv_e4m3x8_bf16(*reinterpret_cast<const uint2*>(row + c0), d_e8m0_fast(row[s.d + c0 / 32]));
    case kvpack::Format::Fp4E4m3B16:
    case kvpack::Format::Fp4B32: {
      const bool e4m3 = s.format == kvpack::Format::Fp4E4m3B16;
      const uint32_t w = *reinterpret_cast<const uint32_t*>(row + c0 / 2);  // 8 nibbles, dim 2k low
      const uint8_t sb = row[s.d / 2 + c0 / (e4m3 ? 16 : 32)];
      const float sc = e4m3 ? kv_e4m3x2(sb).x : d_e8m0_fast(sb);
      return kv_e2m1x8_bf16(w, sc);
    }
  }
  return make_uint4(0u, 0u, 0u, 0u);
}

}  // namespace dil::cuda
