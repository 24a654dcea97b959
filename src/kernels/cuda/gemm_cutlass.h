// CUTLASS Hopper blockwise-scaled FP8 GEMM (the `cutlass_fp8` linear, gemm.cu), behind a plain
// C++ interface so that only gemm_cutlass_*.cu include CUTLASS (one kernel instantiation per
// translation unit, compiled without the library-wide --fmad=false: CUTLASS's epilogue and
// scale math are not part of the f32 reference's rounding contract, which fixes the FP8
// quantization points, not the summation order).
//
//   D[m, n] = bf16( sum_kb sfa[kb, m] * sfb[n / 128, kb] * sum_{k in block kb} A[m, k] B[n, k] )
//
// The inner sum is the tensor cores' FP8 wgmma over one 128-wide K block; the scaled partial is
// added to an f32 accumulator once per block ("promotion"), as DeepSeek's fp8_gemm does.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace dil::cuda {

struct CutlassFp8Gemm {
  const void* a = nullptr;    // [m, k] e4m3 row-major: the activations (m a multiple of 4)
  const float* sfa = nullptr; // [k/128, m] f32, tokens fastest: the activation scales
  const void* b = nullptr;    // [n, k] e4m3 row-major: the weight
  const float* sfb = nullptr; // [n/128, k/128] f32, K blocks fastest: the weight's block scales
  void* d = nullptr;          // [m, n] bf16 row-major
  int m = 0, n = 0, k = 0;    // n and k multiples of 128
};

// The kernel configurations (one translation unit each).
enum class CutlassTile {
  M128,  // 128x128x128 CTA tile, 2-CTA cluster along N, cooperative (two consumer warp groups)
  M64,   // 64x128x128 CTA tile, no cluster, ping-pong consumers
  Swap,  // transposed (swap-AB): 128 weight rows x 64 tokens x 128 K, cooperative, stream-K
};
const char* cutlass_tile_name(CutlassTile t);
// The configuration linear's cutlass_fp8 runs for `rows` tokens and n weight rows: swap-AB
// with stream-K while the 128x128 tiles would fill less than half the GPU's 132 SMs (few
// tokens, or few weight rows), else the 128x128 cooperative kernel. Measured on the H200
// (tests/cuda/test_bench_cutlass.cpp, docs/performance.md): wo_b at 64 rows swap 198 / m64 193 /
// m128 162 TFLOP/s, at 512 rows (128 tiles) m128 1,111 / m64 852 / swap 768.
constexpr int64_t kCutlassSwapBelowTiles = 66;
inline CutlassTile cutlass_tile_for(int64_t rows, int64_t n) {
  return (rows + 127) / 128 * (n / 128) < kCutlassSwapBelowTiles ? CutlassTile::Swap : CutlassTile::M128;
}

// Workspace bytes one call needs (the persistent tile scheduler's).
size_t cutlass_fp8_workspace(CutlassTile t, const CutlassFp8Gemm& g);
// Runs the GEMM on `stream`; false when CUTLASS cannot implement the problem (alignment).
bool cutlass_fp8_run(CutlassTile t, const CutlassFp8Gemm& g, void* workspace, size_t workspace_bytes,
                     cudaStream_t stream);

}  // namespace dil::cuda
