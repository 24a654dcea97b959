// Sparse attention with a sink on Hopper's warpgroup MMA (the plan's wgmma_bf16, fast numerics):
// flash_bf16's structure and arithmetic (attention_flash.cu) with wgmma instead of mma.sync.
// DeepSeek's FlashMLA SM90 sparse prefill was read for the structure; nothing is copied from it.
//
// Arithmetic (bound in tests/cuda/test_attention_fast.cpp, the same derivation as flash_bf16):
// BF16 q and rows are the wgmma operands as they are (exact products, f32 accumulation, one
// instruction per 16 products of a dot product), scores scaled into the log2 domain by one f32
// multiply, f32 online softmax with exp2f over tiles of 64 rows, probabilities rounded to BF16
// for P.V, row sums of the f32 probabilities, the sink in the final denominator, bf16 output
// rounded once; decode-sized steps split a token's tiles over CTAs and flash's combine merges.
//
// Structure. One CTA per (token, 64 heads), two warpgroups (256 threads). Shared memory holds q
// (64 heads x 512 dims), two 64-row KV tiles and P (64 heads x 64 rows), all BF16 in 128-byte
// swizzled column blocks of 64 dims ([8 blocks][64 lines][128 B]): the layout wgmma reads both
// as a K-major operand (q, the rows as keys, P) and as an MN-major one (the rows as values), so
// one staged tile serves q.k^T and P.V. Per tile, warpgroup w:
//   S_w = q k^T for tile rows 32w..32w+31 (m64n32k16, 32 k-steps over the 512 dims);
//   the two warpgroups swap their per-head maxima through shared memory, so both rescale with
//   the same running max (their row sums then add at the end);
//   P_w (BF16) into its half of P's columns; after a barrier both halves are there;
//   O_w += P V for dims 256w..256w+255 (m64n256k16, 4 k-steps, 128 f32 accumulators a thread).
// Rows are gathered by index one tile ahead: BF16 rows (this step's kv_new, plain caches, and
// zeros for absent rows) by cp.async straight into the swizzled tile. Packed rows (the official
// FP8 / FP4 formats of fast numerics' cache): in prefill-sized steps pool_packed_rows has
// dequantized every row the step can read once into BF16 pools, which the kernel then reads as
// plain rows (measured: in-register dequantization left the model's attention slower than
// flash_bf16's, 8.8 against 8.2 ms; with the pools 4.4); in decode-sized steps they are loaded,
// dequantized exactly to BF16 in registers and stored while the tile's q.k^T runs.
#include "kernels/cuda/attention_flash.cuh"
#include "kernels/cuda/hopper.cuh"
#include "kernels/cuda/mma.cuh"

namespace dil::cuda {
namespace {
using namespace sm90;

constexpr int kD = kFlashD, kHeads = kFlashHeads, kRows = kFlashRows, kThreads = 256;
constexpr int kTpr = kThreads / kRows;                     // 4 threads stage one row
constexpr int kSegs = kD / 8;                              // 16-byte segments of a bf16 row
constexpr uint32_t kBlk = 64 * 128;                        // one column block: 64 lines x 128 B
constexpr uint32_t kTile = (kD / 64) * kBlk;               // 64 lines x 512 dims bf16: 64 KB
constexpr uint32_t oQ = 0, oT = kTile, oP = 3 * kTile;     // q, tiles [2], P (one block)
constexpr uint32_t oMx = oP + kBlk, oL = oMx + 2 * 64 * 4, oV = oL + 2 * 64 * 4;  // [2][64] f32, f32, int
constexpr int kSmem = int(oV + 2 * kRows * 4) + 1024;     // + the base's 1024-byte alignment
static_assert(kSmem <= 232448 && kHeads == 64 && kRows == 64, "shared memory layout");
constexpr float kLog2e = kFlashLog2e;

// Byte offset of 16-byte segment `seg` (dims 8 seg .. 8 seg + 7) of line r (a row or a head).
__device__ __forceinline__ uint32_t seg_off(int r, int seg) {
  return uint32_t(seg >> 3) * kBlk + sw128_offset(r, seg & 7);
}

// Candidates [c0, c0 + 64) of token t into `tile`: this thread's row r = tid / 4 takes segments
// part, part + 4, ... BF16 rows and absent ones (zeros: their scores are masked, 0 * 0 keeps P.V
// finite) go by cp.async; a packed row is returned for convert_row (p null otherwise).
__device__ __forceinline__ KvRef issue_rows(const AttnParams<bf16_t>& P, int t, int s, int p, int n_win, int n_cand,
                                            int c0, uint8_t* tile, int* valid) {
  const int r = threadIdx.x / kTpr, part = threadIdx.x % kTpr, c = c0 + r;
  const KvRef row = c < n_cand ? attn_row(P, t, s, p, n_win, c) : KvRef{nullptr, 0};
  if (part == 0) valid[r] = row.p != nullptr;
  if (row.p && row.kind) return row;
  const bf16_t* src = static_cast<const bf16_t*>(row.p);
#pragma unroll
  for (int i = 0; i < kSegs / kTpr; ++i) {
    const int seg = part + kTpr * i;
    cp_async16(tile + seg_off(r, seg), src ? static_cast<const void*>(src + seg * 8) : P.q, src ? 16 : 0);
  }
  return KvRef{nullptr, 0};
}

// This thread's segments of a packed row as BF16 into `tile` (exact: kv_unpack8_bf16), in two
// rounds of 8 independent loads.
__device__ __forceinline__ void convert_row(const AttnParams<bf16_t>& P, KvRef row, uint8_t* tile) {
  if (!row.p) return;
  const int r = threadIdx.x / kTpr, part = threadIdx.x % kTpr;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint4 v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = attn_row8_packed(P, row, part + kTpr * (8 * h + i));
#pragma unroll
    for (int i = 0; i < 8; ++i) *reinterpret_cast<uint4*>(tile + seg_off(r, part + kTpr * (8 * h + i))) = v[i];
  }
}

__global__ void __launch_bounds__(kThreads, 1) attn_wgmma_kernel(const __grid_constant__ AttnParams<bf16_t> P,
                                                                const FlashOut F) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* sm = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  uint8_t* qs = sm + oQ;                                // [8 blocks][64 heads][128 B] bf16
  uint8_t* tiles = sm + oT;                             // [2][8 blocks][64 rows][128 B] bf16
  uint8_t* ps = sm + oP;                                // [64 heads][128 B]: P, 64 rows bf16
  float* mx = reinterpret_cast<float*>(sm + oMx);       // [2 warpgroups][64 heads] tile maxima
  float* ls = reinterpret_cast<float*>(sm + oL);        // [2][64] row sums (the end)
  int* valid = reinterpret_cast<int*>(sm + oV);         // [2 tiles][64 rows]

  const int t = blockIdx.x, h0 = blockIdx.y * kHeads, z = blockIdx.z;
  const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31, g = lane >> 2, tg = lane & 3;
  const int hA = 16 * ((tid >> 5) & 3) + g, hB = hA + 8;  // this thread's accumulator lines (CTA heads)
  const int s = P.tok_seq[t], p = P.tok_pos[t];
  int pw;  // the window's last position
  const int n_win = attn_window(P, s, p, &pw);
  const int n_comp = P.ratio > 0 ? (P.comp_idx ? P.K : (p + 1) / P.ratio) : 0;
  const int n_cand = n_win + n_comp;
  const int n_tiles = (n_cand + kRows - 1) / kRows;
  const int per = (n_tiles + F.n_split - 1) / F.n_split;  // this CTA's tiles: split z of n_split
  const int tile0 = min(n_tiles, z * per), tile1 = min(n_tiles, tile0 + per);

  {  // q of the 64 heads, with the first tile in one cp.async group
    const bf16_t* qrow = P.q + (int64_t(t) * P.H + h0) * kD;
    for (int i = tid; i < kHeads * kSegs; i += kThreads)
      cp_async16(qs + seg_off(i / kSegs, i % kSegs), qrow + int64_t(i / kSegs) * kD + (i % kSegs) * 8, 16);
  }
  KvRef pk = tile0 < tile1 ? issue_rows(P, t, s, pw, n_win, n_cand, tile0 * kRows, tiles, valid) : KvRef{nullptr, 0};
  cp_async_commit();
  convert_row(P, pk, tiles);

  float o[128];  // O[heads hA | hB][dims 256 wg + 8j + 2tg, +1]: o[4j + 0, 1] head hA, o[4j + 2, 3] head hB
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float mA = -INFINITY, mB = -INFINITY, lA = 0.f, lB = 0.f;  // running max (log2 domain), my rows' sums
  const float sl2 = P.scale * kLog2e;
  const uint32_t q_at = smem_u32(qs), p_at = smem_u32(ps);

  for (int ti = tile0; ti < tile1; ++ti) {
    const int buf = (ti - tile0) & 1;
    uint8_t* tile = tiles + buf * kTile;
    const int* vld = valid + buf * kRows;
    cp_async_wait<0>();   // this thread's copies of tile ti (and q)
    fence_proxy_async();  // its converted rows, for wgmma
    __syncthreads();      // tile ti complete; everyone is done with buffer buf ^ 1, P and the maxima
    pk = ti + 1 < tile1 ? issue_rows(P, t, s, pw, n_win, n_cand, (ti + 1) * kRows, tiles + (buf ^ 1) * kTile,
                                     valid + (buf ^ 1) * kRows)
                        : KvRef{nullptr, 0};
    cp_async_commit();

    // S for tile rows 32 wg + 8j + 2tg (+1), j < 4: sc[4j + 0, 1] head hA, sc[4j + 2, 3] head hB.
    float sc[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) sc[i] = 0.f;
    const uint32_t k_at = smem_u32(tile) + uint32_t(wg) * 32 * 128;
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks) {
      const uint32_t off = uint32_t(ks >> 2) * kBlk + uint32_t(ks & 3) * 32;
      wgmma_m64n32k16_bf16(sc, desc_k128b(q_at + off), desc_k128b(k_at + off), ks);
    }
    wgmma_commit();
    convert_row(P, pk, tiles + (buf ^ 1) * kTile);  // the next tile's packed rows while the MMAs run
    wgmma_wait<0>();
    fence_regs(sc);

    float cA = -INFINITY, cB = -INFINITY;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r0 = 32 * wg + 8 * j + 2 * tg;
      const bool v0 = vld[r0] != 0, v1 = vld[r0 + 1] != 0;
      sc[4 * j + 0] = v0 ? sc[4 * j + 0] * sl2 : -INFINITY;
      sc[4 * j + 1] = v1 ? sc[4 * j + 1] * sl2 : -INFINITY;
      sc[4 * j + 2] = v0 ? sc[4 * j + 2] * sl2 : -INFINITY;
      sc[4 * j + 3] = v1 ? sc[4 * j + 3] * sl2 : -INFINITY;
      cA = fmaxf(cA, fmaxf(sc[4 * j], sc[4 * j + 1]));
      cB = fmaxf(cB, fmaxf(sc[4 * j + 2], sc[4 * j + 3]));
    }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      cA = fmaxf(cA, __shfl_xor_sync(0xffffffffu, cA, off));
      cB = fmaxf(cB, __shfl_xor_sync(0xffffffffu, cB, off));
    }
    if (tg == 0) {
      mx[wg * 64 + hA] = cA;
      mx[wg * 64 + hB] = cB;
    }
    __syncthreads();  // both warpgroups' maxima
    cA = fmaxf(cA, mx[(wg ^ 1) * 64 + hA]);
    cB = fmaxf(cB, mx[(wg ^ 1) * 64 + hB]);
    const float nA = fmaxf(mA, cA), nB = fmaxf(mB, cB);
    // nX = -inf: nothing visible yet for this head (every p is 0 and nothing rescales).
    const float corrA = nA == -INFINITY ? 1.f : exp2f(mA - nA), corrB = nB == -INFINITY ? 1.f : exp2f(mB - nB);
    float sA = 0.f, sB = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      sc[4 * j + 0] = sc[4 * j + 0] == -INFINITY ? 0.f : exp2f(sc[4 * j + 0] - nA);
      sc[4 * j + 1] = sc[4 * j + 1] == -INFINITY ? 0.f : exp2f(sc[4 * j + 1] - nA);
      sc[4 * j + 2] = sc[4 * j + 2] == -INFINITY ? 0.f : exp2f(sc[4 * j + 2] - nB);
      sc[4 * j + 3] = sc[4 * j + 3] == -INFINITY ? 0.f : exp2f(sc[4 * j + 3] - nB);
      sA += sc[4 * j] + sc[4 * j + 1];
      sB += sc[4 * j + 2] + sc[4 * j + 3];
      // P[head][tile row]: 16-byte chunk 4 wg + j of the head's line, element 2tg.
      *reinterpret_cast<uint32_t*>(ps + sw128_offset(hA, 4 * wg + j) + 4 * tg) = pack_bf16x2(sc[4 * j], sc[4 * j + 1]);
      *reinterpret_cast<uint32_t*>(ps + sw128_offset(hB, 4 * wg + j) + 4 * tg) = pack_bf16x2(sc[4 * j + 2], sc[4 * j + 3]);
    }
    fence_proxy_async();  // P is read by wgmma
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      sA += __shfl_xor_sync(0xffffffffu, sA, off);
      sB += __shfl_xor_sync(0xffffffffu, sB, off);
    }
    lA = lA * corrA + sA;
    lB = lB * corrB + sB;
    mA = nA;
    mB = nB;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      o[4 * j + 0] *= corrA;
      o[4 * j + 1] *= corrA;
      o[4 * j + 2] *= corrB;
      o[4 * j + 3] *= corrB;
    }
    __syncthreads();  // both halves of P

    // O_w += P V: k-step kk = tile rows 16kk..16kk+15 (32 bytes into P's lines, 2 swizzle atoms
    // of the tile), N = dims 256 wg.. (column blocks 4 wg .. 4 wg + 3, kBlk apart).
    const uint32_t v_at = smem_u32(tile) + uint32_t(wg) * 4 * kBlk;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kRows / 16; ++kk)
      wgmma_m64n256k16_bf16_bmn(o, desc_k128b(p_at + uint32_t(kk) * 32), desc_mn128b(v_at + uint32_t(kk) * 2048, kBlk));
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(o);
  }
  cp_async_wait<0>();  // no copy may still target shared memory when the CTA exits

  if (tg == 0) {
    ls[wg * 64 + hA] = lA;
    ls[wg * 64 + hB] = lB;
  }
  __syncthreads();
  lA += ls[(wg ^ 1) * 64 + hA];
  lB += ls[(wg ^ 1) * 64 + hB];
  const int gA = h0 + hA, gB = h0 + hB, dim0 = 256 * wg + 2 * tg;
  if (F.n_split > 1) {  // partial results; the combine kernel adds the sink
    const int64_t rowA = (int64_t(z) * gridDim.x + t) * P.H + gA, rowB = (int64_t(z) * gridDim.x + t) * P.H + gB;
    float* oA = F.o_part + rowA * kD + dim0;
    float* oB = F.o_part + rowB * kD + dim0;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      *reinterpret_cast<float2*>(oA + 8 * j) = make_float2(o[4 * j], o[4 * j + 1]);
      *reinterpret_cast<float2*>(oB + 8 * j) = make_float2(o[4 * j + 2], o[4 * j + 3]);
    }
    if (wg == 0 && tg == 0) {
      *reinterpret_cast<float2*>(F.ml_part + rowA * 2) = make_float2(mA, lA);
      *reinterpret_cast<float2*>(F.ml_part + rowB * 2) = make_float2(mB, lB);
    }
    return;
  }
  // The sink joins the denominator: out = O 2^(m-mf) / (l 2^(m-mf) + 2^(sink log2 e - mf)).
  const float sinkA = P.sink[gA] * kLog2e, sinkB = P.sink[gB] * kLog2e;
  const float mfA = fmaxf(mA, sinkA), mfB = fmaxf(mB, sinkB);
  const float aA = lA > 0.f ? exp2f(mA - mfA) : 0.f, aB = lB > 0.f ? exp2f(mB - mfB) : 0.f;
  const float fA = aA / (lA * aA + exp2f(sinkA - mfA)), fB = aB / (lB * aB + exp2f(sinkB - mfB));
  bf16_t* outA = F.out + (int64_t(t) * P.H + gA) * kD + dim0;
  bf16_t* outB = F.out + (int64_t(t) * P.H + gB) * kD + dim0;
#pragma unroll
  for (int j = 0; j < 32; ++j) {  // two bf16 (even element offset: 4-byte aligned), each rounded once
    *reinterpret_cast<uint32_t*>(outA + 8 * j) = pack_bf16x2(o[4 * j] * fA, o[4 * j + 1] * fA);
    *reinterpret_cast<uint32_t*>(outB + 8 * j) = pack_bf16x2(o[4 * j + 2] * fB, o[4 * j + 3] * fB);
  }
#endif
}

// The packed rows a step can read, dequantized to BF16 (kv_unpack8_bf16: exact), one warp per
// row: ring rows of every sequence's slot into ring_pool[s][i] (slot2[s] = s), compressed rows
// of every (sequence, logical block) of the block table into comp_pool[s][lb * rpb + r] up to
// the rows the sequence's last token sees (bt2[s][lb] = s * max_blocks + lb, or -1 without a
// block). Rows past what any token reads are left as they are: attn_row never reads them.
__global__ void __launch_bounds__(256) attn_pool_kernel(const __grid_constant__ AttnParams<bf16_t> P,
                                                        bf16_t* ring_pool, int32_t* slot2, int64_t ring_rows,
                                                        bf16_t* comp_pool, int32_t* bt2, int64_t comp_rows) {
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const uint8_t* src = nullptr;
  bf16_t* dst = nullptr;
  KvRow f;
  if (w < ring_rows) {
    const int sq = int(w / P.ring_len), i = int(w % P.ring_len);
    if (i == 0 && lane == 0) slot2[sq] = sq;
    src = P.ring + (int64_t(P.slot[sq]) * P.ring_len + i) * P.ring_rb;
    dst = ring_pool + w * kD;
    f = P.ring_fmt;
  } else if (w - ring_rows < comp_rows) {
    const int64_t per_seq = int64_t(P.max_blocks) * P.rpb, cw = w - ring_rows;
    const int sq = int(cw / per_seq), rr = int(cw % per_seq), lb = rr / P.rpb;
    const int b = P.block_table[sq * P.max_blocks + lb];
    if (rr % P.rpb == 0 && lane == 0) bt2[sq * P.max_blocks + lb] = b < 0 ? -1 : sq * P.max_blocks + lb;
    if (b < 0 || rr >= (P.start_pos[sq] + P.len[sq]) / P.ratio) return;
    src = P.comp + (int64_t(b) * P.rpb + rr % P.rpb) * P.comp_rb;
    dst = comp_pool + cw * kD;
    f = P.comp_fmt;
  } else {
    return;
  }
  for (int seg = lane; seg < kSegs; seg += 32) *reinterpret_cast<uint4*>(dst + seg * 8) = kv_unpack8_bf16(f, src, seg);
}

}  // namespace

AttnParams<bf16_t> pool_packed_rows(Ctx& c, const AttnParams<bf16_t>& P, const StepMeta& m, int T_tokens,
                                    std::vector<Buffer>& keep) {
  const bool ring_p = P.ring && P.ring_fmt.d, comp_p = P.comp && P.comp_fmt.d && P.ratio > 0;
  if (!ring_p && !comp_p) return P;
  const int64_t n_seqs = m.n_seqs;
  const int64_t ring_rows = ring_p ? n_seqs * P.ring_len : 0;
  const int64_t comp_rows = comp_p ? n_seqs * int64_t(P.max_blocks) * P.rpb : 0;
  // Rows the step reads (each token's window and compressed candidates), from the host copies.
  int64_t reads = 0;
  for (int t = 0; t < T_tokens && t < int(m.h_tok_pos.size()); ++t)
    reads += flash_token_rows(m, t, P.W, P.non_causal != 0, P.ratio, P.K);
  const int64_t pool_bytes = (ring_rows + comp_rows) * kD * 2;
  if (reads < 2 * (ring_rows + comp_rows) || pool_bytes > (int64_t(256) << 20)) return P;
  AttnParams<bf16_t> Q = P;
  bf16_t *ring_pool = nullptr, *comp_pool = nullptr;
  int32_t *slot2 = nullptr, *bt2 = nullptr;
  if (ring_p) {
    keep.push_back(c.scratch(size_t(ring_rows) * kD * 2));
    ring_pool = static_cast<bf16_t*>(keep.back().data());
    keep.push_back(c.scratch(size_t(n_seqs) * 4));
    slot2 = static_cast<int32_t*>(keep.back().data());
    Q.ring = reinterpret_cast<const uint8_t*>(ring_pool);
    Q.ring_rb = kD * 2;
    Q.ring_fmt = KvRow{};  // d == 0: plain rows
    Q.slot = slot2;
  }
  if (comp_p) {
    keep.push_back(c.scratch(size_t(comp_rows) * kD * 2));
    comp_pool = static_cast<bf16_t*>(keep.back().data());
    keep.push_back(c.scratch(size_t(n_seqs) * P.max_blocks * 4));
    bt2 = static_cast<int32_t*>(keep.back().data());
    Q.comp = reinterpret_cast<const uint8_t*>(comp_pool);
    Q.comp_rb = kD * 2;
    Q.comp_fmt = KvRow{};
    Q.block_table = bt2;
  }
  const int64_t warps = ring_rows + comp_rows;
  if (warps == 0) return P;
  attn_pool_kernel<<<unsigned((warps + 7) / 8), 256, 0, c.stream>>>(P, ring_pool, slot2, ring_rows, comp_pool, bt2,
                                                                   comp_rows);
  DIL_LAUNCH_CHECK("attn_pool_kernel");
  return Q;
}

void launch_attn_wgmma(Ctx& c, const AttnParams<bf16_t>& P, const FlashOut& F, dim3 grid) {
  DIL_CUDA(cudaFuncSetAttribute(attn_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  attn_wgmma_kernel<<<grid, kThreads, kSmem, c.stream>>>(P, F);
  DIL_LAUNCH_CHECK("attn_wgmma_kernel");
}

}  // namespace dil::cuda
