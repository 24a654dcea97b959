// Sparse attention with a sink for fast numerics at FlashMLA's structure (the plan's flash_bf16;
// DeepSeek's SM90 sparse prefill was read for the structure, nothing is copied from it).
//
// Arithmetic (the same function as mma_bf16, attention_mma.cu; bound in
// tests/cuda/test_attention_fast.cpp): BF16 q and rows are the mma.sync m16n8k16 operands as they
// are (one MMA per product, exact products, f32 accumulation), scores scaled into the log2
// domain by one f32 multiply (scale * log2 e), f32 online softmax with exp2f, the probabilities
// rounded to BF16 for P.V (one MMA), the row sums those of the f32 probabilities, the sink in
// the final denominator, bf16 output rounded once.
//
// Structure. One CTA per (token, 64 heads), 8 warps, so each gathered row is staged once per
// token (MQA: one 512-wide row is key and value of every head). q (64 x 512 BF16) stays in
// shared memory; the token's candidate rows (window rows, then compressed rows by index) come
// in tiles of 64, gathered with cp.async into two buffers: the next tile is in flight while the
// current one is multiplied, and one __syncthreads per tile orders both. Warp w = (head group
// hg = w % 4: heads 16hg..16hg+15, half = w / 4): S = q k^T for its 16 heads and rows
// 32half..32half+31 of the tile (4 n-tiles over 32 k-steps, ldmatrix fragments); the two warps
// of a head group swap their scores through shared memory (a 64-thread named barrier), so both
// hold the 16 x 64 scores, run the same online softmax (identical arithmetic: identical state)
// and turn the score accumulators into P's A fragments in registers; then O += P V for its 256
// output dims (32 n-tiles, 128 f32 accumulators per thread, ldmatrix.trans value fragments).
//
// Decode-sized steps (few tokens) split each token's tiles over n_split CTAs (grid z): each
// writes its unnormalised O, running max and row sum (f32) to a workspace and a combine kernel
// merges them with the sink (the same formula with one more rescale per split).
//
// Row loading is one device function (stage_kv_row); packed rows (the official FP8 / FP4
// formats of fast numerics' cache) land as they are and are dequantized in shared memory
// (convert_packed_row) before the tile's MMAs.
#include "kernels/cuda/attention_flash.cuh"
#include "kernels/cuda/mma.cuh"

namespace dil::cuda {
namespace {

constexpr int kD = kFlashD, kHeads = kFlashHeads, kRows = kFlashRows, kWarps = 8, kThreads = kWarps * 32;
constexpr int kStride = kD + 8;           // bf16 per staged row (1040 B): conflict-free ldmatrix, 16 B aligned
constexpr int kSegs = kD / 8;             // 16-byte segments per row
constexpr int kThreadsPerRow = kThreads / kRows;  // 4 threads stage one row of a tile
constexpr int kDimsPerWarp = kD / 2;      // 256 output dims per warp
constexpr int kNt = kDimsPerWarp / 8;     // 32 n-tiles of O per warp
constexpr float kLog2e = kFlashLog2e;

constexpr size_t kQBytes = size_t(kHeads) * kStride * 2;       // [64][kStride] bf16
constexpr size_t kTileBytes = size_t(kRows) * kStride * 2;     // [64][kStride] bf16
constexpr size_t kXBytes = size_t(kWarps) * 16 * 32 * 4;       // [8 warps][16 values][32 lanes] f32
constexpr size_t kSmem = kQBytes + 2 * kTileBytes + kXBytes + 2 * kRows * 4;

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return unsigned(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  // src-size 0 zero-fills the 16 bytes (src must still be a valid address).
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
__device__ __forceinline__ void pair_barrier(int id) {  // the two warps of one head group
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(64) : "memory");
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// The one function that reads a KV row: segments first, first + kThreadsPerRow, ... (8 values
// each) of a 512-value row into its shared-memory row as BF16; a null row stages zeros (its
// scores are masked, and 0 * 0 keeps P.V finite). BF16 rows (this step's kv_new, or a plain
// cache) are a cp.async copy of 16-byte segments. A packed row (fast numerics' cache, the
// official formats: V4 584 B, V4.1 528 / 288 B) is copied by cp.async as it is, in 8-byte
// chunks (its global rows are 8-byte aligned), to byte packed_base of its shared-memory row,
// and dequantized there in place once it has landed (convert_packed_row). `fallback` is any
// valid global address (zero-fill reads nothing but needs one). Returns the row's kind: 0
// none, 1 bf16, 2 packed in ring_fmt, 3 packed in comp_fmt.
//
// packed_base: where byte 0 of a packed row goes in its 1040-byte slot. V4 rows: at the nope
// width (448), which puts the bf16 rope dims (row bytes 448..575) exactly where their BF16
// values belong (slot bytes 896..1023) and the scales after them (1024..1031): only the e4m3
// dims need converting. V4.1 SWA rows: 512 (scales at 1024..1039). V4.1 main KV: the slot's
// tail, 752 (scales at 1008..1039).
__device__ __forceinline__ int packed_base(const KvRow& f) {
  return f.format == kvpack::Format::V4Row ? f.d - f.rope
         : f.format == kvpack::Format::Fp8B32 ? f.d
                                             : kStride * 2 - kv_row_bytes(f);
}
__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ int stage_kv_row(const AttnParams<bf16_t>& P, uint32_t dst_row, KvRef row, int first,
                                            const void* fallback) {
  if (row.p && row.kind) {
    // By value: a reference chosen between two kernel parameters would make the compiler copy
    // the parameters to local memory and read them from there.
    const KvRow f = row.kind == 1 ? P.ring_fmt : P.comp_fmt;
    const int n8 = kv_row_bytes(f) / 8;
    const uint32_t dst = dst_row + unsigned(packed_base(f));
    const unsigned char* src = static_cast<const unsigned char*>(row.p);
    for (int ch = first; ch < n8; ch += kThreadsPerRow) cp_async8(dst + unsigned(8 * ch), src + 8 * ch);
    return row.kind + 1;
  }
  const bf16_t* r = static_cast<const bf16_t*>(row.p);
#pragma unroll
  for (int i = 0; i < kSegs / kThreadsPerRow; ++i) {
    const int seg = first + kThreadsPerRow * i;
    cp_async16(dst_row + unsigned(seg * 16), r ? static_cast<const void*>(r + seg * 8) : fallback, r != nullptr);
  }
  return r ? 1 : 0;
}

// The tile of candidates [c0, c0 + 64) of token t into `tile`, its row validity into `valid`;
// returns the kind of this thread's row (stage_kv_row).
__device__ __forceinline__ int issue_tile(const AttnParams<bf16_t>& P, int t, int s, int p, int n_win, int n_cand,
                                          int c0, uint16_t* tile, int* valid) {
  const int r = threadIdx.x / kThreadsPerRow, part = threadIdx.x % kThreadsPerRow;
  const int c = c0 + r;
  const KvRef row = c < n_cand ? attn_row(P, t, s, p, n_win, c) : KvRef{nullptr, 0};
  const int kind = stage_kv_row(P, smem_addr(tile + r * kStride), row, part, P.q);
  if (part == 0) valid[r] = row.p != nullptr;
  return kind;
}

// Dequantizes this thread's row of a landed tile in place when it is packed (kind 2 / 3). The
// row's 4 threads take 8-dim segments 4w + part; in two phases of 8 segments each (dims
// [0, 256), then [256, 512)) every thread first loads the packed bytes and scale of its
// segments (independent loads in flight together), the warp syncs, then each writes its 8
// values as BF16 (exact: e4m3 x 2^k and e2m1 x e4m3 have at most 6 significant bits and a
// normal exponent). Why phase 0 never overwrites a byte phase 1 still reads: it writes slot
// bytes [0, 512), and every packed byte of a dim >= 256 and every scale of such a dim lies at
// or above byte 512 (V4: e4m3 dim i at 448 + i, scales at 1024+; V4.1 SWA: 512 + i, 1024+;
// V4.1 main KV: 752 + i/2, 1008 + i/16). Phase 1 writes [512, 1024) after all its reads; the
// V4 rope dims are already in place (packed_base). Warp-collective (a row's threads share a
// warp); a warp without packed rows returns at once.
__device__ __forceinline__ void convert_packed_row(const AttnParams<bf16_t>& P, uint16_t* tile, int kind) {
  if (!__any_sync(0xffffffffu, kind >= 2)) return;  // no packed row in this warp
  const int r = threadIdx.x / kThreadsPerRow, part = threadIdx.x % kThreadsPerRow;
  const KvRow f = kind == 3 ? P.comp_fmt : P.ring_fmt;  // by value (see stage_kv_row)
  unsigned char* slot = reinterpret_cast<unsigned char*>(tile + r * kStride);
  const unsigned char* src = slot + (kind >= 2 ? packed_base(f) : 0);
  const bool fp4 = f.format == kvpack::Format::Fp4E4m3B16, v4 = f.format == kvpack::Format::V4Row;
  const int nq = kind < 2 ? 0 : v4 ? f.d - f.rope : f.d;                    // dims to convert
  const int sc_at = fp4 ? f.d / 2 : v4 ? f.d - f.rope + 2 * f.rope : f.d;  // scale bytes in the row
  const int sc_shift = v4 ? 6 : fp4 ? 4 : 5;                                 // dims per scale: 64, 16, 32
  constexpr int kPer = kSegs / kThreadsPerRow / 2;                           // segments per thread and phase
#pragma unroll
  for (int ph = 0; ph < 2; ++ph) {
    uint2 raw[kPer];
    uint32_t sb[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int c0 = 8 * ((ph * kPer + j) * kThreadsPerRow + part);
      raw[j] = make_uint2(0u, 0u);
      sb[j] = 0;
      if (c0 < nq) {
        raw[j] = fp4 ? make_uint2(*reinterpret_cast<const uint32_t*>(src + c0 / 2), 0u)
                     : *reinterpret_cast<const uint2*>(src + c0);
        sb[j] = src[sc_at + (c0 >> sc_shift)];
      }
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int seg = (ph * kPer + j) * kThreadsPerRow + part;
      if (8 * seg < nq)
        *reinterpret_cast<uint4*>(slot + 16 * seg) =
            fp4 ? kv_e2m1x8_bf16(raw[j].x, kv_e4m3x2(uint16_t(sb[j])).x) : kv_e4m3x8_bf16(raw[j], d_e8m0_fast(uint8_t(sb[j])));
    }
    __syncwarp();
  }
}

__global__ void __launch_bounds__(kThreads, 1) attn_flash_kernel(AttnParams<bf16_t> P, FlashOut F) {
  pdl_enter();
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* qs = reinterpret_cast<uint16_t*>(smem);                         // [64][kStride] bf16
  uint16_t* tiles = reinterpret_cast<uint16_t*>(smem + kQBytes);            // [2][64][kStride] bf16
  float* xs = reinterpret_cast<float*>(smem + kQBytes + 2 * kTileBytes);    // [8][16][32] f32
  int* valid = reinterpret_cast<int*>(smem + kQBytes + 2 * kTileBytes + kXBytes);  // [2][64]

  const int t = blockIdx.x, h0 = blockIdx.y * kHeads, z = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
  const int hg = warp & 3, half = warp >> 2;
  const int s = P.tok_seq[t], p = P.tok_pos[t];
  int pw;  // the window's last position (p unless non-causal)
  const int n_win = attn_window(P, s, p, &pw);
  const int n_comp = P.ratio > 0 ? (P.comp_idx ? P.K : (p + 1) / P.ratio) : 0;
  const int n_cand = n_win + n_comp;
  const int n_tiles = (n_cand + kRows - 1) / kRows;
  // This CTA's tiles: split z of n_split, in equal counts (the last ones may be empty).
  const int per = (n_tiles + F.n_split - 1) / F.n_split;
  const int tile0 = min(n_tiles, z * per), tile1 = min(n_tiles, tile0 + per);

  // q of the 64 heads (16 segments per thread) with the first tile, one cp.async group.
  {
    const bf16_t* qrow = P.q + (int64_t(t) * P.H + h0) * kD;
    for (int i = tid; i < kHeads * kSegs; i += kThreads) {
      const int hh = i / kSegs, seg = i % kSegs;
      cp_async16(smem_addr(qs + hh * kStride + seg * 8), qrow + int64_t(hh) * kD + seg * 8, true);
    }
  }
  int kind = tile0 < tile1 ? issue_tile(P, t, s, pw, n_win, n_cand, tile0 * kRows, tiles, valid) : 0;  // my row's
  cp_async_commit();

  float o[kNt][4];  // O[heads 16hg + g | +8][dims 256 half + 8j + 2tg, +1]
#pragma unroll
  for (int j = 0; j < kNt; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float mA = -INFINITY, mB = -INFINITY, lA = 0.f, lB = 0.f;  // heads g and g+8 (log2 domain)
  const float sl2 = P.scale * kLog2e;

  // ldmatrix lane addresses (bytes within a row-major [row][kStride] bf16 array):
  // A (q, 16 heads x 16 k): row lane % 16, k offset 8 (lane / 16);
  // B for S (rows as n, 16 rows x 16 k, two n-tiles): row (lane % 8) + 8 (lane / 16), k 8 ((lane / 8) % 2);
  // B for P.V (rows as k, trans, 16 k x 16 dims): row (lane % 8) + 8 ((lane / 8) % 2), dim 8 (lane / 16).
  const uint32_t q_lane = smem_addr(qs + (hg * 16 + (lane & 15)) * kStride + 8 * (lane >> 4));
  const int kb_row = half * 32 + (lane & 7) + 8 * (lane >> 4), kb_col = 8 * ((lane >> 3) & 1);
  const int vb_row = (lane & 7) + 8 * ((lane >> 3) & 1), vb_col = half * kDimsPerWarp + 8 * (lane >> 4);
  float* x_mine = xs + warp * 16 * 32;
  const float* x_peer = xs + (warp ^ 4) * 16 * 32;

  for (int ti = tile0; ti < tile1; ++ti) {
    const int buf = (ti - tile0) & 1;
    cp_async_wait_all();  // this thread's copies of tile ti (and q)
    // Everyone's copies visible; everyone is done with tile ti - 1 (buffer buf ^ 1). Packed rows
    // in the tile: dequantized in place, then a second barrier before the MMAs read them.
    if (__syncthreads_or(kind >= 2)) {
      convert_packed_row(P, tiles + buf * kRows * kStride, kind);
      __syncthreads();
    }
    kind = ti + 1 < tile1 ? issue_tile(P, t, s, pw, n_win, n_cand, (ti + 1) * kRows, tiles + (buf ^ 1) * kRows * kStride,
                                       valid + (buf ^ 1) * kRows)
                          : 0;
    cp_async_commit();
    const uint16_t* tile = tiles + buf * kRows * kStride;
    const int* vld = valid + buf * kRows;

    // S for rows 32 half + 8j + {2tg, 2tg+1} (j = 0..3), heads g and g+8.
    float sc[8][4];  // n-tile j of the whole 64-row tile: rows 8j..8j+7
    {
      float acc[4][4];
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
      const uint32_t kb_lane = smem_addr(tile + kb_row * kStride + kb_col);
#pragma unroll 4
      for (int ks = 0; ks < kD / 16; ++ks) {
        uint32_t a[4], b0[4], b1[4];
        ldsm_x4(a, q_lane + unsigned(ks * 32));
        ldsm_x4(b0, kb_lane + unsigned(ks * 32));
        ldsm_x4(b1, kb_lane + unsigned(16 * kStride * 2 + ks * 32));
        mma_bf16(acc[0], a, b0[0], b0[1]);
        mma_bf16(acc[1], a, b0[2], b0[3]);
        mma_bf16(acc[2], a, b1[0], b1[1]);
        mma_bf16(acc[3], a, b1[2], b1[3]);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r0 = half * 32 + 8 * j + 2 * tg;
        const bool v0 = vld[r0] != 0, v1 = vld[r0 + 1] != 0;
        acc[j][0] = v0 ? acc[j][0] * sl2 : -INFINITY;
        acc[j][1] = v1 ? acc[j][1] * sl2 : -INFINITY;
        acc[j][2] = v0 ? acc[j][2] * sl2 : -INFINITY;
        acc[j][3] = v1 ? acc[j][3] * sl2 : -INFINITY;
        *reinterpret_cast<float4*>(x_mine + (j * 32 + lane) * 4) = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
      }
      pair_barrier(1 + hg);  // the peer's half of the scores is in shared memory
      // Own and peer halves into the tile's order with constant indices (a runtime index into
      // a register array would put it in local memory).
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float4 v = *reinterpret_cast<const float4*>(x_peer + (j * 32 + lane) * 4);
        const float pr[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          sc[j][e] = half ? pr[e] : acc[j][e];
          sc[4 + j][e] = half ? acc[j][e] : pr[e];
        }
      }
    }

    // Online softmax over the 64 rows (a quad holds a head's 64 scores: 16 per thread).
    float cA = -INFINITY, cB = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      cA = fmaxf(cA, fmaxf(sc[j][0], sc[j][1]));
      cB = fmaxf(cB, fmaxf(sc[j][2], sc[j][3]));
    }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      cA = fmaxf(cA, __shfl_xor_sync(0xffffffffu, cA, off));
      cB = fmaxf(cB, __shfl_xor_sync(0xffffffffu, cB, off));
    }
    const float nA = fmaxf(mA, cA), nB = fmaxf(mB, cB);
    // nX = -inf: nothing visible yet for this head (every p is 0 and nothing rescales).
    const float corrA = nA == -INFINITY ? 1.f : exp2f(mA - nA), corrB = nB == -INFINITY ? 1.f : exp2f(mB - nB);
    float sA = 0.f, sB = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      sc[j][0] = sc[j][0] == -INFINITY ? 0.f : exp2f(sc[j][0] - nA);
      sc[j][1] = sc[j][1] == -INFINITY ? 0.f : exp2f(sc[j][1] - nA);
      sc[j][2] = sc[j][2] == -INFINITY ? 0.f : exp2f(sc[j][2] - nB);
      sc[j][3] = sc[j][3] == -INFINITY ? 0.f : exp2f(sc[j][3] - nB);
      sA += sc[j][0] + sc[j][1];
      sB += sc[j][2] + sc[j][3];
    }
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
    for (int j = 0; j < kNt; ++j) {
      o[j][0] *= corrA;
      o[j][1] *= corrA;
      o[j][2] *= corrB;
      o[j][3] *= corrB;
    }

    // O += P V: k-step kk covers rows 16kk..16kk+15; P's A fragment is the score accumulator
    // layout of n-tiles 2kk and 2kk+1 (a0 = head g rows 2tg.., a1 = head g+8, a2/a3 = rows 8+2tg..).
    const uint32_t vb_lane = smem_addr(tile + vb_row * kStride + vb_col);
#pragma unroll
    for (int kk = 0; kk < kRows / 16; ++kk) {
      const uint32_t a[4] = {pack_bf16x2(sc[2 * kk][0], sc[2 * kk][1]), pack_bf16x2(sc[2 * kk][2], sc[2 * kk][3]),
                             pack_bf16x2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                             pack_bf16x2(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
      const uint32_t row_addr = vb_lane + unsigned(16 * kk * kStride * 2);
#pragma unroll
      for (int jp = 0; jp < kNt / 2; ++jp) {
        uint32_t b[4];
        ldsm_x4_trans(b, row_addr + unsigned(jp * 32));
        mma_bf16(o[2 * jp], a, b[0], b[1]);
        mma_bf16(o[2 * jp + 1], a, b[2], b[3]);
      }
    }
  }
  cp_async_wait_all();  // no copy may still target shared memory when the CTA exits

  const int hA = h0 + hg * 16 + g, hB = hA + 8;
  const int dim0 = half * kDimsPerWarp + 2 * tg;
  if (F.n_split > 1) {  // partial results; the combine kernel adds the sink
    const int64_t rowA = (int64_t(z) * gridDim.x + t) * P.H + hA, rowB = rowA + 8;
    float* oA = F.o_part + rowA * kD + dim0;
    float* oB = F.o_part + rowB * kD + dim0;
#pragma unroll
    for (int j = 0; j < kNt; ++j) {
      *reinterpret_cast<float2*>(oA + 8 * j) = make_float2(o[j][0], o[j][1]);
      *reinterpret_cast<float2*>(oB + 8 * j) = make_float2(o[j][2], o[j][3]);
    }
    if (half == 0 && tg == 0) {
      *reinterpret_cast<float2*>(F.ml_part + rowA * 2) = make_float2(mA, lA);
      *reinterpret_cast<float2*>(F.ml_part + rowB * 2) = make_float2(mB, lB);
    }
    return;
  }
  // The sink joins the denominator: out = O 2^(m-mf) / (l 2^(m-mf) + 2^(sink log2 e - mf)).
  const float sinkA = P.sink[hA] * kLog2e, sinkB = P.sink[hB] * kLog2e;
  const float mfA = fmaxf(mA, sinkA), mfB = fmaxf(mB, sinkB);
  const float aA = lA > 0.f ? exp2f(mA - mfA) : 0.f, aB = lB > 0.f ? exp2f(mB - mfB) : 0.f;
  const float fA = aA / (lA * aA + exp2f(sinkA - mfA)), fB = aB / (lB * aB + exp2f(sinkB - mfB));
  bf16_t* outA = F.out + (int64_t(t) * P.H + hA) * kD + dim0;
  bf16_t* outB = F.out + (int64_t(t) * P.H + hB) * kD + dim0;
#pragma unroll
  for (int j = 0; j < kNt; ++j) {  // two bf16 (even element offset: 4-byte aligned), each rounded once
    *reinterpret_cast<uint32_t*>(outA + 8 * j) = pack_bf16x2(o[j][0] * fA, o[j][1] * fA);
    *reinterpret_cast<uint32_t*>(outB + 8 * j) = pack_bf16x2(o[j][2] * fB, o[j][3] * fB);
  }
}

// out[t, h] = sum_z 2^(m_z - mf) O_z / (sum_z 2^(m_z - mf) l_z + 2^(sink_h log2 e - mf)),
// mf = max(max_z m_z, sink_h log2 e). Block per (token, head), 128 threads x 4 dims.
__global__ void __launch_bounds__(128) attn_flash_combine(const float* o_part, const float* ml_part,
                                                          const float* sink, bf16_t* out, int T, int H, int n_split) {
  pdl_enter();
  const int row = blockIdx.x, h = row % H;  // row = t * H + h
  const float sk = sink[h] * kLog2e;
  float mf = sk;
  for (int z = 0; z < n_split; ++z) mf = fmaxf(mf, ml_part[(int64_t(z) * T * H + row) * 2]);
  float den = exp2f(sk - mf);
  float4 num = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int z = 0; z < n_split; ++z) {
    const int64_t zr = int64_t(z) * T * H + row;
    const float m = ml_part[zr * 2], l = ml_part[zr * 2 + 1];
    if (!(l > 0.f)) continue;  // an empty split (no tiles, or nothing visible in them)
    const float w = exp2f(m - mf);
    den += l * w;
    const float4 v = reinterpret_cast<const float4*>(o_part + zr * kD)[threadIdx.x];
    num.x += v.x * w;
    num.y += v.y * w;
    num.z += v.z * w;
    num.w += v.w * w;
  }
  const float f = 1.f / den;
  uint2 pk;
  pk.x = pack_bf16x2(num.x * f, num.y * f);
  pk.y = pack_bf16x2(num.z * f, num.w * f);
  reinterpret_cast<uint2*>(out + int64_t(row) * kD)[threadIdx.x] = pk;
}

}  // namespace

int flash_token_rows(const StepMeta& m, int t, int window, bool non_causal, int ratio, int K) {
  const int p = m.h_tok_pos[size_t(t)], sq = m.h_tok_seq[size_t(t)];
  const int n_win = non_causal ? std::min(m.h_start_pos[size_t(sq)], window) + m.h_len[size_t(sq)]
                               : std::min(p + 1, window);  // attn_window
  return n_win + (ratio > 0 ? (K ? K : (p + 1) / ratio) : 0);
}

int flash_splits(const AttnArgs& a, const StepMeta& m, int sm_count) {
  const int64_t T = a.q.size(0), G = a.q.size(1) / kHeads;
  if (T * G * 2 >= sm_count) return 1;  // half a wave or more of CTAs already
  const int K = a.comp_idx.empty() ? 0 : int(a.comp_idx.size(1));
  const int ratio = a.comp.empty() ? 0 : a.comp_ratio;
  int max_tiles = 1;
  for (int64_t t = 0; t < T && t < int64_t(m.h_tok_pos.size()); ++t)
    max_tiles =
        std::max(max_tiles, int(ceil_div(flash_token_rows(m, int(t), a.window, a.non_causal, ratio, K), kRows)));
  // CTAs within one wave (one CTA per SM): a second wave would double the time. Down to one
  // tile per CTA: a batch-1 step's SWA (2 tiles) and HCA (3 at 8K) layers ran on one CTA with
  // half as many splits as tiles, 37 and 46 us against ~28 for one tile plus the combine.
  const int want = int(sm_count / (T * G));
  return std::max(1, std::min({want, max_tiles, 16}));
}

void sparse_attention_flash(Ctx& c, const AttnParams<bf16_t>& P, const AttnArgs& a, const StepMeta& m, int T_tokens,
                            int n_split, FlashKernel kernel) {
  DIL_CHECK(P.d == kD && P.H % kHeads == 0, "sparse_attention flash_bf16: H ", P.H, " d ", P.d);
  if (n_split <= 0) {
    int sms = 0;
    DIL_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, c.device));
    n_split = flash_splits(a, m, sms);
  }
  FlashOut F{P.out, nullptr, nullptr, n_split};
  Buffer o_part, ml_part;  // [n_split, T, H, d] and [n_split, T, H, 2] f32, while the stream uses them
  if (n_split > 1) {
    o_part = c.scratch(size_t(n_split) * T_tokens * P.H * kD * 4);
    ml_part = c.scratch(size_t(n_split) * T_tokens * P.H * 2 * 4);
    F.o_part = static_cast<float*>(o_part.data());
    F.ml_part = static_cast<float*>(ml_part.data());
  }
  dim3 grid(unsigned(T_tokens), unsigned(P.H / kHeads), unsigned(n_split));
  std::vector<Buffer> pools;  // the wgmma kernel's BF16 rows, while the stream uses them
  if (kernel == FlashKernel::Wgmma) {
    launch_attn_wgmma(c, pool_packed_rows(c, P, m, T_tokens, pools), F, grid);
  } else {
    DIL_CUDA(cudaFuncSetAttribute(attn_flash_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
    launch_pdl(c, "attn_flash_kernel", attn_flash_kernel, dim3(grid), dim3(kThreads), kSmem, P, F);
  }
  if (n_split > 1) {
    launch_pdl(c, "attn_flash_combine", attn_flash_combine, dim3(unsigned(T_tokens * P.H)), dim3(128), 0, F.o_part, F.ml_part, P.sink, P.out, T_tokens,
                                                                       P.H, n_split);
  }
}

}  // namespace dil::cuda
