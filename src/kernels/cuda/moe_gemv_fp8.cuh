// moe_experts' `gemv_fp8` (fast numerics, decode sizes: moe_gemv_fp8.cu). The `gemv` path
// (moe_gemv.cu) multiplies on CUDA cores: 32 FMAs per 16 weight bytes per token row, so a tile of
// 3-4 rows needs more issue slots than the SMs have at HBM speed (measured: 66% of issue slots
// busy, 40% of DRAM bandwidth). Here the products go to FP8 tensor cores (mma.sync m16n8k32,
// one tile of up to kGfRows sorted rows as the MMA's n): FP4 weights are re-biased into e4m3
// bytes (exact, x 2^-6), the tokens and h are e4m3 codes with their power-of-two block scales
// (the same codes fp8_qdq rounds to), each 32-K MMA starts from zero and is promoted into an
// f32 accumulator with (weight scale x activation scale x 2^6), a product of powers of two.
#pragma once
#include "kernels/cuda/moe_mma.cuh"
#include "kernels/cuda/ops.cuh"

namespace dil::cuda {

constexpr int kGfRows = 8;           // sorted rows per tile: the MMA's n
constexpr int64_t kGfMaxK = 8192;    // widest K (activations staged 4,096 K at a time, 68 B per K / 32 per row)

struct GfMoeArgs {
  const int32_t* sorted_tok;   // [rows] token of each sorted row
  const int32_t* sorted_pair;  // [rows] t * k + slot
  const float* route_w;        // [T * k]
  const WView *w1, *w2, *w3;   // device tables [E], FP4
  MoeTileMap map;              // tiles of kGfRows sorted rows
  int max_tiles;
  int64_t D, I;
  int act;                     // activation block (128 V4, 32 V4.1)
  float limit;
  bool round_bf16;
};

// q [rows, K] e4m3 codes and s [rows, ceil(K / act)] f32 block scales of x [rows, K] (TI f32 or
// bf16), as fp8_qdq rounds: s = pow2_ceil(max(amax, 1e-4) / 448), q = e4m3(clamp(x / s, +-448)).
// Rows [0, *n_rows) when n_rows is given (a device count), else all rows_max.
template <class TI>
void moe_gf_quant(Ctx& c, const TI* x, int64_t rows_max, const int32_t* n_rows, int64_t K, int act, uint8_t* q,
                  float* s);

// h [rows, I] f32 (sorted rows) = SwiGLU(w1 x, w3 x) * route_w (g, u, h rounded to bf16 when
// round_bf16); xq / xs: the tokens' codes and scales (token order, gathered through sorted_tok).
void moe_gf_w13(Ctx& c, const GfMoeArgs& a, const uint8_t* xq, const float* xs, float* h);
// y [rows, D] f32 (sorted rows) = w2 . h; hq / hs: h's codes and scales (sorted rows).
void moe_gf_w2(Ctx& c, const GfMoeArgs& a, const uint8_t* hq, const float* hs, float* y);

}  // namespace dil::cuda
