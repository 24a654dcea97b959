// KV cache rows in the official packed formats (the bytes model/kv_layout.h counts and
// `kv-report` prints), host side. The CUDA twins are src/kernels/cuda/kv_packed.cuh; both
// quantize with exactly the formulas of the QDQ ops the model applies to these rows today
// (CpuBackend::fp8_qdq / fp4_qdq, model-spec §3.1), so that unpack(pack(x)) is bit for bit the
// QDQ'd row: storing packed changes no FP8/FP4 value.
//
// Byte layouts (d = row width, little-endian, scale blocks cover consecutive dims):
//   V4Row      V4 SWA and compressed rows, d = nope + rope (512 = 448 + 64), 584 B:
//              [0, nope)                    e4m3 of dims [0, nope)
//              [nope, nope + 2*rope)        bf16 of the rope dims [nope, d)
//              [.., + nope/64)              ue8m0 scale of each 64 nope dims
//              pad to a multiple of 8 (0)
//              (FlashMLA/vLLM fix no V4 byte order, model-spec §3.9: this one keeps the e4m3
//              part 16-byte aligned for vector loads and the rope dims 2-byte aligned.)
//   Fp8B32     V4.1 SWA rows, 528 B at d = 512: [d e4m3][d/32 ue8m0] (FlashMLA V4.1 FP8).
//   Fp4E4m3B16 V4.1 main KV, 288 B at d = 512: [d/2 bytes e2m1][d/16 e4m3 scales]; byte k holds
//              dim 2k in its low nibble, 2k+1 in its high nibble (the checkpoint's FP4 order).
//   Fp4B32     indexer keys, 68 B at d = 128: [d/2 bytes e2m1][d/32 ue8m0] (MXFP4).
// Quantization (per scale block of the dims listed):
//   e4m3 / ue8m0 (B = 64 V4, 32 V4.1): amax = max(max|x|, 1e-4); s = pow2_ceil(amax * (1/448));
//     q = e4m3_RNE(clamp(x / s, +-448)).
//   e2m1 / ue8m0 (B = 32): amax = max(max|x|, 6*2^-126); s = pow2_ceil(amax * (1/6)).
//   e2m1 / e4m3 (B = 16):  amax = max(max|x|, 6*2^-9);   s = e4m3_RNE(min(amax / 6, 448)).
//     q = e2m1_RNE(clamp(x / s, +-6)).
//   bf16 (V4 rope): RNE. Dequantized value: q * s (exact in f32 for every format).
#pragma once
#include <cstddef>
#include <cstdint>

namespace dil::kvpack {

enum class Format : uint8_t { V4Row, Fp8B32, Fp4E4m3B16, Fp4B32 };

struct RowShape {
  Format format = Format::V4Row;
  int d = 0;     // values per row; 0: not packed (a cache of plain f32|bf16 rows)
  int rope = 0;  // V4Row: trailing dims kept as bf16 (else 0)
  bool packed() const { return d > 0; }
};

size_t row_bytes(const RowShape& s);
// x [d] f32 -> row [row_bytes(s)] (every byte written, the pad zeroed).
void pack_row(const RowShape& s, const float* x, uint8_t* row);
// row -> x [d] f32: the dequantized values.
void unpack_row(const RowShape& s, const uint8_t* row, float* x);
// One value (readers that dequantize a few dims at a time).
float unpack_value(const RowShape& s, const uint8_t* row, int c);

}  // namespace dil::kvpack
