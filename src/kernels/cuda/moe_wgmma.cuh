// The routed experts on Hopper warpgroup MMA (moe_wgmma.cu), fast numerics: persistent grouped
// GEMMs over (128-row tile of one expert's sorted rows, block of weight rows), FP4 weights
// converted in shared memory as they are consumed, activations by TMA.
//
// - act_block 128 (V4): tokens quantized to e4m3 with a power-of-two scale per 128 (the
//   official act_quant), FP4 weights converted exactly to e4m3 with one power-of-two scale per
//   128 x 128 block (exact when the block's E8M0 scales span at most 14 binades: checked once
//   per expert list; a list with a misfit runs the BF16 tensor-core path instead), FP8 wgmma,
//   partial sums promoted to f32 with both scales every 128 K.
// - act_block 32 (V4.1): QDQ'd tokens and FP4 weights both exact in BF16, BF16 wgmma with f32
//   accumulation over the whole K (no per-32 scales reach the tensor cores).
// w1 and w3 run as one GEMM (each CTA's 128 weight rows: 64 of w1, the same 64 of w3), SwiGLU
// with the clamps, the routing weight and the fast BF16 roundings in its epilogue, h written
// in BF16; h is quantized like the tokens; w2 writes each slot's y in BF16; the combine sums
// the k slots per token in slot order. No host synchronization (after the once-per-list check).
#pragma once
#include <vector>

#include "kernels/cuda/moe_mma.cuh"

namespace dil::cuda {

constexpr int kWgBM = 128;  // sorted rows per tile (the tile map's tile size on this path)

// Shapes the path runs: D and I multiples of 128, FP4 experts with 16-byte aligned rows.
bool moe_wgmma_fits(const std::vector<Weight>& w1, const std::vector<Weight>& w2, const std::vector<Weight>& w3,
                    int act_block);

struct MoeWgmmaCall {
  const bf16_t* x = nullptr;  // [T, D] bf16 tokens
  int64_t T = 0, D = 0, I = 0;
  int k = 0, E = 0, act_block = 0;
  float lim = 10.0f;
  const float* route_w = nullptr;      // [T, k]
  const int32_t* sorted_tok = nullptr;  // [Tk] token of each sorted row
  const int32_t* sorted_pair = nullptr; // [Tk] t*k + i of each sorted row
  const int32_t* pos_of = nullptr;      // [Tk] sorted row of pair t*k + i (-1: not held)
  MoeTileMap map{};                     // kWgBM-row tiles
  int max_tiles = 0;
  const WView *t1 = nullptr, *t2 = nullptr, *t3 = nullptr;  // device expert tables
  const std::vector<Weight> *w1 = nullptr, *w2 = nullptr, *w3 = nullptr;
  Tensor out;  // [T, D] f32|bf16
};

// Runs the routed experts. Returns false, having launched nothing, when the FP8 path cannot
// convert a listed expert exactly (a block's scales span more than 14 binades): the caller
// then runs another implementation.
bool moe_wgmma(Ctx& c, const MoeWgmmaCall& m);

// The activation quantization the path reads (exposed for its test): rows r < *n_rows (at most
// rows_max) of x (row gather[r], or r when gather is null), per block of `block` columns (128:
// e4m3 codes into q8 [rows_max, D] and the power-of-two scales into sx [D/128, ld_sx] f32; 32:
// the QDQ'd values into qb [rows_max, D] bf16), as fp8_qdq computes them.
void moe_wg_quant(Ctx& c, const bf16_t* x, const int32_t* gather, const int32_t* n_rows, int64_t rows_max, int64_t D,
                  int block, uint8_t* q8, float* sx, int64_t ld_sx, bf16_t* qb);

}  // namespace dil::cuda
