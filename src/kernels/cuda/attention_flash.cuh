// The fast-numerics sparse attention at FlashMLA's structure (attention_flash.cu, the plan's
// flash_bf16): one CTA per (token, 64 heads), rows gathered by index into double-buffered
// shared-memory tiles, BF16 tensor-core products with f32 accumulation, BF16 P; decode-sized
// steps split each token's rows over several CTAs and combine.
#pragma once
#include <vector>

#include "kernels/cuda/attention_mma.cuh"

namespace dil::cuda {

// Heads per CTA and head dim of the kernel (registry.cpp: attn_flash requires them; change both
// together). Rows per shared-memory tile (tests/cuda/test_attention.cpp's bound counts its P.V
// instructions and rescales per tile).
constexpr int kFlashHeads = 64, kFlashD = 512, kFlashRows = 64;

// How many CTAs share one token's rows: 1 for prefill-sized steps; for decode-sized ones as many
// as fit in one wave of CTAs (one per SM), at most one per two tiles of the longest token's rows
// and 16 (host arithmetic on the positions of StepMeta, nothing read back).
int flash_splits(const AttnArgs& a, const StepMeta& m, int sm_count);

// Where a flash kernel writes: the bf16 output when a token's rows are one CTA's, else per split
// its unnormalised O, running max (log2 domain) and row sum for the combine kernel.
struct FlashOut {
  bf16_t* out;     // [T, H, d] (n_split == 1)
  float* o_part;   // [n_split, T, H, d] unnormalised O (n_split > 1)
  float* ml_part;  // [n_split, T, H, 2] running max (log2 domain) and row sum
  int n_split;
};

constexpr float kFlashLog2e = 1.4426950408889634f;

// Host: candidate rows of token t (window + compressed: all visible, or the K picks), as
// attn_window / attn_row count them, from StepMeta's host copies.
int flash_token_rows(const StepMeta& m, int t, int window, bool non_causal, int ratio, int K);

// The kernel behind the flash structure: mma.sync with 8 warps (attention_flash.cu, flash_bf16)
// or wgmma with two warpgroups (attention_wgmma.cu, wgmma_bf16). Same tiles, splits, outputs.
enum class FlashKernel { Mma, Wgmma };

// out = attention (AttnArgs semantics, CpuBackend::sparse_attention) with n_split CTAs per
// (token, 64 heads): n_split == 0 picks flash_splits on this device.
void sparse_attention_flash(Ctx& c, const AttnParams<bf16_t>& P, const AttnArgs& a, const StepMeta& m, int T_tokens,
                            int n_split = 0, FlashKernel kernel = FlashKernel::Mma);

// For the wgmma kernel (attention_wgmma.cu): when the step reads its packed rows (the official
// FP8 / FP4 formats of fast numerics' cache) at least twice each on average (prefill chunks) and
// the pools stay under 256 MiB, dequantizes every row it can read once into BF16 pools (scratch
// buffers appended to `keep`, alive while the stream uses them) and returns P reading those as
// plain rows; otherwise P itself (the kernel dequantizes in registers).
AttnParams<bf16_t> pool_packed_rows(Ctx& c, const AttnParams<bf16_t>& P, const StepMeta& m, int T_tokens,
                                    std::vector<Buffer>& keep);

// The wgmma kernel on grid (tokens, H / 64, n_split) (attention_wgmma.cu).
void launch_attn_wgmma(Ctx& c, const AttnParams<bf16_t>& P, const FlashOut& F, dim3 grid);

}  // namespace dil::cuda
