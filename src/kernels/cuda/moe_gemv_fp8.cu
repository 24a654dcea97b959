// moe_experts' `gemv_fp8` (moe_gemv_fp8.cuh): routed experts at decode sizes on FP8 tensor
// cores, every active expert's FP4 weights streamed once per step.
//
// A CTA serves one tile (<= kGfRows sorted rows of one expert) and 64 (w13) or 128 (w2) weight
// rows; each of its 8 warps owns 16 weight rows, the A operand of m16n8k32 MMAs whose n is the
// tile's rows (a padding row's column of the result is never stored). w13: A rows 0-7 are w1
// rows n0..n0+7 and rows 8-15 the w3 rows of the same columns, so one thread ends with g and u
// of the same (column, row) pairs and the SwiGLU epilogue needs no exchange. w2: 16 consecutive
// rows of w2.
//
// Weights: a 16-byte load per lane per row and 128 K (lane t of a quad reads 32-K block t of the
// step, the quad 64 contiguous bytes of a row). The MMA fragment wants lane t to hold k
// 4t..4t+3 and 16+4t.. of one block, and every lane of the quad the same block (one E8M0 scale
// per row and MMA): a 4x4 transpose of words across the quad (4 shuffles) turns the quad's four
// blocks into four MMAs, lane t supplying word t (values 8t..8t+7) of each. A word of 8 e2m1
// nibbles becomes two e4m3 words (d_e2m1x8_e4m3: even values, odd values), then f16 pairs.
//
// sm_90 has no FP8 mma.sync datapath: ptxas runs an m16n8k32 e4m3 MMA as two m16n8k16 f16 MMAs
// after converting all six operand registers (e4m3 -> f16 is exact) and adds the C operand with
// an FADD. This kernel issues those two f16 MMAs itself: the A side is converted per MMA as
// before, but the activations are staged in shared memory already as f16 (K in balanced chunks
// of <= 4,096, each zero-padded to whole 128-K steps so the MMA loop has no per-block bounds),
// so per MMA 4 conversions and 4 FADDs are gone (the first MMA starts from zero, the second
// chains on it). A block's first MMA takes the even values (k 2t, 2t+1 <- values 8t, 8t+2; k
// 8+2t.. <- 8t+4, 8t+6), the second the odd ones; B piece (block j, token g, lane t) holds the
// codes 8t + {0, 2, 4, 6, 1, 3, 5, 7} in that order, so the MMAs' logical k is a permutation
// of the block's physical k and the sum is the same.
//
// Numerics: the same operations as the m16n8k32 e4m3 MMA (the two k16 halves, the first from
// zero): the block's 32 exact products (e4m3 x e2m1 2^-6) summed by the tensor core; promoted
// by one fmaf with (weight scale x activation scale x 2^6), an exact product of powers of two
// (>= 2^-143). tests/cuda/fp8_mma_bound.h derives the bound.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/hopper.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/moe_gemv_fp8.cuh"

namespace dil::cuda {
namespace {

constexpr int kGfWarps = 8, kGfThreads = 32 * kGfWarps;
constexpr int kGfUnroll = 4;  // 128-K steps whose loads are in flight at once (2 x 16 B per step)
constexpr int kGfChunk = 128;  // most 32-K blocks of activations staged at a time (K 4096)

// Blocks of one staged chunk: K's blocks in the fewest chunks of <= kGfChunk, balanced, each
// padded to whole 128-K steps.
__host__ __device__ constexpr int gf_chunk_blocks(int64_t K) {
  const int64_t nblk = K / 32, nch = (nblk + kGfChunk - 1) / kGfChunk;
  return int(((nblk + nch - 1) / nch + 3) / 4 * 4);
}

// Lanes t and t ^ M (of one quad) swap two words: a lane with bit M of t set gives and takes
// words I0, I1, the other lane words J0, J1.
template <int M, int I0, int I1, int J0, int J1>
__device__ __forceinline__ void quad_swap(uint32_t (&w)[4], int t) {
  const bool set = t & M;
  const uint32_t r0 = __shfl_xor_sync(0xffffffffu, set ? w[I0] : w[J0], M);
  const uint32_t r1 = __shfl_xor_sync(0xffffffffu, set ? w[I1] : w[J1], M);
  if (set) {
    w[I0] = r0;
    w[I1] = r1;
  } else {
    w[J0] = r0;
    w[J1] = r1;
  }
}

// Lane t of each quad: w[j] <- lane j's w[t] (a 4x4 word transpose in two exchange rounds: the
// 2x2 blocks between lanes t and t ^ 2, then single words between lanes t and t ^ 1).
__device__ __forceinline__ void quad_transpose(uint32_t (&w)[4], int t) {
  quad_swap<2, 0, 1, 2, 3>(w, t);
  quad_swap<1, 0, 2, 1, 3>(w, t);
}

// kW13: h (see the header); else y. aq / as: the activation codes [rows, K] and scales [rows,
// ceil(K / act)] (w13: token rows, gathered; w2: sorted rows). grid (weight-row blocks, max_tiles).
template <bool kW13>
__global__ void __launch_bounds__(kGfThreads, 3) moe_gf_kernel(GfMoeArgs a, const uint8_t* aq, const float* as,
                                                               float* out) {
  pdl_enter();
  extern __shared__ __align__(16) uint8_t gf_smem[];
  const int tile = blockIdx.y;
  if (tile >= *a.map.n_tiles) return;
  const int e = a.map.tile_e[tile];
  const int64_t r0 = a.map.tile_r0[tile];
  const int nr = int(min(int64_t(kGfRows), int64_t(a.map.offsets[e + 1]) - r0));
  const int64_t K = kW13 ? a.D : a.I;
  const int nblk = int(K / 32), nab = int((K + a.act - 1) / a.act);
  const int cap = gf_chunk_blocks(K);
  uint4* bs = reinterpret_cast<uint4*>(gf_smem);                               // [cap][kGfRows][4] B pieces
  float* ss = reinterpret_cast<float*>(gf_smem + size_t(cap) * kGfRows * 64);  // [cap][kGfRows] act scale x 2^6

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  int64_t ra, rb;  // weight rows of A rows g and g + 8
  bool active;     // warp-uniform: the warp has weight rows (it still joins the chunk barriers)
  if constexpr (kW13) {
    const int64_t n0 = (int64_t(blockIdx.x) * kGfWarps + warp) * 8;
    active = n0 < a.I;
    ra = rb = n0 + g;
  } else {
    const int64_t n0 = (int64_t(blockIdx.x) * kGfWarps + warp) * 16;
    active = n0 < a.D;
    ra = n0 + g;
    rb = n0 + 8 + g;
  }
  const WView wa = kW13 ? a.w1[e] : a.w2[e];
  const WView wb = kW13 ? a.w3[e] : a.w2[e];
  const uint4* pa = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(wa.w) + ra * (K / 2));
  const uint4* pb = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(wb.w) + rb * (K / 2));
  const uint8_t* sa = wa.scale + ra * wa.scale_cols;
  const uint8_t* sb = wb.scale + rb * wb.scale_cols;

  float acc[4] = {0.f, 0.f, 0.f, 0.f};  // (row g, tile rows 2t, 2t+1), (row g + 8, same)
  for (int cb0 = 0; cb0 < nblk; cb0 += cap) {
    // The chunk's activations, blocks cb0.. padded with zeros to whole 128-K steps (so the MMA
    // loop needs no per-block bounds: a zero block adds fmaf(0, finite, acc) = acc). Piece (j, n, t):
    // row n's codes 32j + 8t + {0, 2, 4, 6} then + {1, 3, 5, 7} as f16 (the order the A side's
    // e4m3 words take: even values, odd values). Only rows n < nr: a padding row's B column (and
    // scale) only reaches its own C column, which is never stored, so it may hold anything.
    const int ncb = min(cap, nblk - cb0), ncb_pad = (ncb + 3) / 4 * 4, nst = ncb_pad / 4;
    if (cb0 > 0) __syncthreads();  // every warp is done with the previous chunk
    const int per_row = ncb_pad * 4;
#pragma unroll 4
    for (int i = threadIdx.x; i < nr * per_row; i += kGfThreads) {
      const int n = i / per_row, p = i - n * per_row, jl = p >> 2, tq = p & 3, j = cb0 + jl;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (jl < ncb) {
        const int64_t row = kW13 ? int64_t(a.sorted_tok[r0 + n]) : r0 + n;
        const uint2 c = __ldg(reinterpret_cast<const uint2*>(aq + row * K + j * 32 + tq * 8));
        const uint32_t ev = sm90::prmt(c.x, c.y, 0x6420u), od = sm90::prmt(c.x, c.y, 0x7531u);
        e4m3x4_f16x2(ev, v.x, v.y);
        e4m3x4_f16x2(od, v.z, v.w);
      }
      bs[(jl * kGfRows + n) * 4 + tq] = v;
    }
    for (int i = threadIdx.x; i < nr * ncb_pad; i += kGfThreads) {
      const int n = i / ncb_pad, jl = i - n * ncb_pad, j = cb0 + jl;
      float v = 0.f;
      if (jl < ncb) {
        const int64_t row = kW13 ? int64_t(a.sorted_tok[r0 + n]) : r0 + n;
        v = as[row * nab + (j * 32) / a.act] * 64.f;  // e2m1 = its e4m3 byte's value x 2^6
      }
      ss[jl * kGfRows + n] = v;
    }
    __syncthreads();
    if (!active) continue;

    for (int s0 = 0; s0 < nst; s0 += kGfUnroll) {
      // The next iteration's weight lines into L2 (lane t: row g (t even) or g + 8, the first or
      // second 128 bytes of the iteration's 256): this iteration's loads below are issued only
      // after the previous iteration's MMAs (the registers hold kGfUnroll steps), so without the
      // hint each iteration starts with a full HBM latency (measured: V4 decode 1.68 -> 1.54 ms).
      {
        const int b = cb0 + (s0 + kGfUnroll) * 4 + (t >> 1) * 8;
        if (s0 + kGfUnroll < nst && b + 8 <= nblk) sm90::prefetch_l2(((t & 1) ? pb : pa) + b);
      }
      uint4 qa[kGfUnroll], qb[kGfUnroll];
      uint32_t sc[kGfUnroll];  // E8M0 bytes of this lane's block: row g (bits 0-7), row g + 8 (8-15)
#pragma unroll
      for (int u = 0; u < kGfUnroll; ++u) {
        const int b = cb0 + (s0 + u) * 4 + t;
        const bool ok = s0 + u < nst && b < nblk;
        qa[u] = ok ? __ldg(pa + b) : make_uint4(0u, 0u, 0u, 0u);
        qb[u] = ok ? __ldg(pb + b) : make_uint4(0u, 0u, 0u, 0u);
        sc[u] = ok ? uint32_t(__ldg(sa + b)) | (uint32_t(__ldg(sb + b)) << 8) : 0u;
      }
#pragma unroll
      for (int u = 0; u < kGfUnroll; ++u) {
        if (s0 + u >= nst) break;  // warp-uniform
        uint32_t xa[4] = {qa[u].x, qa[u].y, qa[u].z, qa[u].w};
        uint32_t xb[4] = {qb[u].x, qb[u].y, qb[u].z, qb[u].w};
        quad_transpose(xa, t);
        quad_transpose(xb, t);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int jl = (s0 + u) * 4 + j;  // the block, in the chunk
          const uint32_t sj = __shfl_sync(0xffffffffu, sc[u], (lane & ~3) | j);
          const float fa = d_e8m0_fast(sj & 0xffu), fb = d_e8m0_fast(sj >> 8);
          uint32_t ea, oa, eb, ob;  // rows g / g + 8: even and odd values, e4m3
          d_e2m1x8_e4m3(xa[j], ea, oa);
          d_e2m1x8_e4m3(xb[j], eb, ob);
          const uint4 B = bs[(jl * kGfRows + g) * 4 + t];
          const float2 xs = *reinterpret_cast<const float2*>(ss + jl * kGfRows + 2 * t);
          // The block's 32 products as two k16 f16 MMAs (what mma.sync e4m3 is on sm_90): the
          // even values first (k 2t, 2t+1 <- values 0, 2; k 8+2t.. <- 4, 6), then the odd ones.
          uint32_t A0[4], A1[4];  // fragments: a0 / a2 row g (k 2t.., 8+2t..), a1 / a3 row g + 8
          e4m3x4_f16x2(ea, A0[0], A0[2]);
          e4m3x4_f16x2(eb, A0[1], A0[3]);
          e4m3x4_f16x2(oa, A1[0], A1[2]);
          e4m3x4_f16x2(ob, A1[1], A1[3]);
          float d[4];
          mma_f16_zero(d, A0, B.x, B.y);
          mma_f16(d, A1, B.z, B.w);
          acc[0] = fmaf(d[0], fa * xs.x, acc[0]);
          acc[1] = fmaf(d[1], fa * xs.y, acc[1]);
          acc[2] = fmaf(d[2], fb * xs.x, acc[2]);
          acc[3] = fmaf(d[3], fb * xs.y, acc[3]);
        }
      }
    }
  }
  if (!active) return;

#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const int r = 2 * t + q;  // tile row
    if (r >= nr) continue;
    const int64_t row = r0 + r;
    if constexpr (kW13) {
      // As moe_swiglu_kernel (moe.cu), f32 steps in the reference's order.
      float gg = acc[q], uu = acc[2 + q];
      if (a.round_bf16) {
        gg = d_round_bf16(gg);
        uu = d_round_bf16(uu);
      }
      const float gv = fminf(gg, a.limit);
      const float uv = fminf(fmaxf(uu, -a.limit), a.limit);
      const float hv = d_silu(gv) * uv * a.route_w[a.sorted_pair[row]];
      out[row * a.I + ra] = a.round_bf16 ? d_round_bf16(hv) : hv;
    } else {
      out[row * a.D + ra] = acc[q];
      out[row * a.D + rb] = acc[2 + q];
    }
  }
}

template <class TI>
__global__ void moe_gf_quant_kernel(const TI* x, int64_t rows_max, const int32_t* n_rows, int64_t K, int act,
                                    uint8_t* q, float* s) {
  pdl_enter();
  const int nab = int((K + act - 1) / act);
  const int64_t gw = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const int64_t rows = n_rows ? int64_t(*n_rows) : rows_max;
  if (gw >= rows * nab) return;  // warp-uniform
  const int64_t r = gw / nab;
  const int64_t b0 = (gw % nab) * act, b1 = min(K, b0 + act);
  const TI* xr = x + r * K;
  float amax = 0.f;
  for (int64_t c = b0 + lane; c < b1; c += 32) amax = fmaxf(amax, fabsf(ld_act(xr[c])));
  const float sc = d_act_scale(warp_max(amax));
  for (int64_t c = b0 + lane; c < b1; c += 32) q[r * K + c] = d_f32_to_e4m3(d_act_round(ld_act(xr[c]), sc));
  if (lane == 0) s[r * nab + gw % nab] = sc;
}

size_t gf_smem_bytes(int64_t K) { return size_t(gf_chunk_blocks(K)) * kGfRows * (64 + 4); }

template <bool kW13>
void launch(Ctx& c, const GfMoeArgs& a, const uint8_t* aq, const float* as, float* out) {
  const int64_t K = kW13 ? a.D : a.I;
  DIL_CHECK(a.D % 32 == 0 && a.I % 32 == 0 && K <= kGfMaxK && a.act > 0,
            "moe_experts gemv_fp8: widths multiples of 32 up to ", kGfMaxK, " (D ", a.D, ", I ", a.I, ")");
  const size_t smem = gf_smem_bytes(K);
  const int64_t rows_per_cta = kGfWarps * (kW13 ? 8 : 16);
  dim3 grid(unsigned(ceil_div(kW13 ? a.I : a.D, rows_per_cta)), unsigned(a.max_tiles));
  if (smem > 48 * 1024)
    DIL_CUDA(cudaFuncSetAttribute(moe_gf_kernel<kW13>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  launch_pdl(c, kW13 ? "moe_gf_kernel<w13>" : "moe_gf_kernel<w2>", moe_gf_kernel<kW13>, grid, dim3(kGfThreads), smem, a,
             aq, as, out);
}

}  // namespace

template <class TI>
void moe_gf_quant(Ctx& c, const TI* x, int64_t rows_max, const int32_t* n_rows, int64_t K, int act, uint8_t* q,
                  float* s) {
  const int64_t warps = rows_max * ((K + act - 1) / act);
  if (warps == 0) return;
  launch_pdl(c, "moe_gf_quant_kernel", moe_gf_quant_kernel<TI>, dim3(grid_for(warps * 32, 256)), dim3(256), 0, x, rows_max, n_rows, K, act, q, s);
}
template void moe_gf_quant<float>(Ctx&, const float*, int64_t, const int32_t*, int64_t, int, uint8_t*, float*);
template void moe_gf_quant<bf16_t>(Ctx&, const bf16_t*, int64_t, const int32_t*, int64_t, int, uint8_t*, float*);

void moe_gf_w13(Ctx& c, const GfMoeArgs& a, const uint8_t* xq, const float* xs, float* h) {
  launch<true>(c, a, xq, xs, h);
}
void moe_gf_w2(Ctx& c, const GfMoeArgs& a, const uint8_t* hq, const float* hs, float* y) {
  launch<false>(c, a, hq, hs, y);
}

}  // namespace dil::cuda
