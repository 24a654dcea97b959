// Sparse attention with a sink on tensor cores: one kernel template, two operand modes (the
// storage type T of q, the rows and out):
// - T = float, official numerics (the plan's mma_split_bf16): every f32 operand x is split as
//   hi = bf16(x), lo = bf16(x - hi) (|x - hi - lo| <= 2^-17 |x|) and x.y = hi.hi + hi.lo +
//   lo.hi (the dropped lo.lo term is <= 2^-16 |x||y|): 3 MMAs per product, in S = q.k^T and in
//   O += P.V alike; f32 output.
// - T = bf16_t, fast numerics (mma_bf16), what FlashMLA computes: the BF16 q and rows are the
//   MMA operands as they are (one MMA per product in S; BF16 x BF16 products are exact in f32),
//   the probabilities are rounded to BF16 for P.V (one MMA), the row sums stay those of the f32
//   probabilities; bf16 output (rounded once).
// Both: f32 accumulation, f32 online softmax (expf) with the sink in the denominator at the end.
// Bounds: tests/cuda/test_attention.cpp (official), test_attention_fast.cpp (fast).
//
// One CTA per (token, 16 heads), 4 warps. The token's candidate rows (window rows, then
// compressed rows; MQA: one row serves as key and value for every head) are staged 32 at a
// time in shared memory as BF16 (official: hi and lo planes). S = q.k^T: warp w scores rows
// 8w..8w+7 of the chunk for the 16 heads; the scores meet in shared memory; every warp then
// updates the same online-softmax state (running max and sum per head, identical in all warps)
// and accumulates O += P.V for its quarter of the 512 output dims (ldmatrix.trans gives the
// value fragments from the row-major rows).
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/mma.cuh"

namespace dil::cuda {
namespace {

constexpr int kD = 512, kHeads = 16, kRows = 32, kWarps = 4;
constexpr int kStride = kD + 8;  // bf16 per staged row: 1040 B, conflict-free fragment loads
constexpr int kSStride = kRows + 1;
constexpr int kDimsPerWarp = kD / kWarps;  // 128 output dims per warp
constexpr int kNt = kDimsPerWarp / 8;      // 16 n-tiles per warp

__device__ __forceinline__ float bf16_f(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }
// x -> (hi, lo) BF16 halves.
__device__ __forceinline__ void split(float x, uint16_t& hi, uint16_t& lo) {
  hi = bf16_bits(x);
  lo = bf16_bits(x - bf16_f(hi));
}
__device__ __forceinline__ uint32_t pack(uint16_t lo_k, uint16_t hi_k) { return uint32_t(lo_k) | (uint32_t(hi_k) << 16); }

// The (k = row, n = dim) B fragment of a 16x8 tile of row-major [row][dim] BF16 rows.
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t& b0, uint32_t& b1, const uint16_t* p) {
  const unsigned addr = unsigned(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n" : "=r"(b0), "=r"(b1) : "r"(addr));
}

__device__ __forceinline__ void stage4(uint16_t* hi, uint16_t* lo, float4 v) {
  uint16_t h[4], l[4];
  split(v.x, h[0], l[0]);
  split(v.y, h[1], l[1]);
  split(v.z, h[2], l[2]);
  split(v.w, h[3], l[3]);
  *reinterpret_cast<uint2*>(hi) = make_uint2(pack(h[0], h[1]), pack(h[2], h[3]));
  *reinterpret_cast<uint2*>(lo) = make_uint2(pack(l[0], l[1]), pack(l[2], l[3]));
}

// One row of kD values into shared memory: official, 4 f32 per step split into the hi and lo
// planes; fast, 8 bf16 per step (16 bytes) copied, or dequantized from a packed row (exact). A
// null row stages zeros. q rows use the pointer overloads.
__device__ __forceinline__ void stage_row(uint16_t* hi, uint16_t* lo, const float* src, int c) {
  const int c4 = c;  // 4-value group
  stage4(hi + 4 * c4, lo + 4 * c4, src ? reinterpret_cast<const float4*>(src)[c4] : make_float4(0.f, 0.f, 0.f, 0.f));
}
__device__ __forceinline__ void stage_row(uint16_t* hi, uint16_t*, const bf16_t* src, int c) {
  const int c8 = c;  // 8-value group
  *reinterpret_cast<uint4*>(hi + 8 * c8) = src ? reinterpret_cast<const uint4*>(src)[c8] : make_uint4(0u, 0u, 0u, 0u);
}
__device__ __forceinline__ void stage_row(const AttnParams<float>& P, uint16_t* hi, uint16_t* lo, KvRef r, int c) {
  stage4(hi + 4 * c, lo + 4 * c, attn_row4(P, r, c));
}
__device__ __forceinline__ void stage_row(const AttnParams<bf16_t>& P, uint16_t* hi, uint16_t* lo, KvRef r, int c) {
  if (r.p && r.kind) {
    *reinterpret_cast<uint4*>(hi + 8 * c) = attn_row8_packed(P, r, c);
    return;
  }
  stage_row(hi, lo, static_cast<const bf16_t*>(r.p), c);
}

template <class T>
constexpr bool kSplitOf = std::is_same_v<T, float>;
// BF16 planes per staged value: hi and lo (official) or the value itself (fast).
template <class T>
constexpr int kPartsOf = kSplitOf<T> ? 2 : 1;
// Values staged per thread step: 4 f32 (split into two 8-byte stores) or 8 bf16 (16 bytes).
template <class T>
constexpr int kVecOf = kSplitOf<T> ? 4 : 8;

template <class T>
constexpr size_t smem_bytes() {
  return size_t(kPartsOf<T> * kHeads + kPartsOf<T> * kRows) * kStride * 2 + size_t(kHeads) * kSStride * 4 +
         size_t(kRows) * sizeof(KvRef);
}

template <class T>
__global__ void __launch_bounds__(kWarps * 32) attn_mma_kernel(AttnParams<T> P) {
  constexpr bool kSplit = kSplitOf<T>;
  constexpr int kParts = kPartsOf<T>, kVec = kVecOf<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* qh = reinterpret_cast<uint16_t*>(smem);     // [16][kStride] bf16 (hi plane)
  uint16_t* ql = qh + (kParts - 1) * kHeads * kStride;  // [16][kStride] lo plane (official; fast: = qh, unused)
  uint16_t* kh = qh + kParts * kHeads * kStride;        // [32][kStride] bf16 (hi plane)
  uint16_t* kl = kh + (kParts - 1) * kRows * kStride;   // [32][kStride] lo plane (official; fast: = kh, unused)
  float* S = reinterpret_cast<float*>(kh + kParts * kRows * kStride);  // [16][kSStride]
  KvRef* ptrs = reinterpret_cast<KvRef*>(S + kHeads * kSStride);  // [32]

  const int t = blockIdx.x, h0 = blockIdx.y * kHeads;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
  const int s = P.tok_seq[t], p = P.tok_pos[t];
  int pw;  // the window's last position (p unless non-causal)
  const int n_win = attn_window(P, s, p, &pw);
  const int n_comp = P.ratio > 0 ? (P.comp_idx ? P.K : (p + 1) / P.ratio) : 0;
  const int n_cand = n_win + n_comp;

  for (int i = tid; i < kHeads * (kD / kVec); i += blockDim.x) {
    const int hh = i / (kD / kVec), cv = i % (kD / kVec);
    stage_row(qh + hh * kStride, ql + hh * kStride, P.q + (int64_t(t) * P.H + h0 + hh) * kD, cv);
  }

  float o[kNt][4];  // O[heads g | g+8][dims warp*128 + 8j + 2tg, +1]
#pragma unroll
  for (int j = 0; j < kNt; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float mA = -INFINITY, mB = -INFINITY, lA = 0.f, lB = 0.f;  // heads g and g+8
  const float scale = P.scale;

  for (int c0 = 0; c0 < n_cand; c0 += kRows) {
    __syncthreads();  // the previous chunk's rows, scores and pointers are no longer read
    if (tid < kRows) ptrs[tid] = c0 + tid < n_cand ? attn_row(P, t, s, pw, n_win, c0 + tid) : KvRef{nullptr, 0};
    __syncthreads();
    for (int i = tid; i < kRows * (kD / kVec); i += blockDim.x) {
      const int r = i / (kD / kVec), cv = i % (kD / kVec);
      stage_row(P, kh + r * kStride, kl + r * kStride, ptrs[r], cv);
    }
    __syncthreads();

    // Scores of rows 8*warp .. +7 for the 16 heads.
    {
      float sacc[4] = {0.f, 0.f, 0.f, 0.f};
      const uint32_t* qa_h0 = reinterpret_cast<const uint32_t*>(qh + g * kStride);
      const uint32_t* qa_h1 = reinterpret_cast<const uint32_t*>(qh + (g + 8) * kStride);
      const uint32_t* qa_l0 = reinterpret_cast<const uint32_t*>(ql + g * kStride);
      const uint32_t* qa_l1 = reinterpret_cast<const uint32_t*>(ql + (g + 8) * kStride);
      const uint32_t* kb_h = reinterpret_cast<const uint32_t*>(kh + (warp * 8 + g) * kStride);
      const uint32_t* kb_l = reinterpret_cast<const uint32_t*>(kl + (warp * 8 + g) * kStride);
#pragma unroll 4
      for (int ks = 0; ks < kD / 16; ++ks) {
        const int c = ks * 8 + tg;
        const uint32_t ah[4] = {qa_h0[c], qa_h1[c], qa_h0[c + 4], qa_h1[c + 4]};
        const uint32_t bh0 = kb_h[c], bh1 = kb_h[c + 4];
        mma_bf16(sacc, ah, bh0, bh1);
        if constexpr (kSplit) {
          const uint32_t al[4] = {qa_l0[c], qa_l1[c], qa_l0[c + 4], qa_l1[c + 4]};
          const uint32_t bl0 = kb_l[c], bl1 = kb_l[c + 4];
          mma_bf16(sacc, ah, bl0, bl1);
          mma_bf16(sacc, al, bh0, bh1);
        }
      }
      const int r0 = warp * 8 + 2 * tg;
      const bool v0 = ptrs[r0].p != nullptr, v1 = ptrs[r0 + 1].p != nullptr;
      S[g * kSStride + r0] = v0 ? sacc[0] * scale : -INFINITY;
      S[g * kSStride + r0 + 1] = v1 ? sacc[1] * scale : -INFINITY;
      S[(g + 8) * kSStride + r0] = v0 ? sacc[2] * scale : -INFINITY;
      S[(g + 8) * kSStride + r0 + 1] = v1 ? sacc[3] * scale : -INFINITY;
    }
    __syncthreads();

    // Online softmax. This thread's rows of the P fragments: for k-step ks2, rows
    // 16*ks2 + {2tg, 2tg+1, 8+2tg, 9+2tg}; a quad (tg = 0..3) covers all 32.
    float pA[8], pB[8];
#pragma unroll
    for (int ks2 = 0; ks2 < 2; ++ks2) {
      const int rb = 16 * ks2 + 2 * tg;
      pA[4 * ks2 + 0] = S[g * kSStride + rb];
      pA[4 * ks2 + 1] = S[g * kSStride + rb + 1];
      pA[4 * ks2 + 2] = S[g * kSStride + rb + 8];
      pA[4 * ks2 + 3] = S[g * kSStride + rb + 9];
      pB[4 * ks2 + 0] = S[(g + 8) * kSStride + rb];
      pB[4 * ks2 + 1] = S[(g + 8) * kSStride + rb + 1];
      pB[4 * ks2 + 2] = S[(g + 8) * kSStride + rb + 8];
      pB[4 * ks2 + 3] = S[(g + 8) * kSStride + rb + 9];
    }
    float cA = -INFINITY, cB = -INFINITY;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      cA = fmaxf(cA, pA[i]);
      cB = fmaxf(cB, pB[i]);
    }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      cA = fmaxf(cA, __shfl_xor_sync(0xffffffffu, cA, off));
      cB = fmaxf(cB, __shfl_xor_sync(0xffffffffu, cB, off));
    }
    const float nA = fmaxf(mA, cA), nB = fmaxf(mB, cB);
    // nX = -inf: nothing visible yet for this head (then every p is 0 and nothing rescales).
    const float corrA = nA == -INFINITY ? 1.f : expf(mA - nA), corrB = nB == -INFINITY ? 1.f : expf(mB - nB);
    float sA = 0.f, sB = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      pA[i] = pA[i] == -INFINITY ? 0.f : expf(pA[i] - nA);
      pB[i] = pB[i] == -INFINITY ? 0.f : expf(pB[i] - nB);
      sA += pA[i];
      sB += pB[i];
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

    // O += P.V over this warp's 128 dims. A fragment (rows = heads g | g+8, k = candidate rows):
    // a0 = (g, 2tg..), a1 = (g+8, 2tg..), a2 = (g, 8+2tg..), a3 = (g+8, 8+2tg..).
#pragma unroll
    for (int ks2 = 0; ks2 < 2; ++ks2) {
      const float pv[8] = {pA[4 * ks2 + 0], pA[4 * ks2 + 1], pB[4 * ks2 + 0], pB[4 * ks2 + 1],
                           pA[4 * ks2 + 2], pA[4 * ks2 + 3], pB[4 * ks2 + 2], pB[4 * ks2 + 3]};
      uint16_t h[8], l[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if constexpr (kSplit) split(pv[i], h[i], l[i]);
        else h[i] = bf16_bits(pv[i]);  // fast: P rounded to BF16 (RNE), one MMA
      }
      const uint32_t ah[4] = {pack(h[0], h[1]), pack(h[2], h[3]), pack(h[4], h[5]), pack(h[6], h[7])};
      const int row = 16 * ks2 + (lane & 15);
#pragma unroll
      for (int j = 0; j < kNt; ++j) {
        const int col = warp * kDimsPerWarp + 8 * j;
        uint32_t bh0, bh1;
        ldmatrix_x2_trans(bh0, bh1, kh + row * kStride + col);
        mma_bf16(o[j], ah, bh0, bh1);
        if constexpr (kSplit) {
          const uint32_t al[4] = {pack(l[0], l[1]), pack(l[2], l[3]), pack(l[4], l[5]), pack(l[6], l[7])};
          uint32_t bl0, bl1;
          ldmatrix_x2_trans(bl0, bl1, kl + row * kStride + col);
          mma_bf16(o[j], ah, bl0, bl1);
          mma_bf16(o[j], al, bh0, bh1);
        }
      }
    }
  }

  // The sink joins the denominator: out = O e^(m-mf) / (l e^(m-mf) + e^(sink-mf)).
  const int hA = h0 + g, hB = hA + 8;
  const float sinkA = P.sink[hA], sinkB = P.sink[hB];
  const float mfA = fmaxf(mA, sinkA), mfB = fmaxf(mB, sinkB);
  const float aA = lA > 0.f ? expf(mA - mfA) : 0.f, aB = lB > 0.f ? expf(mB - mfB) : 0.f;
  const float fA = aA / (lA * aA + expf(sinkA - mfA)), fB = aB / (lB * aB + expf(sinkB - mfB));
  T* outA = P.out + (int64_t(t) * P.H + hA) * kD + warp * kDimsPerWarp + 2 * tg;
  T* outB = P.out + (int64_t(t) * P.H + hB) * kD + warp * kDimsPerWarp + 2 * tg;
#pragma unroll
  for (int j = 0; j < kNt; ++j) {
    if constexpr (kSplit) {
      *reinterpret_cast<float2*>(outA + 8 * j) = make_float2(o[j][0] * fA, o[j][1] * fA);
      *reinterpret_cast<float2*>(outB + 8 * j) = make_float2(o[j][2] * fB, o[j][3] * fB);
    } else {  // two bf16 (even element offset: 4-byte aligned), each rounded once
      *reinterpret_cast<uint32_t*>(outA + 8 * j) = pack(bf16_bits(o[j][0] * fA), bf16_bits(o[j][1] * fA));
      *reinterpret_cast<uint32_t*>(outB + 8 * j) = pack(bf16_bits(o[j][2] * fB), bf16_bits(o[j][3] * fB));
    }
  }
}

}  // namespace

template <class T>
void sparse_attention_mma(Ctx& c, const AttnParams<T>& P, int T_tokens) {
  DIL_CHECK(P.d == kD && P.H % kHeads == 0, "sparse_attention_mma: H ", P.H, " d ", P.d);
  constexpr size_t kSmem = smem_bytes<T>();
  DIL_CUDA(cudaFuncSetAttribute(attn_mma_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
  dim3 grid(unsigned(T_tokens), unsigned(P.H / kHeads));
  attn_mma_kernel<T><<<grid, kWarps * 32, kSmem, c.stream>>>(P);
  DIL_LAUNCH_CHECK("attn_mma_kernel");
}
template void sparse_attention_mma<float>(Ctx&, const AttnParams<float>&, int);
template void sparse_attention_mma<bf16_t>(Ctx&, const AttnParams<bf16_t>&, int);

}  // namespace dil::cuda
