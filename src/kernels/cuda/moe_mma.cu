// Tensor-core grouped GEMM for the routed experts: FP4 (e2m1 x E8M0 per 1x32) weights
// dequantized to BF16 in shared memory, BF16 activation rows gathered with cp.async, warp-level
// mma.sync m16n8k16 BF16 -> f32. Block tile 128 rows x 128 columns, k stages of 32 (one FP4
// scale per weight row per stage), double-buffered: the next stage's activations arrive by
// cp.async and the next-but-one stage's weight bytes sit in registers while the current stage
// multiplies. 8 warps as 4 (rows) x 2 (columns), each 32 x 64 = 2 x 8 mma tiles; 16-row
// slices past the tile's last row skip their MMAs. 128-row tiles: at prefill an expert holds
// ~64 rows on average (4096 x 6 / 384), so most experts are one tile and each weight element
// is dequantized once per 128-column block instead of once per 64 rows (the dequantization,
// not the MMAs, bounds this kernel).
//
// Exactness: activations are FP8-QDQ'd (e4m3 x 2^j: 4 significant bits) and weights e2m1 x 2^j
// (2 significant bits), both exact in BF16 (8 bits) for every scale in the normal range, so
// every product is exact and the only rounding is the tensor cores' f32 accumulation (bound
// in docs/kernels.md and tests/cuda/test_moe_mma.cpp).
#include "kernels/cuda/moe_mma.cuh"
#include "kernels/cuda/mma.cuh"

#include <algorithm>

namespace dil::cuda {
namespace {

// Shared-memory row stride in bf16: 32 + 8 of padding, so the fragment loads of a warp
// (8 rows g x 4 words t at word g*20 + t) hit 32 distinct banks; 80 bytes keeps every
// 16-byte cp.async destination aligned.
constexpr int kLd = kMmaBK + 8;
constexpr int kWarpsM = kMmaBM / 32, kWarpsN = kMmaThreads / 32 / kWarpsM;  // 4 x 2 warps
constexpr int kWN = kMmaBN / kWarpsN, kNI = kWN / 8;                        // 64 columns, 8 mma tiles
constexpr int kAPer = kMmaBM * kMmaBK / 8 / kMmaThreads;                    // 16-byte A chunks per thread
static_assert(kWarpsM * kWarpsN * 32 == kMmaThreads && kNI * 8 * kWarpsN == kMmaBN && kAPer >= 1 &&
                  kAPer * kMmaThreads * 8 == kMmaBM * kMmaBK && kMmaBN * kMmaBK == 16 * kMmaThreads,
              "tile shape and thread mapping");

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned s = unsigned(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;  // 0: the 16 bytes are zero-filled, nothing is read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ uint32_t lds32(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// e2m1 nibble -> f32, exactly: the sign and the 3 magnitude bits placed at f32 bits 31 and
// 24..22 read as 2^-126 times the e2m1 value (exponent field 0 is the subnormal 0.5 x 2^-126
// for code 1, field e >= 1 is 2^(e-127) x 1.m), then scaled by 2^126 (exact).
__device__ __forceinline__ float e2m1_exact(uint32_t nib) {
  return __uint_as_float(((nib & 8u) << 28) | ((nib & 7u) << 22)) * 0x1p126f;
}

// bf16 bits of a value known to be exact in BF16 (its low 16 f32 bits are zero).
__device__ __forceinline__ uint32_t bf16_pair(float lo, float hi) {
  return (__float_as_uint(lo) >> 16) | (__float_as_uint(hi) & 0xffff0000u);
}

// E8M0 byte -> 2^(b-127) as f32 bits (b = 0: the subnormal 2^-127; 255: inf, as ldexpf).
__device__ __forceinline__ float e8m0_exact(uint32_t b) { return __uint_as_float(b ? b << 23 : 0x00400000u); }

// The 16 values of one byte pair list: bf16 pairs of e2m1 x scale. kFold: scale = 2^(b-1), the
// e2m1 bits' 2^-126 folded in (one exact multiply; b <= 128 keeps 2^(b-1) finite).
template <bool kFold>
__device__ __forceinline__ void dequant16(uint2 q, float s, uint32_t (&p)[8]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {  // byte j: columns 2j (low nibble) and 2j+1 (high nibble)
    const uint32_t byte = ((j < 4 ? q.x : q.y) >> ((j & 3) * 8)) & 0xffu;
    const uint32_t lo = byte & 15u, hi = byte >> 4;
    if (kFold) {
      const float a = __uint_as_float(((lo & 8u) << 28) | ((lo & 7u) << 22)) * s;
      const float b = __uint_as_float(((hi & 8u) << 28) | ((hi & 7u) << 22)) * s;
      p[j] = bf16_pair(a, b);
    } else {
      p[j] = bf16_pair(e2m1_exact(lo) * s, e2m1_exact(hi) * s);
    }
  }
}


// Two blocks per SM (<= 128 registers per thread): one block's barrier and load waits overlap
// the other's MMAs.
__global__ void __launch_bounds__(kMmaThreads, 2) moe_mma_fp4_kernel(const uint16_t* __restrict__ x, int64_t ldx,
                                                                  const int32_t* __restrict__ gather,
                                                                  const WView* __restrict__ experts, MoeTileMap map,
                                                                  float* __restrict__ out, int64_t ldo, int64_t N,
                                                                  int64_t K) {
  const int tile = blockIdx.y;
  if (tile >= *map.n_tiles) return;
  const int e = map.tile_e[tile];
  const int64_t r0 = map.tile_r0[tile];
  const int rows = int(min(int64_t(kMmaBM), int64_t(map.offsets[e + 1]) - r0));  // >= 1
  const int64_t n0 = int64_t(blockIdx.x) * kMmaBN;
  const uint8_t* wq = static_cast<const uint8_t*>(experts[e].w);  // [N, K/2] FP4 bytes
  const uint8_t* ws = experts[e].scale;                          // [N, K/32] E8M0
  const int64_t s_cols = experts[e].scale_cols;

  __shared__ __align__(16) uint16_t As[2][kMmaBM][kLd];  // activation rows, bf16 [row][k]
  __shared__ __align__(16) uint16_t Bs[2][kMmaBN][kLd];  // weight rows, bf16 [n][k]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int wm = warp / kWarpsN, wn = warp % kWarpsN;  // this warp: rows 32*wm.., columns kWN*wn..

  // Activations: kAPer 16-byte chunks (8 bf16) per thread and stage: chunk c = tid + i * threads
  // is row c/4, k 8*(c%4).
  int a_row[kAPer], a_k[kAPer];
  bool a_ok[kAPer];
  const uint16_t* a_src[kAPer];
#pragma unroll
  for (int i = 0; i < kAPer; ++i) {
    const int ch = tid + i * kMmaThreads;
    a_row[i] = ch >> 2;
    a_k[i] = (ch & 3) * 8;
    a_ok[i] = a_row[i] < rows;
    a_src[i] = a_ok[i] ? x + (gather ? int64_t(gather[r0 + a_row[i]]) : r0 + a_row[i]) * ldx + a_k[i]
                       : x;  // x: a valid address, never read (zero-fill)
  }
  // Weights: 8 bytes (16 FP4 values, one scale) per thread and stage: row n0 + tid/2, k 16*(tid%2).
  const int b_row = tid >> 1, b_k = (tid & 1) * 16;
  const bool b_ok = n0 + b_row < N;
  const uint8_t* b_src = wq + (b_ok ? n0 + b_row : 0) * (K >> 1) + (b_k >> 1);
  const uint8_t* s_src = ws + (b_ok ? n0 + b_row : 0) * s_cols;

  const int nk = int(K / kMmaBK);
  float acc[2][kNI][4] = {};
  uint2 bq = make_uint2(0u, 0u);
  uint32_t bs = 127;
  auto load_a = [&](int kt, int buf) {
#pragma unroll
    for (int i = 0; i < kAPer; ++i)
      cp_async16(&As[buf][a_row[i]][a_k[i]], a_src[i] + (a_ok[i] ? int64_t(kt) * kMmaBK : 0), a_ok[i]);
  };
  auto load_b = [&](int kt) {  // kMmaBK == 32: stage kt uses scale column kt
    if (!b_ok) return;
    bq = *reinterpret_cast<const uint2*>(b_src + int64_t(kt) * (kMmaBK / 2));
    bs = s_src[kt];
  };
  auto store_b = [&](int buf) {  // dequantize bq to 16 bf16 at Bs[buf][b_row][b_k..]
    uint32_t p[8];
    if (b_ok && bs >= 1 && bs <= 128) {
      dequant16<true>(bq, __uint_as_float(bs << 23) * 0x1p126f, p);  // 2^(bs-1), exact
    } else if (b_ok) {
      dequant16<false>(bq, e8m0_exact(bs), p);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) p[j] = 0u;
    }
    uint4* dst = reinterpret_cast<uint4*>(&Bs[buf][b_row][b_k]);
    dst[0] = make_uint4(p[0], p[1], p[2], p[3]);
    dst[1] = make_uint4(p[4], p[5], p[6], p[7]);
  };
  auto compute = [&](int buf) {
    if (wm * 32 >= rows) return;  // warp-uniform: this warp's 32 rows are past the tile's end
#pragma unroll
    for (int ks = 0; ks < kMmaBK; ks += 16) {
      uint32_t bf[kNI][2];
#pragma unroll
      for (int ni = 0; ni < kNI; ++ni) {
        const uint16_t* p = &Bs[buf][wn * kWN + ni * 8 + g][ks + 2 * t];
        bf[ni][0] = lds32(p);
        bf[ni][1] = lds32(p + 8);
      }
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        if (wm * 32 + mi * 16 >= rows) continue;  // warp-uniform: 16 rows past the tile's end
        const uint16_t* p = &As[buf][wm * 32 + mi * 16 + g][ks + 2 * t];
        const uint32_t af[4] = {lds32(p), lds32(p + 8 * kLd), lds32(p + 8), lds32(p + 8 * kLd + 8)};
#pragma unroll
        for (int ni = 0; ni < kNI; ++ni) mma_bf16(acc[mi][ni], af, bf[ni]);
      }
    }
  };

  load_a(0, 0);
  cp_async_commit();
  load_b(0);
  store_b(0);
  if (nk > 1) load_b(1);
  cp_async_wait_all();
  __syncthreads();
  for (int kt = 0; kt < nk; ++kt) {
    const int cur = kt & 1;
    // Buffer cur ^ 1 was last read in stage kt - 1, which ended with a barrier.
    if (kt + 1 < nk) {
      load_a(kt + 1, cur ^ 1);
      cp_async_commit();
    }
    compute(cur);
    if (kt + 1 < nk) {
      store_b(cur ^ 1);
      if (kt + 2 < nk) load_b(kt + 2);
    }
    cp_async_wait_all();
    __syncthreads();
  }

#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // h = 0: row g (d0, d1); 1: row g + 8 (d2, d3)
        const int r = wm * 32 + mi * 16 + g + 8 * h;
        if (r >= rows) continue;
        const int64_t n = n0 + wn * kWN + ni * 8 + 2 * t;
        float* o = out + (r0 + r) * ldo + n;
        if (n + 1 < N && (ldo & 1) == 0) {  // n even: 8-byte aligned
          *reinterpret_cast<float2*>(o) = make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
        } else {
          if (n < N) o[0] = acc[mi][ni][2 * h];
          if (n + 1 < N) o[1] = acc[mi][ni][2 * h + 1];
        }
      }
}

}  // namespace

bool moe_mma_fits(const std::vector<Weight>& ws) {
  for (const Weight& w : ws) {
    if (w.kind != Weight::Kind::FP4 || w.in % kMmaBK != 0 || w.scale.empty() ||
        (reinterpret_cast<uintptr_t>(w.w.data) & 7) != 0)
      return false;
  }
  return !ws.empty();
}

void moe_mma_fp4(Ctx& c, const uint16_t* x, int64_t ldx, const int32_t* gather, const WView* experts,
                 const MoeTileMap& map, int max_tiles, float* out, int64_t ldo, int64_t N, int64_t K) {
  DIL_CHECK(K % kMmaBK == 0 && ldx % 8 == 0, "moe_mma_fp4: K ", K, " ldx ", ldx);
  dim3 grid(unsigned(ceil_div(N, kMmaBN)), unsigned(max_tiles));
  moe_mma_fp4_kernel<<<grid, kMmaThreads, 0, c.stream>>>(x, ldx, gather, experts, map, out, ldo, N, K);
  DIL_LAUNCH_CHECK("moe_mma_fp4_kernel");
}

}  // namespace dil::cuda
