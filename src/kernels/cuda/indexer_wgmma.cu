// Lightning-indexer scores on Hopper warpgroup MMA (the plan's wgmma_fp8), equal bit for bit to
// the CPU's fast specification, like mma_fp8: indexer_fp8.cu's file comment has the
// specification and why e4m3 operands give it exactly (one k32 MMA per 32-dim block, started from
// zero, is the block's exact sum; the rest is the specification's f32 arithmetic on CUDA cores).
// What changes is the shape of the work, after DeepGEMM's fp8_mqa_logits:
// - keys are the MMA's A operand (M = 64 key rows per warpgroup), one token's q the B operand
//   (N = Hi heads), so a thread's accumulators hold 2 key rows x Hi/4 heads: the weighted ReLU
//   head sum runs in the thread's registers, then two shuffles. The fragment's head order is
//   the specification's (head 8j + 2t + e: g = 2t + e, m-tile j / 2, pair member j % 2).
// - a CTA keeps the e4m3 q of 512 / Hi consecutive tokens of one sequence resident (64 KB) and
//   streams a range of key rows once for all of them: each key row is converted to e4m3 once
//   per CTA, not once per 8 tokens.
// - warp-specialized, 384 threads, one CTA per SM: WG0 converts (thread c owns row c of each
//   128-row stage: cp.async of its own raw row kRaw - 1 stages ahead, so the raw ring needs no
//   barrier; packed Fp4B32 rows through byte-permute tables, bf16 rows by cvt with a check),
//   WG1 and WG2 run wgmma over rows 0-63 / 64-127 of the stage for every token, each
//   warpgroup's epilogue overlapping the other's MMA.
// Rows whose e4m3 conversion is not exact (block exponents spanning more than 14 binades,
// values that are not FP4-QDQ'd, |S| > 60) and tokens whose q is not exact are rescored by the
// specification (spec_score), as in mma_fp8. Reindex steps (compact candidate entries) stay on
// mma_fp8.
#include <algorithm>

#include "kernels/cuda/hopper.cuh"
#include "kernels/cuda/indexer_fast.cuh"

namespace dil::cuda::idxfast {
namespace {
using namespace sm90;

constexpr int kThreads = 384;
constexpr int kTile = 128;          // key rows per stage
constexpr int kStages = 4;          // e4m3 key stages
constexpr int kChunk = 64 * kTile;  // key rows per CTA
constexpr int kQBytes = 64 * 1024;  // resident q: wgmma_group_tokens(Hi) x Hi x 128 B
constexpr int kMaxTok = 32;         // wgmma_group_tokens(16)
constexpr int kConvRegs = 56, kMmaRegs = 216;  // 128 x 56 + 256 x 216 = 62,464 <= 65,536

template <bool kPacked>
struct Cfg {
  // Raw bytes per row. Strides that keep a warp's per-row accesses free of bank conflicts: packed
  // rows (68 B = 17 words, odd) by 4-byte copies; bf16 rows (256 B) by 16-byte copies with thread
  // c's chunk k at chunk (k + c) % 16.
  static constexpr int kSlot = kPacked ? 68 : 256;
  static constexpr int kRaw = kPacked ? 4 : 2;      // raw ring depth (stages)
  static constexpr int oA = 0;                                   // [kStages][128 x 128 B] e4m3 keys, 128B swizzle
  static constexpr int oQ = oA + kStages * kTile * 128;          // [tokens][Hi x 128 B] e4m3 q, 128B swizzle
  static constexpr int oRaw = oQ + kQBytes;                      // [kRaw][128][kSlot] raw rows (cp.async)
  static constexpr int oRawPhys = oRaw + kRaw * kTile * kSlot;   // [kRaw][128] int64 physical row (own thread's)
  static constexpr int oMeta = oRawPhys + kRaw * kTile * 8;      // [kStages][128] int2: logical row (-1: none), S | fits << 16
  static constexpr int oPhys = oMeta + kStages * kTile * 8;      // [kStages][128] int64 physical row (rescoring)
  static constexpr int oWq = oPhys + kStages * kTile * 8;        // [tokens][Hi] f32 w * 2^Sq
  static constexpr int oTok = oWq + 512 * 4;                     // [kMaxTok] int2: visible rows, q flag
  static constexpr int oLut = oTok + kMaxTok * 8;                // [16] uint2 e2m1 -> e4m3 tables
  static constexpr int oBar = oLut + 16 * 8;                     // full[kStages], empty[kStages], q
  static constexpr int kSmem = oBar + (2 * kStages + 1) * 8 + 1024;  // + the base's 1024-byte alignment
  static_assert(oQ % 1024 == 0 && oRaw % 16 == 0 && oRawPhys % 8 == 0 && oBar % 8 == 0 && kSmem <= 232448,
                "shared memory layout");
};


// A packed Fp4B32 row (64 bytes of e2m1, dim 2k in the low nibble of byte k; 4 E8M0 block
// scales) -> 128 e4m3 bytes into row c of a swizzled tile, times 2^-S with S = E - 133 for the
// largest scale E among blocks holding a nonzero value: block b's values e2m1 x 2^(e_b - 127)
// become e2m1 x 2^(e_b - E + 6), exact for e_b - E + 6 >= -8 (the table's range). False when a
// nonzero block falls outside it or |S| > kMaxScale.
__device__ __forceinline__ bool convert_packed(const uint8_t* row, uint8_t* tile, int c, const uint2* lut, int& S) {
  uint32_t w[17];
#pragma unroll
  for (int i = 0; i < 17; ++i) w[i] = reinterpret_cast<const uint32_t*>(row)[i];
  int E = -1;
  bool nz[4];
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    nz[b] = ((w[4 * b] | w[4 * b + 1] | w[4 * b + 2] | w[4 * b + 3]) & 0x77777777u) != 0u;
    if (nz[b]) E = max(E, int((w[16] >> (8 * b)) & 0xffu));
  }
  bool fits = true;
  S = E < 0 ? 0 : E - 133;
  if (S < -kMaxScale || S > kMaxScale) fits = false;
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    const int d = int((w[16] >> (8 * b)) & 0xffu) - E + 6;
    const bool in = d >= -8 && d <= 6;  // nonzero blocks have d <= 6; zero ones may lie above
    if (nz[b] && !in) fits = false;
    const uint2 t = lut[in ? d + 8 : 15];  // 15: zeros (an all-zero block, or a misfit rescored)
    uint4 o0, o1;
    nib8_e4m3(w[4 * b], t, o0.x, o0.y);
    nib8_e4m3(w[4 * b + 1], t, o0.z, o0.w);
    nib8_e4m3(w[4 * b + 2], t, o1.x, o1.y);
    nib8_e4m3(w[4 * b + 3], t, o1.z, o1.w);
    *reinterpret_cast<uint4*>(tile + sw128_offset(c, 2 * b)) = o0;
    *reinterpret_cast<uint4*>(tile + sw128_offset(c, 2 * b + 1)) = o1;
  }
  return fits;
}

// A bf16 row -> e4m3 of x * 2^-S with S = exponent of max|x| minus 8 (indexer_fp8.cu's row_e4m3,
// one thread per row): true when every value converted exactly and |S| <= kMaxScale.
__device__ __forceinline__ bool convert_bf16(const uint8_t* row, uint8_t* tile, int c, int& S) {
  const uint4* src = reinterpret_cast<const uint4*>(row);  // chunk k at (k + c) % 16 (Cfg::kSlot)
  uint32_t mx = 0;
#pragma unroll 4
  for (int i = 0; i < 16; ++i) {
    const uint4 v = src[i];  // the max is order-free
    mx = max(mx, max(max(v.x & 0x7fffu, (v.x >> 16) & 0x7fffu), max(v.y & 0x7fffu, (v.y >> 16) & 0x7fffu)));
    mx = max(mx, max(max(v.z & 0x7fffu, (v.z >> 16) & 0x7fffu), max(v.w & 0x7fffu, (v.w >> 16) & 0x7fffu)));
  }
  S = mx ? int(mx >> 7) - 127 - 8 : 0;  // bf16 exponent field (the f32 one); subnormals give S < -60
  bool ok = S >= -kMaxScale && S <= kMaxScale;
  const float inv = pow2f(ok ? -S : 0);
  auto lo = [](uint32_t u) { return __uint_as_float(u << 16); };
  auto hi = [](uint32_t u) { return __uint_as_float(u & 0xffff0000u); };
#pragma unroll 2
  for (int k = 0; k < 8; ++k) {  // output chunk k: dims 16k .. 16k + 15
    const uint4 a = src[(2 * k + c) & 15], b = src[(2 * k + 1 + c) & 15];
    const uint32_t in[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    uint32_t out[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float x0 = __fmul_rn(lo(in[2 * j]), inv), x1 = __fmul_rn(hi(in[2 * j]), inv);
      const float x2 = __fmul_rn(lo(in[2 * j + 1]), inv), x3 = __fmul_rn(hi(in[2 * j + 1]), inv);
      out[j] = e4m3x4(x0, x1, x2, x3);
      const float2 r0 = e4m3x2_value(uint16_t(out[j] & 0xffffu)), r1 = e4m3x2_value(uint16_t(out[j] >> 16));
      ok = ok && r0.x == x0 && r0.y == x1 && r1.x == x2 && r1.y == x3;
    }
    *reinterpret_cast<uint4*>(tile + sw128_offset(c, k)) = make_uint4(out[0], out[1], out[2], out[3]);
  }
  return ok;
}

// A thread's two key rows of the stage (row lr0 and lr0 + 8 of the tile): logical row (-1:
// none), whether its e4m3 conversion is exact, and its scale 2^S.
struct Rows {
  int r0, r1;
  bool f0, f1;
  float sc0, sc1;
};

// Issues token i's 4 block MMAs into acc, one commit group: acc[b] = keys[64 rows, block b] .
// q_i[HI heads, block b]^T, each from zero (q_lo: the descriptor low word of token i's q tile).
template <int HI>
__device__ __forceinline__ void issue_token(float (&acc)[4][HI / 2], uint32_t a_lo, uint32_t q_lo) {
  wgmma_fence();  // the epilogue's reads of acc come before the MMAs overwrite it
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    fence_regs(acc[b]);
    wgmma_m64k32_e4m3_zero<HI>(acc[b], desc_k128b_from_lo(a_lo + 2 * b), desc_k128b_from_lo(q_lo + 2 * b));
  }
  wgmma_commit();
}

// The specification's arithmetic on token i's accumulators: d = ((B0 + B1) + B2) + B3, term =
// w' * relu(d); heads 8j + 2t + e: pairs (j even, j odd) are heads g and g + 8 of m-tile j / 2,
// summed into p[row][e] over m-tiles in order; then (p0 + p1) in the thread,
// ((p0+p1)+(p2+p3)) + ((p4+p5)+(p6+p7)) over t, times 2^S, stored by lane t = 0 (row lr0) and
// t = 1 (row lr0 + 8) where the row is visible, exact, and the token's q exact.
template <int HI>
__device__ __forceinline__ void epilogue_token(float (&acc)[4][HI / 2], int i, const Rows& rw, const float* wq_s,
                                               const int2* tok, int t, int t0, float* scores, int64_t ld) {
#pragma unroll
  for (int b = 0; b < 4; ++b) fence_regs(acc[b]);
  const float* wv = wq_s + i * HI + 2 * t;
  float2 w2s[HI / 8];
#pragma unroll
  for (int j = 0; j < HI / 8; ++j) w2s[j] = *reinterpret_cast<const float2*>(wv + 8 * j);
  float z[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float p[2] = {0.f, 0.f}, first[2] = {0.f, 0.f};
#pragma unroll
    for (int j = 0; j < HI / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int x = 4 * j + 2 * h + e;
        const float d = __fadd_rn(__fadd_rn(__fadd_rn(acc[0][x], acc[1][x]), acc[2][x]), acc[3][x]);
        const float term = __fmul_rn(e ? w2s[j].y : w2s[j].x, d > 0.f ? d : 0.f);
        if (j % 2 == 0) {
          first[e] = term;
        } else {
          const float pair = __fadd_rn(first[e], term);
          p[e] = j == 1 ? pair : __fadd_rn(p[e], pair);
        }
      }
    }
    z[h] = __fadd_rn(p[0], p[1]);
    z[h] = __fadd_rn(z[h], __shfl_xor_sync(0xffffffffu, z[h], 1));
    z[h] = __fadd_rn(z[h], __shfl_xor_sync(0xffffffffu, z[h], 2));
  }
  if (t < 2) {
    const int2 tk = tok[i];
    const int r = t ? rw.r1 : rw.r0;
    if (r >= 0 && r < tk.x && !tk.y && (t ? rw.f1 : rw.f0))
      scores[int64_t(t0 + i) * ld + r] = __fmul_rn(t ? z[1] : z[0], t ? rw.sc1 : rw.sc0);
  }
}

template <int HI, bool kPacked, class TW>
__global__ void __launch_bounds__(kThreads, 1) idx_wg_kernel(const __grid_constant__ FastParams<bf16_t, TW, bf16_t> P) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = Cfg<kPacked>;
  constexpr int kQTile = HI * 128;  // bytes of one token's e4m3 q
  extern __shared__ uint8_t smem_raw[];
  // 1024-byte aligned base by an offset into the shared array (accesses stay LDS/STS).
  uint8_t* sm = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  uint64_t* full = reinterpret_cast<uint64_t*>(sm + C::oBar);
  uint64_t* empty = full + kStages;
  uint64_t* qbar = empty + kStages;
  int2* meta = reinterpret_cast<int2*>(sm + C::oMeta);
  int64_t* phys = reinterpret_cast<int64_t*>(sm + C::oPhys);
  int2* tok = reinterpret_cast<int2*>(sm + C::oTok);
  const float* wq_s = reinterpret_cast<const float*>(sm + C::oWq);

  const int2 grp = P.groups[blockIdx.y];
  const int t0 = grp.x, tc = grp.y;
  const int seq = P.tok_seq[t0];
  int nv_max = 0;
  for (int i = 0; i < tc; ++i) nv_max = max(nv_max, (P.tok_pos[t0 + i] + 1) / P.ratio);
  const int e_begin = int(blockIdx.x) * kChunk;
  if (e_begin >= nv_max) return;
  const int n_st = (min(kChunk, nv_max - e_begin) + kTile - 1) / kTile;
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 128);   // every converter
      mbar_init(&empty[s], 256);  // every MMA thread
    }
    mbar_init(qbar, 128);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if (tid < 16) reinterpret_cast<uint2*>(sm + C::oLut)[tid] = e2m1_e4m3_table(tid);
  __syncthreads();

  if (tid < 128) {
    // ---------------- converters ----------------
    setmaxnreg_dec<kConvRegs>();
    const int c = tid;
    // The tokens' e4m3 q into swizzled B tiles (one cp.async group), their folded weights and
    // visibility; published through qbar once the group has landed.
    for (int i = c; i < tc * HI * 8; i += 128) {
      const int ti = i / (HI * 8), h = (i / 8) % HI, ch = i % 8;
      cp_async16(sm + C::oQ + ti * kQTile + sw128_offset(h, ch), P.q8 + (int64_t(t0 + ti) * HI + h) * 32 + ch * 4, 16);
    }
    cp_async_commit();
    for (int i = c; i < tc * HI; i += 128)
      reinterpret_cast<float*>(sm + C::oWq)[i] = P.wq[int64_t(t0) * HI + i];
    if (c < tc) tok[c] = make_int2((P.tok_pos[t0 + c] + 1) / P.ratio, P.tok_flag[t0 + c]);

    // Row c of stage st: its logical and physical row, and its raw bytes into ring slot st % kRaw.
    auto fetch = [&](int st) {
      if (st < n_st) {
        const int r = e_begin + st * kTile + c;
        const bool ok = r < nv_max;
        const int64_t pr =
            ok ? int64_t(P.block_table[int64_t(seq) * P.max_blocks + r / P.rpb]) * P.rpb + r % P.rpb : int64_t(-1);
        const int slot = st % C::kRaw;
        reinterpret_cast<int64_t*>(sm + C::oRawPhys)[slot * kTile + c] = pr;
        uint8_t* dst = sm + C::oRaw + (slot * kTile + c) * C::kSlot;
        if constexpr (kPacked) {
          const uint8_t* src = P.keys_packed + (ok ? pr : 0) * P.krb;  // 4-byte aligned rows
#pragma unroll
          for (int i = 0; i < 17; ++i) cp_async4(dst + 4 * i, src + 4 * i, ok ? 4 : 0);
        } else {
          const bf16_t* src = P.keys + (ok ? pr : 0) * 128;
#pragma unroll
          for (int ch = 0; ch < 16; ++ch) cp_async16(dst + 16 * ((ch + c) & 15), src + 8 * ch, ok ? 16 : 0);
        }
      }
      cp_async_commit();  // one group per stage, empty past the end
    };
#pragma unroll 1
    for (int st = 0; st < C::kRaw - 1; ++st) fetch(st);
    cp_async_wait<C::kRaw - 1>();  // the q group
    fence_proxy_async();
    mbar_arrive(qbar);

    const uint2* lut = reinterpret_cast<const uint2*>(sm + C::oLut);
#pragma unroll 1
    for (int st = 0; st < n_st; ++st) {
      const int s = st % kStages;
      const uint32_t ph = (st / kStages) & 1;
      fetch(st + C::kRaw - 1);  // its slot held stage st - 1, which this thread converted
      cp_async_wait<C::kRaw - 1>();  // stage st's row landed
      const int slot = st % C::kRaw;
      const int64_t pr = reinterpret_cast<const int64_t*>(sm + C::oRawPhys)[slot * kTile + c];
      const uint8_t* raw = sm + C::oRaw + (slot * kTile + c) * C::kSlot;
      mbar_wait(&empty[s], ph ^ 1);
      uint8_t* tile = sm + C::oA + s * kTile * 128;
      int S = 0;
      bool fits = true;
      if (pr >= 0) {
        if constexpr (kPacked) {
          fits = convert_packed(raw, tile, c, lut, S);
        } else {
          fits = convert_bf16(raw, tile, c, S);
        }
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) *reinterpret_cast<uint4*>(tile + sw128_offset(c, k)) = make_uint4(0, 0, 0, 0);
      }
      meta[s * kTile + c] = make_int2(pr >= 0 ? e_begin + st * kTile + c : -1, (S & 0xffff) | (fits ? 1 << 16 : 0));
      phys[s * kTile + c] = pr;
      fence_proxy_async();  // the tile is read by wgmma (the async proxy)
      mbar_arrive(&full[s]);
    }
    cp_async_wait<0>();
  } else {
    // ---------------- MMA warpgroups ----------------
    setmaxnreg_inc<kMmaRegs>();
    const int wg = tid / 128 - 1, warp = (tid / 32) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int lr0 = wg * 64 + warp * 16 + g;  // this thread's accumulator rows: lr0, lr0 + 8
    const uint32_t a_lo0 = desc_k128b_lo(smem_u32(sm + C::oA + wg * 8192)), q_lo0 = desc_k128b_lo(smem_u32(sm + C::oQ));
    mbar_wait(qbar, 0);
    bool any_flag = false;
    for (int i = 0; i < tc; ++i) any_flag = any_flag || tok[i].y != 0;
#pragma unroll 1
    for (int st = 0; st < n_st; ++st) {
      const int s = st % kStages;
      const uint32_t ph = (st / kStages) & 1;
      mbar_wait(&full[s], ph);
      Rows rw;
      const int2 m0 = meta[s * kTile + lr0], m1 = meta[s * kTile + lr0 + 8];
      rw.r0 = m0.x;
      rw.r1 = m1.x;
      rw.f0 = (m0.y >> 16) != 0;
      rw.f1 = (m1.y >> 16) != 0;
      rw.sc0 = pow2f(int(int16_t(m0.y & 0xffff)));
      rw.sc1 = pow2f(int(int16_t(m1.y & 0xffff)));
      const uint32_t a_lo = a_lo0 + uint32_t(s) * (kTile * 128 >> 4);
      // One token at a time: its MMAs, then its epilogue; the other MMA warpgroup's MMAs run
      // meanwhile. (Measured, 4,096 x 32K: two ping-ponged accumulator sets per warpgroup, so
      // that its own MMAs overlap its epilogue, with the keys' fragments in registers (the RS
      // form, exact as well): 32 heads 4.75 against 4.53 ms, 64 heads in two sets of 32 11.5
      // against 6.7 ms, its registers spilling. The MMA wait is not what limits this kernel.)
      float acc[4][HI / 2];
#pragma unroll 1
      for (int i = 0; i < tc; ++i) {
        issue_token<HI>(acc, a_lo, q_lo0 + uint32_t(i) * (kQTile >> 4));
        wgmma_wait<0>();
        epilogue_token<HI>(acc, i, rw, wq_s, tok, t, t0, P.scores, P.ld);
      }
      // Rows or tokens that are not exact in e4m3: the specification on CUDA cores, by the warp
      // whose 16 rows they are.
      const bool bad = (rw.r0 >= 0 && !rw.f0) || (rw.r1 >= 0 && !rw.f1);
      if (__any_sync(0xffffffffu, bad) || any_flag) {
        for (int x = lane; x < tc * 16; x += 32) {
          const int i = x / 16, lr = wg * 64 + warp * 16 + x % 16;
          const int2 mm = meta[s * kTile + lr];
          const int2 tk = tok[i];
          if (mm.x < 0 || mm.x >= tk.x || (!tk.y && (mm.y >> 16) != 0)) continue;
          const int64_t tt = t0 + i;
          P.scores[tt * P.ld + mm.x] = spec_score(P.q + tt * HI * 128, P.w + tt * HI, P.key(phys[s * kTile + lr]), HI, 128);
        }
      }
      mbar_arrive(&empty[s]);
    }
  }
#endif
}

}  // namespace

template <class TW>
void launch_idx_wgmma(const FastParams<bf16_t, TW, bf16_t>& P, int64_t n_entries, int64_t n_groups, cudaStream_t st) {
  const bool packed = P.keys_packed != nullptr;
  DIL_CHECK(P.di == 128 && (P.Hi == 16 || P.Hi == 32 || P.Hi == 64) && !P.cand, "indexer wgmma_fp8: Hi ", P.Hi,
            " di ", P.di, packed ? " packed" : "", P.cand ? " (Reindex)" : "");
  DIL_CHECK(!packed || P.krb == 68, "indexer wgmma_fp8: packed key rows of ", P.krb, " bytes (Fp4B32 di 128: 68)");
  if (n_entries == 0 || n_groups == 0) return;
  dim3 grid(unsigned((n_entries + kChunk - 1) / kChunk), unsigned(n_groups));
  auto go = [&](auto kern, int smem) {
    DIL_CUDA(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    kern<<<grid, kThreads, size_t(smem), st>>>(P);
  };
  auto by_heads = [&](auto pk) {
    constexpr bool kP = decltype(pk)::value;
    constexpr int sm = Cfg<kP>::kSmem;
    switch (P.Hi) {
      case 16: go(idx_wg_kernel<16, kP, TW>, sm); break;
      case 32: go(idx_wg_kernel<32, kP, TW>, sm); break;
      default: go(idx_wg_kernel<64, kP, TW>, sm); break;
    }
  };
  if (packed) by_heads(std::true_type{});
  else by_heads(std::false_type{});
  DIL_LAUNCH_CHECK("idx_wg_kernel");
}

template void launch_idx_wgmma<float>(const FastParams<bf16_t, float, bf16_t>&, int64_t, int64_t, cudaStream_t);
template void launch_idx_wgmma<bf16_t>(const FastParams<bf16_t, bf16_t, bf16_t>&, int64_t, int64_t, cudaStream_t);

}  // namespace dil::cuda::idxfast
