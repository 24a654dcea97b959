// The CUDA backend's kernel registry (backend/plan.h): every implementation of every op family
// with what it requires of an op site. Plain C++ without CUDA headers, compiled in every build,
// so that `inspect --plan --device cuda` and `kernels-doc` work on machines without a GPU or
// nvcc. Registry order is preference; docs/kernels.md's op table is generated from it.
// The limits here are the kernels' compile-time constants (attention_mma.cu kD/kHeads,
// attention_flash.cuh kFlashHeads/kFlashD,
// indexer_mma.cu kDi/kMaxHeads, indexer_fp8.cu kDi, indexer.cu kMaxQ/kMaxTopk,
// topk_rows.h kTopkRowsMaxK, moe_mma.cuh kMmaBK, moe_wgmma.cuh (128-wide blocks), attention.cu
// kMaxD, mhc.cu kMaxMix, mhc_fast.cu kN/kKc/kMaxGroups, gemv_fast.cuh kGvMaxRows/kGvMaxK): change both together.
#include "kernels/cuda/registry.h"

#include <algorithm>

#include "backend/backend.h"

namespace dil {
namespace {

using Reqs = std::vector<std::string>;
constexpr int kF32 = int(Weight::Kind::F32), kBF16 = int(Weight::Kind::BF16), kFP8 = int(Weight::Kind::FP8),
              kFP4 = int(Weight::Kind::FP4);

std::string act_f32_or_bf16(const OpSite& s) {
  const bool ok = (s.act == DType::F32 || s.act == DType::BF16) && (s.out == DType::F32 || s.out == DType::BF16);
  return need(ok, "f32 or bf16 activations");
}

// ---- linear ----
constexpr int64_t kGvMaxRows = 8, kGvMaxK = 8192;  // gemv_fast.cuh
Reqs lt_fp8(const OpSite& s) {
  return {need(s.wkind == kFP8 && s.block_out == 128 && s.block_in == 128, "an FP8 weight with 128x128 blocks"),
          need(s.act_block == 128, "activations FP8-quantized per 128 (act_block 128)"),
          need(s.n % 128 == 0 && s.k % 128 == 0, "N and K multiples of 128"), act_f32_or_bf16(s)};
}
// CUTLASS's blockwise FP8 GEMM (gemm_cutlass.h): cuBLASLt's FP8 requirements, bf16 in and out
// (one kernel instantiation per output type; the f32-output sites keep cuBLASLt).
Reqs cutlass_fp8(const OpSite& s) {
  Reqs r = lt_fp8(s);
  r.push_back(need(s.numerics == Numerics::Fast, "fast numerics"));
  r.push_back(need(s.act == DType::BF16 && s.out == DType::BF16, "bf16 activations and output"));
  return r;
}
// From this many rows cutlass_fp8 takes over from cuBLASLt (below it both stream the weight).
constexpr int64_t kCutlassMinRows = 16;
Reqs lt_bf16(const OpSite& s);
bool all_met(const Reqs& r) {
  return std::all_of(r.begin(), r.end(), [](const std::string& x) { return x.empty(); });
}
// The decode GEMV's row limit depends on what runs after it: where cuBLASLt takes the weight
// (FP8 128x128 with act 128, BF16), cuBLASLt is faster from 2 rows on (measured on the H200,
// up to 2x at 2..8 rows), so the GEMV keeps 1 row; for FP8-32 (V4.1) and FP4 the alternative
// is the SIMT kernel below 64 rows, and the GEMV keeps up to kGvMaxRows.
bool lt_takes(const OpSite& s) { return all_met(lt_fp8(s)) || all_met(lt_bf16(s)); }
Reqs gemv_common(const OpSite& s) {
  return {need(s.numerics == Numerics::Fast, "fast numerics (bf16 activations, f32 accumulation)"),
          need(s.act == DType::BF16, "bf16 activations"),
          need(s.k % 32 == 0 && s.k <= kGvMaxK, "K a multiple of 32, at most 8192"), act_f32_or_bf16(s)};
}
// FP8 K blocks the GEMVs take: 16 x a power of two (gemv_fast.cuh gv_block_ok: the scale column
// of a 16-byte chunk is a shift of its index).
bool gv_block_ok(int64_t bk) { return bk >= 16 && bk % 16 == 0 && ((bk / 16) & (bk / 16 - 1)) == 0; }
Reqs gemv(const OpSite& s) {  // up to kGvMaxRows rows
  Reqs r = gemv_common(s);
  r.push_back(need(s.wkind == kBF16 || s.wkind == kFP4 || (s.wkind == kFP8 && gv_block_ok(s.block_in)),
                   "a BF16, FP4 or FP8 weight (FP8 K blocks 16 x a power of two)"));
  r.push_back(need(!lt_takes(s), "a weight cuBLASLt cannot take (FP8-32, FP4, odd shapes)"));
  return r;
}
Reqs gemv_one(const OpSite& s) {  // one row
  Reqs r = gemv_common(s);
  r.push_back(need(lt_takes(s), "a weight cuBLASLt takes from 2 rows (FP8 128x128 with act 128, BF16)"));
  return r;
}
// gemv_stream over gemv: from this many weight bytes (measured on the H200 at one row, each
// against the other in the same job: the 1.06 GB BF16 head 241 vs 276 us; FP8 weights of 4-34 MB
// 3-5% slower, V4.1's FP8-32 ones up to 25%: docs/performance.md).
constexpr double kStreamMinBytes = 256e6;
bool big_weight(const OpSite& s) {
  const double per = s.wkind == kBF16 ? 2.0 : s.wkind == kFP8 ? 1.0 : s.wkind == kFP4 ? 0.5 : 4.0;
  return double(s.n) * double(s.k) * per >= kStreamMinBytes;
}
Reqs gemv_big(const OpSite& s) {
  Reqs r = gemv(s);
  r.push_back(need(big_weight(s), "a weight of at least 256 MB (below, gemv's resident wave is faster)"));
  return r;
}
Reqs gemv_one_big(const OpSite& s) {
  Reqs r = gemv_one(s);
  r.push_back(need(big_weight(s), "a weight of at least 256 MB (below, gemv's resident wave is faster)"));
  return r;
}
Reqs dequant_lt(const OpSite& s) {
  return {need(s.wkind == kFP8, "an FP8 weight"),
          need(s.act_block > 0, "FP8-quantized activations (exact BF16 operands)"),
          need(s.n % 8 == 0 && s.k % 8 == 0, "N and K multiples of 8"), act_f32_or_bf16(s)};
}
Reqs lt_bf16(const OpSite& s) {
  return {need(s.wkind == kBF16, "a BF16 weight"), need(s.act == DType::BF16, "bf16 activations (fast numerics)"),
          need(s.n % 8 == 0 && s.k % 8 == 0, "N and K multiples of 8"), act_f32_or_bf16(s)};
}
Reqs lt_bf16_split(const OpSite& s) {
  return {need(s.wkind == kBF16, "a BF16 weight"), need(s.act == DType::F32, "f32 activations"),
          need(s.n % 8 == 0 && s.k % 8 == 0, "N and K multiples of 8"), act_f32_or_bf16(s)};
}
Reqs simt_gemm(const OpSite& s) {
  return {need(s.wkind == kF32 || s.wkind == kBF16 || s.wkind == kFP8 || s.wkind == kFP4, "a checkpoint weight"),
          act_f32_or_bf16(s)};
}

// ---- grouped_linear (wo_a) ----
Reqs gl_gemv(const OpSite& s) {
  const int64_t n = s.groups ? s.n / s.groups : s.n;
  return {need(s.numerics == Numerics::Fast, "fast numerics (bf16 activations, f32 accumulation)"),
          need(s.act == DType::BF16, "bf16 activations"),
          need(s.wkind == kBF16 ||
                   (s.wkind == kFP8 && gv_block_ok(s.block_in) && s.block_out > 0 && n % s.block_out == 0),
               "a BF16 or FP8 weight (FP8 K blocks 16 x a power of two, groups of whole row blocks)"),
          need(s.k % 32 == 0 && s.k <= kGvMaxK, "K a multiple of 32, at most 8192"), act_f32_or_bf16(s)};
}
Reqs gl_dequant_split(const OpSite& s) {
  return {need(s.numerics == Numerics::Official, "official numerics (bounded hi + lo split of f32 inputs)"),
          need(s.wkind == kFP8, "an FP8 weight"), need(s.act == DType::F32, "f32 activations"),
          need(s.n % (8 * (s.groups ? s.groups : 1)) == 0 && s.k % 8 == 0, "N per group and K multiples of 8")};
}
Reqs gl_dequant_bf16(const OpSite& s) {
  return {need(s.wkind == kFP8, "an FP8 weight"), need(s.act == DType::BF16, "bf16 activations (fast numerics)"),
          need(s.n % (8 * (s.groups ? s.groups : 1)) == 0 && s.k % 8 == 0, "N per group and K multiples of 8"),
          act_f32_or_bf16(s)};
}

// ---- sparse_attention ----
constexpr int kFlashHeads = 64, kFlashD = 512;  // attention_flash.cuh
Reqs attn_flash(const OpSite& s) {
  return {need(s.numerics == Numerics::Fast, "fast numerics (BF16 operands, BF16 probabilities)"),
          need(s.act == DType::BF16, "bf16 activations"), need(s.head_dim == kFlashD, "head dim 512"),
          need(s.heads % kFlashHeads == 0, "heads a multiple of 64")};
}
Reqs attn_mma_bf16(const OpSite& s) {
  return {need(s.numerics == Numerics::Fast, "fast numerics (BF16 operands, BF16 probabilities)"),
          need(s.act == DType::BF16, "bf16 activations"), need(s.head_dim == 512, "head dim 512"),
          need(s.heads % 16 == 0, "heads a multiple of 16")};
}
Reqs attn_mma_split(const OpSite& s) {
  return {need(s.numerics == Numerics::Official, "official numerics (bounded hi + lo split)"),
          need(s.act == DType::F32, "f32 activations"), need(s.head_dim == 512, "head dim 512"),
          need(s.heads % 16 == 0, "heads a multiple of 16")};
}
Reqs attn_fp64(const OpSite& s) {
  return {need(s.head_dim % 32 == 0 && s.head_dim <= 512, "a head dim that is a multiple of 32, at most 512"),
          act_f32_or_bf16(s)};
}

// ---- indexer_topk ----
std::string idx_limits(const OpSite& s) {
  return need(s.topk <= 2048 && s.cand_topk <= 2048, "top-k and candidate top-k at most 2048");
}
Reqs idx_fp8(const OpSite& s) {
  return {need(s.numerics == Numerics::Fast, "fast numerics (the fp32 head sum of the fast specification)"),
          need(s.act == DType::BF16, "bf16 activations (keys read in place from the bf16 cache)"),
          need(s.head_dim == 128, "index head dim 128"),
          need(s.heads == 16 || s.heads == 32 || s.heads == 64, "16, 32 or 64 index heads"), idx_limits(s)};
}
Reqs idx_wg(const OpSite& s) {
  Reqs r = idx_fp8(s);
  r.push_back(need(s.cand != 2, "not Reindex (its compact candidate entries run mma_fp8)"));
  return r;
}
Reqs idx_fast_simt(const OpSite& s) {
  return {need(s.numerics == Numerics::Fast, "fast numerics (the fp32 head sum of the fast specification)"),
          idx_limits(s), act_f32_or_bf16(s)};
}
Reqs idx_mma(const OpSite& s) {
  return {need(s.numerics == Numerics::Official, "official numerics (FP4-QDQ'd q and keys, the double head sum)"),
          need(s.head_dim == 128, "index head dim 128"),
          need(s.heads == 16 || s.heads == 32 || s.heads == 64, "16, 32 or 64 index heads"), idx_limits(s),
          act_f32_or_bf16(s)};
}
Reqs idx_fp64(const OpSite& s) {
  return {need(s.numerics != Numerics::Fast, "reference or official numerics (the double head sum)"),
          need(s.heads * s.head_dim <= 8192 && s.heads <= 128, "at most 128 heads and 8192 q values per token"),
          idx_limits(s), act_f32_or_bf16(s)};
}

// ---- moe_experts ----
Reqs moe_mma(const OpSite& s) {
  return {need(s.wkind == kFP4, "FP4 experts"), need(s.act_block > 0, "FP8-quantized activations"),
          need(s.n % 32 == 0 && s.k % 32 == 0, "D and the expert width multiples of 32"), act_f32_or_bf16(s)};
}

// moe_wgmma.cuh: FP8 wgmma for act_block 128 (V4), BF16 wgmma for 32 (V4.1); 128-wide blocks.
Reqs moe_wg(const OpSite& s) {
  return {need(s.numerics == Numerics::Fast, "fast numerics (bf16 tokens, tensor-core accumulation)"),
          need(s.act == DType::BF16, "bf16 tokens"), need(s.wkind == kFP4, "FP4 experts"),
          need(s.act_block == 128 || s.act_block == 32, "activations FP8-quantized per 128 or per 32"),
          need(s.n % 128 == 0 && s.k % 128 == 0, "D and the expert width multiples of 128"), act_f32_or_bf16(s)};
}

Reqs moe_gemv(const OpSite& s) {
  return {need(s.numerics == Numerics::Fast, "fast numerics (bf16 tokens, f32 accumulation)"),
          need(s.act == DType::BF16, "bf16 tokens"), need(s.wkind == kFP4, "FP4 experts"),
          need(s.act_block > 0, "FP8-quantized activations"),
          need(s.n % 32 == 0 && s.k % 32 == 0 && s.n <= kGvMaxK && s.k <= kGvMaxK,
               "D and the expert width multiples of 32, at most 8192"),
          act_f32_or_bf16(s)};
}

// ---- hc_mix ----
Reqs hc_any(const OpSite& s) { return {act_f32_or_bf16(s)}; }
// The fast mHC kernels (mhc_fast.cu); shapes they are not written for (n != 4, D not a multiple
// of 64 or above 8192) fall back to the exact kernels at the call.
Reqs hc_fast(const OpSite& s) {
  return {need(s.numerics == Numerics::Fast, "fast numerics (f32 dots and sums)"),
          need(s.act == DType::BF16, "bf16 residual streams"), act_f32_or_bf16(s)};
}

// The derived per-element bounds in numeric form (docs/kernels.md "Numeric forms of the derived
// bounds" has the derivations).
Tolerance derived_tolerance(double rel, double abs, bool vs_rows, const char* test, const char* note) {
  Tolerance t = tolerance(rel, abs, true, note);
  t.abs_vs_rows = vs_rows;
  t.derived = test;
  return t;
}

std::vector<KernelImpl> build() {
  // BF16 P: |o - o_ref| <= ((E - 1) + E (1 + 2^-8)(2^-8 + gamma)) sum_j w_j |v_j| + one bf16 ulp,
  // and sum_j w_j |v_j| <= max|rows|: 2^-7 of max|rows| while the score and accumulation terms
  // stay below 2^-8; in L2 4x the P roundings' expectation (2^-8 / sqrt(3) relative).
  // flash_bf16 and mma_bf16 share it: the same arithmetic, the derivation's tile size and rounding
  // counts differ (tests/cuda/test_attention_fast.cpp).
  const Tolerance attn_bf16_p = derived_tolerance(1e-2, 0x1p-7, true, "tests/cuda/test_attention_fast.cpp",
                                                  "BF16 P: 2^-8 of sum p|v|");
  // Accumulation-order flips of the bf16 roundings of g, u, h, y and of h's FP8 rounding: a
  // quarter of the fast roundings' own distance in L2 (the test's second check), a few FP8 flips
  // of h per element (the SIMT bound allows one at 5e-3).
  const Tolerance moe_tensor_cores = derived_tolerance(6e-3, 2e-2, false, "tests/cuda/test_moe_mma.cpp",
                                                       "rounding flips of g, u, h and y");
  // FP8 wgmma (moe_wgmma.cu): each 128-K partial sum formed in the tensor core with 13 fraction
  // bits below the largest term of each k32 step (33 terms, 4 steps), so g and u deviate by up to
  // ~2^-13 x 33 x 4 of a block's largest partial (1.6e-2, worst case) and ~4e-4 in L2 (random
  // signs; test_cutlass.cpp). Carried through the roundings: h's e4m3 QDQ (3 mantissa bits,
  // spacing 2^-3 relative) flips with probability ~ 2 x 4e-4 / 2^-3 ~ 0.6%, each flip one e4m3
  // step, so y moves by sqrt(0.006) x 2^-3 ~ 1e-2 of |y| in L2: rel 2e-2 leaves 2x; per element
  // a few flips of the largest |w2 h| terms, 5e-2 of max|y|. The per-element bound itself is
  // evaluated from the data in the test (dot_fp8 and the interval replay of the roundings).
  const Tolerance moe_wgmma_bound = derived_tolerance(2e-2, 5e-2, false, "tests/cuda/test_moe_mma.cpp",
                                                      "FP8 accumulation, rounding and e4m3 flips of g, u, h and y");
  // GEMV: |err| <= (V + C/32 + 13) 2^-24 sum|x w| per element (f32 accumulation depth; V values
  // per 16-byte chunk, C chunks per row), + one bf16 ulp of a bf16 output. As numbers: depth <= 40
  // at K <= 8192 gives 2.4e-6 sum|x w|, and sum|x w| stays within ~64 |y| on non-cancelling rows.
  const Tolerance gemv_bound = derived_tolerance(2e-4, 2e-4, false, "tests/cuda/test_gemv.cpp",
                                                 "f32 accumulation depth x sum|x w|");
  // The routed experts' GEMV: the same accumulation carried through the bf16 roundings of g, u,
  // h, y and h's FP8 rounding: the tensor-core MoE's numeric form (accumulation-order flips).
  const Tolerance moe_gemv_bound = derived_tolerance(6e-3, 2e-2, false, "tests/cuda/test_moe_gemv.cpp",
                                                     "rounding flips of g, u, h and y");
  // gemv_fp8: the tensor core's FP8 accumulation within each 32-K MMA (13 fraction bits below the
  // step's largest term, as the wgmma path's bound models it, but never carried over a promotion),
  // then the same roundings: the wgmma path's numeric form at a finer promotion.
  const Tolerance moe_gemv_fp8_bound = derived_tolerance(2e-2, 5e-2, false, "tests/cuda/test_moe_gemv.cpp",
                                                         "FP8 accumulation per 32 K, rounding flips of g, u, h and y");
  // Fused mHC pre: the dots' accumulation (exact products of fn's three bf16 pieces; tensor-core
  // chunks of 64 columns, <= 440 u each, promoted to f32: depth <= 440 + nD/64 + S/32 + 5),
  // ~4e-5 of sum|fn x| rho at nD = 16384, carried through the sigmoids and Sinkhorn (pre / post / comb
  // stay within 1e-5 at the model's scales), then at most one bf16 flip of u and of xn per
  // element: 2^-7 of |xn| each, rare (rel L2 ~1e-4).
  const Tolerance hc_pre_bound = derived_tolerance(2e-4, 0x1p-7, false, "tests/cuda/test_mhc_fast.cpp",
                                                   "tensor-core dots promoted every 64 columns; bf16 flips of u and xn");
  const std::string lin = "tests/cuda/test_linear.cpp";
  std::vector<KernelImpl> r = {
      {"linear", "gemv_stream", "decode-sized GEMV streaming the weight: each CTA a contiguous range of whole rows, "
       "a producer warp keeping 4 bulk copies (<= 16 KB of rows each) in flight into a shared-memory ring (the first "
       "issued before the kernel waits for its inputs), 8 consumer warps doing gemv's arithmetic per (row, K slice) "
       "from shared memory, slices summed in order by the producer", gemv_big, 0, gemv_bound,
       "tests/cuda/test_gemv.cpp", kGvMaxRows},
      {"linear", "gemv_stream", "the same streaming GEMV for one row of a weight cuBLASLt runs from 2 rows on (the "
       "head)", gemv_one_big, 0, gemv_bound, "tests/cuda/test_gemv.cpp", 1},
      {"linear", "gemv", "decode-sized GEMV: warps along weight rows, lanes along K with 16-byte loads (2 x 4 in "
       "flight), bf16 activations staged in shared memory (FP8-QDQ'd while staged where quantized), FP8 / FP4 decoded by "
       "cvt.e4m3x2, f32 accumulation per 16-byte chunk, block scale, warp-shuffle and K-slice reduction", gemv, 0,
       gemv_bound, "tests/cuda/test_gemv.cpp", kGvMaxRows},
      {"linear", "gemv", "the same GEMV for one row where cuBLASLt runs the site from 2 rows on", gemv_one, 0,
       gemv_bound, "tests/cuda/test_gemv.cpp", 1},
      {"linear", "cutlass_fp8", "activations (bf16) quantized to e4m3 per 128 by the same kernel, CUTLASS Hopper "
       "blockwise FP8 GEMM (TMA, wgmma, persistent warp-specialized; swap-AB 128x64 tiles with stream-K while 128x128 "
       "tiles would fill less than half the SMs, else 128x128 with 2-CTA clusters), weight block scales converted to f32 once at load, f32 promotion every 128 K, bf16 D from "
       "the epilogue", cutlass_fp8, kCutlassMinRows,
       tolerance(2e-3, 2e-2, true, "FP8 tensor-core accumulation before promotion"), lin},
      {"linear", "cublaslt_fp8", "activations (f32 or bf16) quantized to e4m3 per 128 by our kernel, cuBLASLt "
       "block-scaled FP8 GEMM (weights BLK128x128_32F, activations VEC128_32F), f32 accumulation, D written by "
       "cuBLASLt in the output's dtype", lt_fp8, 0,
       tolerance(2e-3, 2e-2, true, "FP8 tensor-core accumulation before promotion"), lin},
      {"linear", "dequant_bf16_lt", "weight dequantized per call to BF16 (exact), activations QDQ'd straight into BF16 "
       "(exact), one cuBLASLt BF16 GEMM writing the output's dtype, f32 accumulation", dequant_lt, 64,
       tolerance(2e-5, 1e-4, true), lin},
      {"linear", "cublaslt_bf16", "one cuBLASLt BF16 GEMM on the BF16 activations (no split), f32 accumulation, D "
       "written in the output's dtype", lt_bf16, 0, tolerance(2e-5, 1e-4, true), lin},
      {"linear", "cublaslt_bf16_split", "f32 activations split into hi + lo BF16 terms, one cuBLASLt BF16 GEMM over both, "
       "f32 accumulation", lt_bf16_split, 0, tolerance(2e-5, 1e-4), lin},
      {"linear", "simt", "SIMT tiles (decode sizes: a few-rows kernel), weights decoded in shared memory, f32 or bf16 "
       "activations widened, double accumulation over k ascending", simt_gemm, 0,
       exact_tolerance("a bf16 output: the reference's rounding"), lin},
      // The streaming GEMV at any weight size, after every regime the plan uses: never chosen on
      // its own, found by `--kernels linear=gemv_stream` (the same-job comparison with gemv).
      {"linear", "gemv_stream", "the streaming GEMV below the weight size where the plan prefers it (forced only)",
       gemv, 0, gemv_bound, "tests/cuda/test_gemv.cpp", kGvMaxRows},
      {"linear", "gemv_stream", "the streaming GEMV for one row below the weight size where the plan prefers it "
       "(forced only)", gemv_one, 0, gemv_bound, "tests/cuda/test_gemv.cpp", 1},
      {"grouped_linear", "gemv", "wo_a at decode sizes: linear's gemv, every group in one launch (the group's "
       "weight rows, the bf16 inputs read in place with row stride G*K)", gl_gemv, 0,
       gemv_bound, "tests/cuda/test_gemv.cpp", kGvMaxRows},
      {"grouped_linear", "dequant_bf16_lt_split", "wo_a per group: weight dequantized to BF16, f32 inputs split hi + lo, "
       "two cuBLASLt BF16 GEMMs", gl_dequant_split, 64, tolerance(2e-5, 1e-4), lin},
      {"grouped_linear", "dequant_bf16_lt", "wo_a per group: the weight's BF16 copy made at load (as the official "
       "convert.py keeps wo_a: BF16), the BF16 inputs read in place (row stride G*K), one cuBLASLt BF16 GEMM per group "
       "writing the output's dtype", gl_dequant_bf16, 64,
       tolerance(2e-5, 1e-4, true), lin},
      {"grouped_linear", "simt", "SIMT kernel with a group grid dimension, double accumulation", simt_gemm, 0,
       exact_tolerance("a bf16 output: the reference's rounding"), lin},
      // From 128 tokens: 1.5x flash_bf16 on BF16 rows (CudaAttnBench) and 1.9x in bench prefill,
      // where the packed rows of fast numerics' cache are dequantized once per step into BF16
      // pools (docs/performance.md, "Sparse attention on wgmma"). Decode steps keep flash_bf16:
      // there the rows are dequantized in registers and no same-run model comparison was made.
      {"sparse_attention", "wgmma_bf16", "CTA per (token, 64 heads), two warpgroups: q and double-buffered 64-row "
       "tiles in 128-byte swizzled shared memory (bf16 rows by cp.async; prefill steps read packed caches from BF16 "
       "pools dequantized once per step, decode steps dequantize them in registers while q.k^T runs), wgmma "
       "m64n32k16 for each warpgroup's 32 rows of S and m64n256k16 (P from shared memory, the tile read MN-major as V) for its 256 output dims, maxima swapped between the warpgroups, f32 online softmax (exp2), "
       "BF16 P, the sink in the final normalizer; decode-sized steps split a token's rows over CTAs and combine",
       attn_flash, 128, attn_bf16_p, "tests/cuda/test_attention_fast.cpp"},
      {"sparse_attention", "flash_bf16", "CTA per (token, 64 heads), 8 warps: q in shared memory, rows gathered by "
       "index with cp.async into double-buffered tiles of 64 (staged once per token), mma.sync m16n8k16 on the BF16 "
       "operands (one per product) for q.k^T and P.V, f32 online softmax in registers (exp2), BF16 P, the sink in the "
       "final normalizer; decode-sized steps split a token's rows over CTAs and combine", attn_flash, 0, attn_bf16_p,
       "tests/cuda/test_attention_fast.cpp"},
      {"sparse_attention", "mma_bf16", "CTA per (token, 16 heads), BF16 q and rows as the MMA operands (one mma.sync "
       "m16n8k16 per product), f32 online softmax with the sink, probabilities rounded to BF16 for P.V, bf16 output",
       attn_mma_bf16, 0, attn_bf16_p, "tests/cuda/test_attention_fast.cpp"},
      {"sparse_attention", "mma_split_bf16", "CTA per (token, 16 heads), rows as BF16 hi/lo halves, 3 mma.sync per "
       "product, f32 online softmax with the sink", attn_mma_split, 0, tolerance(1e-4, 6e-4),
       "tests/cuda/test_attention.cpp"},
      {"sparse_attention", "fp64", "block per (token, 8 heads), warp per head, rows staged 16 at a time (bf16 rows "
       "widened), online softmax in double", attn_fp64, 0, tolerance(1e-6, 1e-6, true),
       "tests/cuda/test_attention.cpp"},
      {"indexer_topk", "wgmma_fp8", "fast specification: keys (read in place from the paged cache, bf16 or packed FP4) "
       "converted to e4m3 once per CTA with a power-of-two scale per row (exact within 14 binades; other rows rescored "
       "on CUDA cores) as the wgmma A operand, the e4m3 q of 512/Hi tokens resident as B (N = heads), one m64nHk32 per "
       "32-dim block, ReLU x weight and the head sum in each thread's registers; warp-specialized (a converter "
       "warpgroup, two MMA warpgroups); few-pass radix top-k (topk_rows.cu)", idx_wg, 128,
       exact_tolerance("scores and indices"), "tests/cuda/test_indexer_fast.cpp"},
      {"indexer_topk", "mma_fp8", "fast specification: q (per token and head) and keys (per row, read in place from the "
       "paged bf16 cache) as e4m3 with a power-of-two scale (exact for FP4-QDQ'd rows within 14 binades; other rows "
       "rescored on CUDA cores), mma.sync m16n8k32 per 32-dim block, ReLU x weight and the head sum in registers in "
       "f32, up to 8 tokens x 512 rows per CTA (fewer rows at decode); few-pass radix top-k (topk_rows.cu)", idx_fp8, 0, exact_tolerance("scores and indices"),
       "tests/cuda/test_indexer_fast.cpp"},
      {"indexer_topk", "fast_simt", "fast specification on CUDA cores, one thread per (token, row); few-pass radix "
       "top-k", idx_fast_simt, 0, exact_tolerance("scores and indices"), "tests/cuda/test_indexer_fast.cpp"},
      {"indexer_topk", "mma_exact", "FP4-QDQ'd q and keys as BF16 (exact; bf16 inputs read as they are), mma.sync per "
       "32-dim block (exact sums), head sum in double in the reference's order; radix top-k", idx_mma, 0,
       exact_tolerance("indices"), "tests/cuda/test_indexer_moe.cpp"},
      {"indexer_topk", "fp64", "thread per (token, row) in double in the reference's order (bf16 inputs widened); "
       "radix top-k over (score, ~row) keys", idx_fp64, 0, exact_tolerance("indices"),
       "tests/cuda/test_indexer_moe.cpp"},
      {"hc_mix", "fast_f32", "hc_pre fused_fast's mixes alone: split-K tensor-core dots (fn in three exact bf16 "
       "pieces, f32 promotion every 64 columns) and f32 sum of squares, warp per token for rho, sigmoids and Sinkhorn", hc_fast, 0, hc_pre_bound, "tests/cuda/test_mhc_fast.cpp"},
      {"hc_mix", "default", "dot products and mean square in double, Sinkhorn on one thread per token", hc_any, 0,
       tolerance(1e-5, 1e-5), "tests/cuda/test_elementwise.cpp"},
      {"hc_pre", "fused_fast", "bf16 streams read twice: split-K mma.sync dots (CTA per 128 tokens x K slice, fn in three "
       "exact bf16 pieces in shared memory, X fragments straight from global memory, f32 promotion every 64 columns) "
       "and f32 sum of squares, warp per token for the partial sums, rho, sigmoids and "
       "Sinkhorn (lane 0, the reference's order), CTA per token for the collapse (rounded to bf16) and the RMSNorm",
       hc_fast, 0, hc_pre_bound, "tests/cuda/test_mhc_fast.cpp"},
      {"hc_pre", "composed", "the exact hc_mix, hc_collapse (into an activation-dtype row) and rms_norm kernels in "
       "sequence", hc_any, 0, tolerance(1e-5, 1e-5, true), "tests/cuda/test_mhc_fast.cpp"},
      {"hc_post", "vec_f32", "thread per (token, 8 channels), 16-byte bf16 loads and stores, f32 FMA", hc_fast, 0,
       tolerance(1e-6, 1e-6, true, "f32 FMA over 1 + n terms"), "tests/cuda/test_mhc_fast.cpp"},
      {"hc_post", "default", "thread per (token, channel), double accumulation", hc_any, 0, tolerance(1e-7, 3e-7, true),
       "tests/cuda/test_elementwise.cpp"},
      {"moe_experts", "gemv_fp8", "decode sizes on tensor cores: tiles of <= 8 sorted rows as the n of mma.sync (two "
       "m16n8k16 f16 per 32-K block: what m16n8k32 e4m3 is on sm_90, with the tokens staged as f16), 16 weight "
       "rows per warp (w1 and w3 rows of the same columns together, SwiGLU with the fast bf16 "
       "roundings in registers), FP4 read once by 16-byte lane loads, a quad transpose and a re-bias into e4m3 bytes, "
       "tokens and h as e4m3 codes with their block scales, each 32-K MMA promoted in f32 with its two scales; "
       "combine", moe_gemv, 0, moe_gemv_fp8_bound, "tests/cuda/test_moe_gemv.cpp", 64},
      {"moe_experts", "gemv", "decode sizes: tiles of <= 4 sorted rows of one expert, the GEMV of linear gemv per "
       "(tile, column block), w1 and w3 rows in one pass with SwiGLU (fast bf16 roundings) fused, FP8 QDQ of h, w2 GEMV, "
       "combine; each active expert's weights streamed once", moe_gemv, 0,
       moe_gemv_bound, "tests/cuda/test_moe_gemv.cpp", 64},
      {"moe_experts", "wgmma", "device counting sort, tokens quantized into expert order, persistent warp-specialized "
       "grouped GEMMs over (128-row tile, 128 weight rows): FP4 tiles by TMA (a tensor map per expert, made once per "
       "list), a converter warpgroup converts them in shared memory through byte-permute tables (act 128: to e4m3 with "
       "one power-of-two scale per 128x128 block, exact within 14 binades, else the list runs mma_bf16; act 32: to "
       "BF16), tokens by TMA (prefetched into L2 with the weights), two "
       "warpgroups of wgmma (FP8 with f32 promotion per 128 K, or BF16); w1 and w3 in one GEMM with SwiGLU, the "
       "routing weight and the bf16 roundings in its epilogue, bf16 y, combine in slot order", moe_wg, 0,
       moe_wgmma_bound, "tests/cuda/test_moe_mma.cpp"},
      {"moe_experts", "mma_bf16", "device counting sort, 128x128 tiles, FP4 weights dequantized to BF16 in shared "
       "memory, activations QDQ'd straight into BF16, mma.sync BF16 -> f32; SwiGLU, QDQ of h, combine (fast: the "
       "official BF16 roundings of g, u, h and each expert output)", moe_mma, 0, moe_tensor_cores,
       "tests/cuda/test_moe_mma.cpp"},
      {"moe_experts", "simt", "device counting sort, grouped SIMT GEMMs in double (few-rows kernel at decode sizes) on "
       "an f32 copy of the tokens", simt_gemm, 0, tolerance(1e-4, 5e-3, false, "an FP8 flip of h"),
       "tests/cuda/test_indexer_moe.cpp"},
  };
  // Families with one CUDA implementation each (docs/kernels.md has their formulas).
  struct One {
    const char* op;
    const char* what;
    Tolerance tol;
  };
  const Tolerance exact = exact_tolerance(), elementwise = tolerance(1e-7, 3e-7, true);
  const One ones[] = {
      {"embed", "row copies of the decoded table", exact},
      {"add", "elementwise f32 add of f32 or bf16 inputs, rounded to the output dtype", exact},
      {"rms_norm", "block per row, sum of squares in double", elementwise},
      {"rope", "block per row, its cos/sin once in double rounded to f32 (shared by the heads), outputs in double "
       "rounded once", elementwise},
      {"fp8_qdq", "warp per block, ue8m0 scale, RNE e4m3 with saturation", exact},
      {"fp4_qdq", "warp per block, ties-to-even e2m1", exact},
      {"hadamard", "FWHT in shared memory in double", tolerance(1e-7, 2e-7, true)},
      {"hc_collapse", "thread per (token, channel), double accumulation", elementwise},
      {"hc_expand", "row copies", exact},
      {"ring_write", "row copies into the window ring (packed rows: a warp per scale block quantizes)", exact},
      {"paged_write", "row copies into paged blocks (packed rows: a warp per scale block quantizes)", exact},
      {"compressor", "block per emitted row, softmax pooling in double; the state rows the step changes rewritten",
       tolerance(1e-7, 3e-7, true, "the pooled rows; the state exact")},
      {"moe_route", "block per token, sqrt-softplus in double once per expert (a thread each) into shared memory, k rounds of warp arg-max from registers",
       tolerance(1e-7, 3e-7, false, "the routing weights; the indices exact")},
      {"swiglu", "silu in double, clamps in f32", elementwise},
      {"engram_mix", "gate per (token, stream) in double; update in double", tolerance(1.2e-7, 1.2e-7, true)},
  };
  for (const One& o : ones) r.push_back({o.op, "default", o.what, hc_any, 0, o.tol, "tests/cuda/test_elementwise.cpp"});
  return r;
}

}  // namespace

const std::vector<KernelImpl>& cuda_kernel_registry() {
  static const std::vector<KernelImpl> r = build();  // immutable after construction
  return r;
}

}  // namespace dil
