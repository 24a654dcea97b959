// MoE on the device, with no host round trip: routing (sqrt-softplus scores, bias for the
// selection only, top-k with lowest-index ties, or hash routing through tid2eid), then the
// routed experts: (token, k) pairs counted and sorted by expert on the device, a tile map
// built from the counts, grouped GEMMs over the experts' own weights (FP4 / FP8 / BF16,
// dequantized in shared memory; activations FP8-QDQ'd when act_block > 0, i.e. W4A8 numerics
// as the official code has them), SwiGLU with clamps and the routing weight, and a combine
// that sums each token's k expert outputs in k order (deterministic, no atomics on floats).
// x and out are f32 or bf16 (backend.h); MoeExpertsArgs::round_bf16 (fast numerics) rounds g,
// u, h and every expert output to bf16 where the official code holds them in bf16. The SIMT
// paths read the tokens from an f32 copy (QDQ'd, or widened from bf16): a conversion into f32
// scratch until the Hopper MoE (docs/kernels.md) replaces them.
#include <algorithm>
#include <cstring>

#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/gemv_fast.cuh"
#include "kernels/cuda/moe_gemv_fp8.cuh"
#include "kernels/cuda/moe_mma.cuh"
#include "kernels/cuda/moe_wgmma.cuh"

namespace dil::cuda {
namespace {

constexpr int kMaxTopk = 16;

// torch softplus (threshold 20) then sqrt, in double, rounded once (as the reference).
__device__ __forceinline__ float sqrt_softplus(float l) {
  double x = l;
  return float(sqrt(x > 20.0 ? x : log1p(exp(x))));
}

constexpr int kRoutePerLane = 16;  // experts per lane held in registers by the selection: E <= 512

// Threads of moe_route_kernel's block (one token): one per expert where the selection holds the
// scores in registers (E <= 32 * kRoutePerLane), else one warp.
inline int route_threads(int E) { return E <= 32 * kRoutePerLane ? int(ceil_div(E, 32)) * 32 : 32; }

// One block per token (route_threads). Image-span tokens (image_mask[t] != 0, V4.1) select with
// bias_vl instead of bias. The scores (a double softplus and sqrt each) are evaluated once per
// expert, one expert per thread into shared memory (one warp evaluating 8 of them one after
// the other took 15-19 us per decode token); warp 0 then selects: k rounds of a warp arg-max
// over (score + bias, lowest expert id on ties) from registers. E > 32 * kRoutePerLane: one
// warp re-evaluates the scores in each round (the same values). Hash-routed layers (tid2eid):
// lane i < k evaluates its chosen expert's score. Weights: the chosen experts' scores summed in
// k order in double, as the reference.
__global__ void moe_route_kernel(const float* logits, const float* bias_text, const float* bias_vl,
                                 const int32_t* image_mask, const int32_t* tid2eid, const int32_t* ids,
                                 int T, int E, int k, float route_scale, float norm_eps, float* out_w,
                                 int32_t* out_idx) {
  pdl_enter();
  __shared__ float s_sp[32 * kRoutePerLane], s_v[32 * kRoutePerLane];  // [E] score, score + bias
  const int t = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float* bias = (image_mask && image_mask[t] != 0) ? bias_vl : bias_text;
  const float* l = logits + int64_t(t) * E;
  int chosen[kMaxTopk];
  float csc[kMaxTopk];  // score (no bias) of each chosen expert
  // The better of two (value, expert) candidates: larger value, then lower expert id.
  auto better = [](float v, int e, float bv, int be) { return v > bv || (v == bv && e < be); };
  if (tid2eid) {
    if (warp != 0) return;
    const int mine = lane < k ? tid2eid[int64_t(ids[t]) * k + lane] : 0;
    const float sc = lane < k ? sqrt_softplus(l[mine]) : 0.f;
    for (int i = 0; i < k; ++i) {
      chosen[i] = __shfl_sync(0xffffffffu, mine, i);
      csc[i] = __shfl_sync(0xffffffffu, sc, i);
    }
  } else if (E <= 32 * kRoutePerLane) {
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      const float sp = sqrt_softplus(l[e]);
      s_sp[e] = sp;
      s_v[e] = sp + (bias ? bias[e] : 0.f);
    }
    __syncthreads();
    if (warp != 0) return;
    float sp[kRoutePerLane], v[kRoutePerLane];  // expert lane + 32 j: score, score + bias
    uint32_t taken = 0;                          // bit j: expert lane + 32 j chosen already
#pragma unroll
    for (int j = 0; j < kRoutePerLane; ++j) {
      const int e = lane + 32 * j;
      sp[j] = e < E ? s_sp[e] : 0.f;
      v[j] = e < E ? s_v[e] : 0.f;
    }
    for (int i = 0; i < k; ++i) {
      float best = -INFINITY, bsp = 0.f;
      int bi = 0x7fffffff;
#pragma unroll
      for (int j = 0; j < kRoutePerLane; ++j) {
        const int e = lane + 32 * j;
        if (e < E && !((taken >> j) & 1u) && better(v[j], e, best, bi)) {
          best = v[j];
          bi = e;
          bsp = sp[j];
        }
      }
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o), os = __shfl_xor_sync(0xffffffffu, bsp, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (better(ov, oi, best, bi)) {
          best = ov;
          bi = oi;
          bsp = os;
        }
      }
      chosen[i] = bi;
      csc[i] = bsp;
      if (bi < E && (bi & 31) == lane) taken |= 1u << (bi >> 5);
    }
  } else {
    if (warp != 0) return;
    for (int i = 0; i < k; ++i) {
      float best = -INFINITY;
      int bi = 0x7fffffff;
      for (int e = lane; e < E; e += 32) {
        bool taken = false;
        for (int j = 0; j < i; ++j) taken |= chosen[j] == e;
        if (taken) continue;
        float v = sqrt_softplus(l[e]) + (bias ? bias[e] : 0.f);
        if (better(v, e, best, bi)) {
          best = v;
          bi = e;
        }
      }
      for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (better(ov, oi, best, bi)) {
          best = ov;
          bi = oi;
        }
      }
      chosen[i] = bi;
    }
    if (lane == 0)
      for (int i = 0; i < k; ++i) csc[i] = sqrt_softplus(l[chosen[i]]);
  }
  if (lane != 0) return;
  double sum = 0.0;
  for (int i = 0; i < k; ++i) sum += csc[i];
  const float den = float(sum) + norm_eps;
  for (int i = 0; i < k; ++i) {
    out_w[int64_t(t) * k + i] = csc[i] / den * route_scale;
    out_idx[int64_t(t) * k + i] = chosen[i];
  }
}

// ---- routed experts ----

struct MoeIndex {
  int32_t* counts;     // [E]
  int32_t* offsets;    // [E + 1]
  int32_t* fill;       // [E]
  int32_t* sorted_tok; // [Tk] token of each sorted row
  int32_t* sorted_pair;// [Tk] t*k + i of each sorted row
  int32_t* pos_of;     // [Tk] sorted row of pair t*k + i (-1: dropped)
  int32_t* tile_e;     // [max_tiles] expert of each row tile
  int32_t* tile_r0;    // [max_tiles] first sorted row of the tile
  int32_t* n_tiles;    // [1]
};

// Expert ids are global; this call holds experts [e0, e0 + E) (expert parallelism), others
// and -1 (padding rows) are skipped.
__global__ void moe_count_kernel(const int32_t* idx, int64_t n, int e0, int E, int32_t* counts) {
  pdl_enter();
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  int e = idx[i] < 0 ? -1 : idx[i] - e0;
  if (e >= 0 && e < E) atomicAdd(&counts[e], 1);
}

// One block of kScanThreads (a multiple of 32, at most 1024): the exclusive scans of the
// counts (offsets) and of each expert's tiles ceil(count / bm) (the tile map, cut at max_tiles),
// in chunks of kScanThreads experts with the running totals carried. The same map as a serial
// walk over the experts, which one thread took 27 us for at 256 experts.
constexpr int kScanThreads = 512;
__global__ void __launch_bounds__(kScanThreads) moe_scan_kernel(MoeIndex I, int E, int max_tiles, int bm) {
  pdl_enter();
  __shared__ int wc[32], wt[32];  // per warp: inclusive totals of counts / tiles, then their scan
  __shared__ int carry_c, carry_t;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = int(blockDim.x) >> 5;
  if (threadIdx.x == 0) carry_c = carry_t = 0;
  __syncthreads();
  for (int base = 0; base < E; base += blockDim.x) {
    const int e = base + int(threadIdx.x);
    const int cnt = e < E ? I.counts[e] : 0, nt = (cnt + bm - 1) / bm;
    int ic = cnt, it = nt;  // inclusive scans within the warp
    for (int o = 1; o < 32; o <<= 1) {
      const int a = __shfl_up_sync(0xffffffffu, ic, o), b = __shfl_up_sync(0xffffffffu, it, o);
      if (lane >= o) ic += a, it += b;
    }
    if (lane == 31) wc[warp] = ic, wt[warp] = it;
    __syncthreads();
    if (warp == 0) {
      int xc = lane < nw ? wc[lane] : 0, xt = lane < nw ? wt[lane] : 0;
      for (int o = 1; o < 32; o <<= 1) {
        const int a = __shfl_up_sync(0xffffffffu, xc, o), b = __shfl_up_sync(0xffffffffu, xt, o);
        if (lane >= o) xc += a, xt += b;
      }
      if (lane < nw) wc[lane] = xc, wt[lane] = xt;
    }
    __syncthreads();
    const int off = carry_c + (warp ? wc[warp - 1] : 0) + ic - cnt;  // exclusive: rows before expert e
    const int t0 = carry_t + (warp ? wt[warp - 1] : 0) + it - nt;   // tiles before expert e
    if (e < E) {
      I.offsets[e] = off;
      I.fill[e] = 0;
      for (int j = 0; j < nt && t0 + j < max_tiles; ++j) {
        I.tile_e[t0 + j] = e;
        I.tile_r0[t0 + j] = off + j * bm;
      }
    }
    __syncthreads();  // every thread has read the carries and wc / wt
    if (threadIdx.x == 0) carry_c += wc[nw - 1], carry_t += wt[nw - 1];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    I.offsets[E] = carry_c;
    *I.n_tiles = min(carry_t, max_tiles);
  }
}

__global__ void moe_scatter_kernel(const int32_t* idx, int64_t n, int k, int e0, int E, MoeIndex I) {
  pdl_enter();
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  int e = idx[i] < 0 ? -1 : idx[i] - e0;
  if (e < 0 || e >= E) {
    I.pos_of[i] = -1;
    return;
  }
  int pos = I.offsets[e] + atomicAdd(&I.fill[e], 1);
  I.sorted_tok[pos] = int32_t(i / k);
  I.sorted_pair[pos] = int32_t(i);
  I.pos_of[i] = pos;
}

// Grouped GEMM: tile y covers sorted rows [tile_r0, min(tile_r0+kBM, offsets[e+1])) of expert
// e; X rows gathered through `gather` (token rows) or read in sorted order (gather null).
__global__ void moe_gemm_kernel(const float* x, int64_t ldx, const int32_t* gather, const WView* experts,
                                MoeIndex I, float* out, int64_t ldo, int64_t N, int64_t K) {
  pdl_enter();
  int tile = blockIdx.y;
  if (tile >= *I.n_tiles) return;
  int e = I.tile_e[tile];
  int64_t r0 = I.tile_r0[tile], r_end = I.offsets[e + 1];
  const WView& w = experts[e];
  gemm_tile(x, ldx, gather, r0, r_end, w, 0, int64_t(blockIdx.x) * kBN, N, K, out, ldo);
}

// The same with the few-rows kernel (tiles of kGemvRows rows).
__global__ void __launch_bounds__(kGemvThreads) moe_gemv_kernel(const float* x, int64_t ldx, const int32_t* gather,
                                                                const WView* experts, MoeIndex I, float* out,
                                                                int64_t ldo, int64_t N, int64_t K) {
  pdl_enter();
  int tile = blockIdx.y;
  if (tile >= *I.n_tiles) return;
  int e = I.tile_e[tile];
  int64_t r0 = I.tile_r0[tile], r_end = min(int64_t(I.offsets[e + 1]), r0 + kGemvRows);
  gemv_tile(x, ldx, gather, r0, r_end, experts[e], 0, int64_t(blockIdx.x) * kGemvThreads, N, K, out, ldo);
}

// h = silu(min(g, lim)) * clamp(u, -lim, lim) * route_w of the row's pair. round_bf16 (fast
// numerics, MoeExpertsArgs): g and u are rounded to bf16 first (the official w1 / w3 GEMMs write
// bf16) and h after (w2's bf16 input), as the reference does.
__global__ void moe_swiglu_kernel(const float* g, const float* u, const float* route_w, const int32_t* sorted_pair,
                                  const int32_t* offsets, int E, float lim, bool round_bf16, float* h, int64_t I_dim) {
  pdl_enter();
  int64_t n = int64_t(offsets[E]) * I_dim;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t r = i / I_dim;
    float gi = g[i], ui = u[i];
    if (round_bf16) {
      gi = d_round_bf16(gi);
      ui = d_round_bf16(ui);
    }
    float gv = fminf(gi, lim);
    float uv = fminf(fmaxf(ui, -lim), lim);
    float hv = d_silu(gv) * uv * route_w[sorted_pair[r]];
    h[i] = round_bf16 ? d_round_bf16(hv) : hv;
  }
}

// In place; `xb` (nullable) also receives the result's BF16 bits (exact) for the tensor-core GEMM.
__global__ void moe_fp8_qdq_rows_kernel(float* x, uint16_t* xb, const int32_t* offsets, int E, int64_t d, int block) {
  pdl_enter();
  int nb = int((d + block - 1) / block);
  int64_t gw = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  int lane = threadIdx.x & 31;
  if (gw >= int64_t(offsets[E]) * nb) return;
  int64_t r = gw / nb;
  int b0 = int(gw % nb) * block, b1 = int(min(int64_t(b0 + block), d));
  float* xr = x + r * d;
  float amax = 0.f;
  for (int c = b0 + lane; c < b1; c += 32) amax = fmaxf(amax, fabsf(xr[c]));
  const float s = d_act_scale(warp_max(amax));
  for (int c = b0 + lane; c < b1; c += 32) {
    const float q = d_act_round(xr[c], s) * s;
    xr[c] = q;
    if (xb) xb[r * d + c] = uint16_t(__float_as_uint(q) >> 16);
  }
}

// out[t] = sum over the token's k slots (k ascending) of its expert outputs y, in double,
// rounded once to f32, then to out's dtype. round_bf16: each y rounded to bf16 first (the
// official w2 GEMM writes bf16).
template <class TO>
__global__ void moe_combine_kernel(const float* y, const int32_t* pos_of, int64_t T, int k, int64_t D,
                                   bool round_bf16, TO* out) {
  pdl_enter();
  int64_t n = T * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t t = i / D, c = i % D;
    double acc = 0.0;
    for (int j = 0; j < k; ++j) {
      int p = pos_of[t * k + j];
      if (p >= 0) {
        const float yv = y[int64_t(p) * D + c];
        acc += round_bf16 ? d_round_bf16(yv) : yv;
      }
    }
    st_act(out + i, float(acc));
  }
}

// Device table of WViews for an expert list, uploaded on first use and kept by the context;
// re-uploaded when the list's contents differ from what was uploaded.
const WView* expert_table(Ctx& c, const std::vector<Weight>* ws) {
  std::vector<WView> h(ws->size());
  for (size_t e = 0; e < ws->size(); ++e) {
    DIL_CHECK((*ws)[e].w.device == Device::CUDA, "moe_experts: expert ", e, " weight not on the GPU");
    h[e] = make_wview((*ws)[e]);
  }
  auto& entry = c.expert_tables[ws];
  if (entry.dev.data() && entry.host.size() == h.size() &&
      std::memcmp(entry.host.data(), h.data(), h.size() * sizeof(WView)) == 0)
    return static_cast<const WView*>(entry.dev.data());
  entry.dev = c.scratch(h.size() * sizeof(WView));
  entry.host = std::move(h);
  // From pageable memory: the runtime stages the bytes before returning (once per list).
  DIL_CUDA(cudaMemcpyAsync(entry.dev.data(), entry.host.data(), entry.host.size() * sizeof(WView),
                           cudaMemcpyHostToDevice, c.stream));
  return static_cast<const WView*>(entry.dev.data());
}

}  // namespace

void moe_route(Ctx& c, const MoeRouteArgs& a) {
  int T = int(a.logits.size(0)), E = int(a.logits.size(1));
  DIL_CHECK(a.topk <= kMaxTopk, "moe_route: topk ", a.topk);
  if (T == 0) return;
  const bool hash = !a.tid2eid.empty();
  DIL_CHECK(!hash || a.tid2eid.dtype == DType::I32, "moe_route: tid2eid must be i32");
  const bool vl = !hash && !a.image_mask.empty();  // hash layers ignore the bias (as the CPU)
  if (vl) {
    DIL_CHECK(a.image_mask.dtype == DType::I32 && a.bias_vl.dtype == DType::F32 && a.image_mask.numel() == T &&
                  a.bias_vl.numel() == E,
              "moe_route: image_mask ", a.image_mask.shape_str(), " bias_vl ", a.bias_vl.shape_str());
  }
  launch_pdl(c, "moe_route_kernel", moe_route_kernel, dim3(unsigned(T)), dim3(unsigned(route_threads(E))), 0,
      a.logits.ptr<float>(), a.bias.empty() ? nullptr : a.bias.ptr<float>(),
      vl ? a.bias_vl.ptr<float>() : nullptr, vl ? a.image_mask.ptr<int32_t>() : nullptr,
      hash ? a.tid2eid.ptr<int32_t>() : nullptr, hash ? a.ids.ptr<int32_t>() : nullptr, T, E, a.topk,
      a.route_scale, a.norm_eps, a.out_w.ptr<float>(), a.out_idx.ptr<int32_t>());
}

void moe_experts(Ctx& c, const MoeExpertsArgs& a, const std::string& impl) {
  int64_t T = a.x.size(0), D = a.x.size(1);
  int k = int(a.route_idx.size(1));
  int E = int(a.w1->size());
  DIL_CHECK(a.w2->size() == size_t(E) && a.w3->size() == size_t(E), "moe_experts: expert lists differ");
  DIL_CHECK(a.out.numel() == T * D, "moe_experts: out ", a.out.shape_str(), " for x ", a.x.shape_str());
  check_f32(a.route_w, "moe_experts route_w");
  if (T == 0) return;
  int64_t Idim = (*a.w1)[0].out;
  const WView* t1 = expert_table(c, a.w1);
  const WView* t2 = expert_table(c, a.w2);
  const WView* t3 = expert_table(c, a.w3);
  int64_t Tk = T * k;
  // mma_bf16 (FP4 weights with FP8-QDQ'd activations, both exact in BF16): kMmaBM-row tiles on
  // the tensor-core path (moe_mma.cu) at every batch size. simt (exact double accumulation):
  // decode-sized batches (a few rows per expert) on the few-rows kernel in tiles of 4 rows,
  // larger ones on the 64-row SIMT tile kernel.
  // As linear(): activations are quantized only in front of FP8/FP4 weights.
  const Weight::Kind kind = (*a.w1)[0].kind;
  const bool quant = a.act_block > 0 && (kind == Weight::Kind::FP8 || kind == Weight::Kind::FP4);
  DIL_CHECK(impl == "wgmma" || impl == "mma_bf16" || impl == "simt" || impl == "gemv" || impl == "gemv_fp8",
            "moe_experts: implementation '", impl, "' has no launcher");
  // wgmma (fast numerics, moe_wgmma.cu): the same 128-row tile map; an expert list whose FP4
  // block scales do not convert to e4m3 exactly runs the BF16 tensor-core path below instead.
  const bool wg = impl == "wgmma";
  if (wg)
    DIL_CHECK(quant && a.x.dtype == DType::BF16 && moe_wgmma_fits(*a.w1, *a.w2, *a.w3, a.act_block),
              "moe_experts: the planned wgmma path cannot run these experts (FP4, bf16 tokens, act_block 128 or 32, "
              "widths multiples of 128, 16-byte aligned weights)");
  const bool mma_ok = impl == "mma_bf16" || wg;
  // gemv (fast numerics, decode sizes: moe_gemv.cu): tiles of kGvMoeRows rows, the tokens
  // QDQ'd into bf16 as for the tensor-core path.
  const bool gv = impl == "gemv";
  // gemv_fp8 (fast numerics, decode sizes: moe_gemv_fp8.cu): the same streaming on FP8 tensor
  // cores, tiles of kGfRows rows, tokens and h as e4m3 codes with their block scales.
  const bool gf = impl == "gemv_fp8";
  if (gv || gf) {
    bool aligned = true;
    for (const std::vector<Weight>* ws : {a.w1, a.w2, a.w3})
      for (const Weight& w : *ws) aligned = aligned && (reinterpret_cast<uintptr_t>(w.w.data) & 15) == 0;
    DIL_CHECK(quant && kind == Weight::Kind::FP4 && a.x.dtype == DType::BF16 && D % 32 == 0 && Idim % 32 == 0 &&
                  D <= kGvMaxK && Idim <= kGvMaxK && aligned,
              "moe_experts: the planned gemv path cannot run these experts (FP4 with quantized bf16 tokens, widths "
              "multiples of 32 up to ", kGvMaxK, ", 16-byte aligned weights)");
  }
  if (mma_ok)
    DIL_CHECK(quant && D % kMmaBK == 0 && Idim % kMmaBK == 0 && moe_mma_fits(*a.w1) && moe_mma_fits(*a.w2) &&
                  moe_mma_fits(*a.w3),
              "moe_experts: the planned tensor-core path cannot run these experts (FP4, 8-byte aligned, widths ",
              "multiples of ", kMmaBK, ")");
  // The tensor-core path wherever it applies, decode-sized batches included (V4-Flash decode,
  // 64 x 6 routed rows: 11.6 against 27.2 ms for 3 layers on the few-rows FP64 kernel, which
  // is bound by its per-weight double conversions).
  const bool few = Tk <= int64_t(8) * E && !mma_ok && !gv && !gf;
  const bool mma = !few && mma_ok;
  const int bm = gf ? kGfRows : gv ? kGvMoeRows : few ? kGemvRows : mma ? kMmaBM : kBM;
  int max_tiles = int(ceil_div(Tk, bm) + E);
  if (gv || gf) max_tiles = int(std::min<int64_t>(max_tiles, Tk));  // every tile holds a row: the grid's y bound
  // Index scratch: one allocation.
  size_t n_i32 = size_t(E) * 3 + 1 + size_t(Tk) * 3 + size_t(max_tiles) * 2 + 1;
  Buffer ib = c.scratch(n_i32 * 4);
  int32_t* p = static_cast<int32_t*>(ib.data());
  MoeIndex I{};
  I.counts = p; p += E;
  I.offsets = p; p += E + 1;
  I.fill = p; p += E;
  I.sorted_tok = p; p += Tk;
  I.sorted_pair = p; p += Tk;
  I.pos_of = p; p += Tk;
  I.tile_e = p; p += max_tiles;
  I.tile_r0 = p; p += max_tiles;
  I.n_tiles = p;
  DIL_CUDA(cudaMemsetAsync(I.counts, 0, size_t(E) * 4, c.stream));
  const int32_t* idx = a.route_idx.ptr<int32_t>();
  launch_pdl(c, "moe_count_kernel", moe_count_kernel, dim3(grid_for(Tk, 256)), dim3(256), 0, idx, Tk, a.expert_offset, E, I.counts);
  launch_pdl(c, "moe_scan_kernel", moe_scan_kernel, dim3(1), dim3(kScanThreads), 0, I, E, max_tiles, bm);
  launch_pdl(c, "moe_scatter_kernel", moe_scatter_kernel, dim3(grid_for(Tk, 256)), dim3(256), 0, idx, Tk, k, a.expert_offset, E, I);

  const MoeTileMap map{I.offsets, I.tile_e, I.tile_r0, I.n_tiles};
  // out = the sum over each token's slots of its sorted rows' expert outputs y [Tk, D] f32
  // (every path but wgmma, which combines its bf16 y itself).
  auto combine = [&](const float* y) {
    with_act(a.out, "moe_experts out", [&](auto to) {
      using TO = decltype(to);
      launch_pdl(c, "moe_combine_kernel", moe_combine_kernel<TO>, dim3(stride_grid(T * D)), dim3(256), 0, y, I.pos_of, T, k, D, a.round_bf16,
                                                                        a.out.ptr<TO>());
    });
  };
  if (wg) {
    static_assert(kWgBM == kMmaBM, "wgmma and its fallback share the tile map");
    MoeWgmmaCall w;
    w.x = a.x.ptr<bf16_t>();
    w.T = T;
    w.D = D;
    w.I = Idim;
    w.k = k;
    w.E = E;
    w.act_block = a.act_block;
    w.lim = a.swiglu_limit;
    w.route_w = a.route_w.ptr<float>();
    w.sorted_tok = I.sorted_tok;
    w.sorted_pair = I.sorted_pair;
    w.pos_of = I.pos_of;
    w.map = map;
    w.max_tiles = max_tiles;
    w.t1 = t1;
    w.t2 = t2;
    w.t3 = t3;
    w.w1 = a.w1;
    w.w2 = a.w2;
    w.w3 = a.w3;
    w.out = a.out;
    if (moe_wgmma(c, w)) return;
  }

  if (gf) {
    // Codes and scales of the tokens ([T, D], token order) and of h ([Tk, I], sorted rows),
    // h = SwiGLU(w1 x, w3 x) * route_w in f32 (sorted rows), y = w2 h, combine.
    const int act = a.act_block;
    Buffer xq8 = c.scratch(size_t(T * D)), xs = c.scratch(size_t(T * ceil_div(D, act)) * 4);
    Buffer hq8 = c.scratch(size_t(Tk * Idim)), hs = c.scratch(size_t(Tk * ceil_div(Idim, act)) * 4);
    Buffer hf = c.scratch(size_t(Tk * Idim) * 4), yg = c.scratch(size_t(Tk * D) * 4);
    with_act(a.x, "moe_experts x", [&](auto tx) {
      using TX = decltype(tx);
      moe_gf_quant<TX>(c, a.x.ptr<const TX>(), T, nullptr, D, act, static_cast<uint8_t*>(xq8.data()),
                       static_cast<float*>(xs.data()));
    });
    const GfMoeArgs fa{I.sorted_tok, I.sorted_pair, a.route_w.ptr<float>(), t1, t2, t3, map, max_tiles, D, Idim,
                       act, a.swiglu_limit, a.round_bf16};
    moe_gf_w13(c, fa, static_cast<const uint8_t*>(xq8.data()), static_cast<const float*>(xs.data()),
               static_cast<float*>(hf.data()));
    moe_gf_quant<float>(c, static_cast<const float*>(hf.data()), Tk, I.offsets + E, Idim, act,
                        static_cast<uint8_t*>(hq8.data()), static_cast<float*>(hs.data()));
    moe_gf_w2(c, fa, static_cast<const uint8_t*>(hq8.data()), static_cast<const float*>(hs.data()),
              static_cast<float*>(yg.data()));
    combine(static_cast<const float*>(yg.data()));
    return;
  }

  // The tokens' rows as the GEMMs read them, shared by every expert they visit: FP8-QDQ'd
  // (quant) straight from x's dtype into BF16 bits (tensor-core path, exact) or f32 (SIMT);
  // unquantized bf16 tokens widened into f32 scratch for the SIMT kernels.
  const float* x = nullptr;  // [T, D] f32 (SIMT paths)
  Buffer xq, xbb, hbb;
  uint16_t* xb = nullptr;  // [T, D] bf16 bits of the QDQ'd tokens (tensor-core path)
  uint16_t* hb = nullptr;  // [Tk, Idim] bf16 bits of the QDQ'd h rows, sorted order (tensor-core path)
  if (mma || gv) {
    xbb = c.scratch(size_t(T * D) * 2);
    hbb = c.scratch(size_t(Tk * Idim) * 2);
    xb = static_cast<uint16_t*>(xbb.data());
    hb = static_cast<uint16_t*>(hbb.data());
    with_act(a.x, "moe_experts x", [&](auto tx) {
      using TX = decltype(tx);
      fp8_qdq(c, a.x.ptr<const TX>(), D, reinterpret_cast<bf16_t*>(xb), D, T, int(D), a.act_block);
    });
  } else if (quant || a.x.dtype != DType::F32) {
    xq = c.scratch(size_t(T * D) * 4);
    float* xf = static_cast<float*>(xq.data());
    with_act(a.x, "moe_experts x", [&](auto tx) {
      using TX = decltype(tx);
      if (quant) fp8_qdq(c, a.x.ptr<const TX>(), D, xf, D, T, int(D), a.act_block);
      else to_f32(c, a.x, xf);
    });
    x = xf;
  } else {
    x = a.x.ptr<float>();
  }
  // Sorted rows are bounded by Tk; buffers sized for that.
  Buffer gb = c.scratch(size_t(Tk * Idim) * 4), ub = c.scratch(size_t(Tk * Idim) * 4);
  float* g = static_cast<float*>(gb.data());
  float* u = static_cast<float*>(ub.data());
  if (gv) {
    // h = SwiGLU(w1 x, w3 x) * route_w into g (f32, sorted rows), its FP8 QDQ into hb, y = w2 hb.
    GvMoeArgs ga{reinterpret_cast<const bf16_t*>(xb), I.sorted_tok, I.sorted_pair, a.route_w.ptr<float>(), t1, t2, t3,
                 map, max_tiles, D, Idim, a.swiglu_limit, a.round_bf16};
    moe_gemv_w13(c, ga, g);
    const int64_t warps = Tk * ceil_div(Idim, a.act_block);
    launch_pdl(c, "moe_fp8_qdq_rows_kernel", moe_fp8_qdq_rows_kernel, dim3(grid_for(warps * 32, 256)), dim3(256), 0, g, hb, I.offsets, E, Idim, a.act_block);
    Buffer yg = c.scratch(size_t(Tk * D) * 4);  // [Tk, D] f32, sorted rows
    moe_gemv_w2(c, ga, reinterpret_cast<const bf16_t*>(hb), static_cast<float*>(yg.data()));
    combine(static_cast<const float*>(yg.data()));
    return;
  }
  auto grouped_gemm = [&](const float* xin, const uint16_t* xin_bf16, int64_t ldx, const int32_t* gather,
                          const WView* tab, float* o, int64_t N, int64_t K, const char* what) {
    if (mma) {
      moe_mma_fp4(c, xin_bf16, ldx, gather, tab, map, max_tiles, o, N, N, K);
      return;
    }
    if (few) {
      dim3 grid(unsigned(ceil_div(N, kGemvThreads)), unsigned(max_tiles));
      launch_pdl(c, what, moe_gemv_kernel, dim3(grid), dim3(kGemvThreads), 0, xin, ldx, gather, tab, I, o, N, N, K);
    } else {
      dim3 grid(unsigned(ceil_div(N, kBN)), unsigned(max_tiles));
      launch_pdl(c, what, moe_gemm_kernel, dim3(grid), dim3(kGemmThreads), 0, xin, ldx, gather, tab, I, o, N, N, K);
    }
  };
  grouped_gemm(x, xb, D, I.sorted_tok, t1, g, Idim, D, "moe grouped gemm (w1)");
  grouped_gemm(x, xb, D, I.sorted_tok, t3, u, Idim, D, "moe grouped gemm (w3)");
  launch_pdl(c, "moe_swiglu_kernel", moe_swiglu_kernel, dim3(stride_grid(Tk * Idim)), dim3(256), 0, g, u, a.route_w.ptr<float>(), I.sorted_pair,
                                                                   I.offsets, E, a.swiglu_limit, a.round_bf16, g,
                                                                   Idim);
  if (quant) {
    int64_t warps = Tk * ceil_div(Idim, a.act_block);
    launch_pdl(c, "moe_fp8_qdq_rows_kernel", moe_fp8_qdq_rows_kernel, dim3(grid_for(warps * 32, 256)), dim3(256), 0, g, hb, I.offsets, E, Idim,
                                                                                       a.act_block);
  }
  Buffer yb = c.scratch(size_t(Tk * D) * 4);
  float* y = static_cast<float*>(yb.data());
  grouped_gemm(g, hb, Idim, nullptr, t2, y, D, Idim, "moe grouped gemm (w2)");
  combine(y);
}

}  // namespace dil::cuda
