// Lightning-indexer scores on tensor cores for official numerics, bit-identical to the
// reference (src/kernels/cpu/indexer.cpp).
//
// Why it can be exact: in official and fast modes the indexer's q and keys are FP4-QDQ'd in blocks of
// 32 dims (e2m1 value times a power-of-two scale, model-spec §3.7, §4.3). Such values are
// exact in BF16, so a BF16 MMA forms every product q_c * k_c exactly, and within one 32-dim
// block all products are multiples of g = s_q*s_k/4 bounded by 36*s_q*s_k, so the block's
// sum is an integer multiple of g below 4608*g: 13 bits, exact in the f32 accumulator in any
// summation order. The four block sums are then added in double (exact while the blocks'
// scales are within 2^39 of each other, as they are for activations), which is the exact dot
// product the reference computes in double. From there the epilogue repeats the reference's
// operations in its order: term_h = double(w_h) * max(dot_h, 0), summed over heads ascending
// in double (one thread per key row, through shared memory), rounded once to f32.
//
// Layout: one CTA per (token, 128 key rows); a Reindex layer (cand_in) scores only the rows of
// its candidate blocks, the only ones its top-k can select. Warp w owns the 16-head m-tile w % MT (MT =
// heads/16, q fragments held in registers for the whole tile) and the key n-tiles
// w / MT, w / MT + 4 / MT, ...; keys are staged in shared memory as BF16.
//
// Inputs are f32 or bf16 activations: f32 q and keys are rounded to BF16 (exact for FP4-QDQ'd
// values), bf16 ones are read as they are (fast numerics: q straight from the tensor, keys
// copied from the paged cache); the head weights w are read in their dtype.
#include <algorithm>

#include "kernels/cuda/indexer_mma.cuh"
#include "kernels/cuda/mma.cuh"

namespace dil::cuda {
namespace {

constexpr int kDi = 128;              // index head dim (V4, V4.1)
constexpr int kRowsPerCta = 128;      // key rows per CTA
constexpr int kWarps = 4;
constexpr int kKeyStride = kDi + 8;   // bf16 per staged key row: 272 B, conflict-free fragment loads
constexpr int kMaxHeads = 64;

struct MmaParams {
  const uint16_t* q;          // [T, Hi, 128] bf16
  const void* w;              // [T, Hi] f32 | bf16 (w_bf16)
  bool w_bf16;
  const uint16_t* keys;       // [R, 128] bf16, sequence s's rows at key_off[s]
  const int64_t* key_off;     // [n_seqs]
  const int32_t *tok_seq, *tok_pos;
  float* scores;              // [T, n_max]
  int Hi, ratio, n_max;
  // Reindex (V4.1): only the rows of these candidate blocks can be selected, so only they are
  // scored. cand [T, cand_topk] block ids (-1 skipped), blocks of cand_block rows.
  const int32_t* cand;
  int cand_topk, cand_block;
};

// Four consecutive values of a key row as BF16 bits: f32 rounded (exact for FP4-QDQ'd values),
// bf16 copied.
__device__ __forceinline__ ushort4 bf16x4(const float* row, int lane) {
  const float4 v = reinterpret_cast<const float4*>(row)[lane];
  return make_ushort4(bf16_bits(v.x), bf16_bits(v.y), bf16_bits(v.z), bf16_bits(v.w));
}
__device__ __forceinline__ ushort4 bf16x4(const bf16_t* row, int lane) {
  return reinterpret_cast<const ushort4*>(row)[lane];
}

// Keys of the step's sequences, gathered from the paged cache into one dense bf16 array:
// sequence s's rows [0, n_rows_s) at key_off[s]. grid (row tiles, n_seqs), one warp per row.
template <class TK>
__global__ void gather_keys_kernel(const TK* cache, int rpb, const int32_t* block_table, int max_blocks,
                                   const int32_t* start_pos, const int32_t* len, int ratio, const int64_t* key_off,
                                   uint16_t* keys) {
  int s = blockIdx.y;
  int n_rows = (start_pos[s] + len[s]) / ratio;
  int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
  if (r >= n_rows) return;
  int b = block_table[s * max_blocks + r / rpb];
  reinterpret_cast<ushort4*>(keys + (key_off[s] + r) * kDi)[lane] = bf16x4(cache + (int64_t(b) * rpb + r % rpb) * kDi, lane);
}

template <int MT>
__global__ void __launch_bounds__(kWarps * 32) idx_score_mma_kernel(MmaParams P) {
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* ks = reinterpret_cast<uint16_t*>(smem);                                   // [128][kKeyStride] bf16
  double* terms = reinterpret_cast<double*>(smem + kRowsPerCta * kKeyStride * 2);     // [128][MT*16 + 1]
  float* ws = reinterpret_cast<float*>(terms + kRowsPerCta * (MT * 16 + 1));          // [MT*16]
  int* row_of = reinterpret_cast<int*>(ws + MT * 16);                                  // [128] row or -1
  constexpr int Hp = MT * 16, TS = Hp + 1;
  const int t = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, tig = lane & 3;
  const int seq = P.tok_seq[t];
  const int n_vis = (P.tok_pos[t] + 1) / P.ratio;
  if (!P.cand && int(blockIdx.x) * kRowsPerCta >= n_vis) return;
  // The tile's rows: 128 consecutive ones, or the rows of 128 / cand_block candidate blocks.
  for (int lr = threadIdx.x; lr < kRowsPerCta; lr += blockDim.x) {
    int r = -1;
    if (P.cand) {
      const int j = blockIdx.x * (kRowsPerCta / P.cand_block) + lr / P.cand_block;
      const int b = j < P.cand_topk ? P.cand[int64_t(t) * P.cand_topk + j] : -1;
      if (b >= 0) r = b * P.cand_block + lr % P.cand_block;
    } else {
      r = blockIdx.x * kRowsPerCta + lr;
    }
    row_of[lr] = r < n_vis ? r : -1;
  }
  __syncthreads();

  // Stage the tile's keys (16 B per thread per step; absent rows are zero) and the weights.
  const uint16_t* kg = P.keys + P.key_off[seq] * kDi;
  for (int i = threadIdx.x; i < kRowsPerCta * (kDi / 8); i += blockDim.x) {
    int r = i / (kDi / 8), c = i % (kDi / 8);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row_of[r] >= 0) v = reinterpret_cast<const uint4*>(kg + int64_t(row_of[r]) * kDi)[c];
    *reinterpret_cast<uint4*>(ks + r * kKeyStride + c * 8) = v;
  }
  for (int h = threadIdx.x; h < Hp; h += blockDim.x) {
    const int64_t i = int64_t(t) * P.Hi + h;
    ws[h] = h >= P.Hi ? 0.f
            : P.w_bf16 ? d_bf16_to_f32(static_cast<const uint16_t*>(P.w)[i])
                       : static_cast<const float*>(P.w)[i];
  }

  // This warp's q fragments: m-tile mt (heads mt*16 ..), 8 k-steps of 16 dims, m16n8k16 A layout.
  const int mt = warp % MT;
  uint32_t qa[8][4];
  {
    const int h0 = mt * 16 + g, h1 = h0 + 8;
    const uint32_t* q0 = reinterpret_cast<const uint32_t*>(P.q + (int64_t(t) * P.Hi + h0) * kDi);
    const uint32_t* q1 = reinterpret_cast<const uint32_t*>(P.q + (int64_t(t) * P.Hi + h1) * kDi);
    const bool v0 = h0 < P.Hi, v1 = h1 < P.Hi;
#pragma unroll
    for (int ks16 = 0; ks16 < 8; ++ks16) {
      const int c = ks16 * 8 + tig;  // 32-bit word = two bf16 at dims 2c, 2c+1
      qa[ks16][0] = v0 ? q0[c] : 0u;
      qa[ks16][1] = v1 ? q1[c] : 0u;
      qa[ks16][2] = v0 ? q0[c + 4] : 0u;
      qa[ks16][3] = v1 ? q1[c + 4] : 0u;
    }
  }
  __syncthreads();

  const int hA = mt * 16 + g, hB = hA + 8;
  const double wA = double(ws[hA]), wB = double(ws[hB]);
  for (int nt = warp / MT; nt < kRowsPerCta / 8; nt += kWarps / MT) {
    // acc[b][i]: 32-dim block b's partial dot for (head hA|hB, key 2*tig|2*tig+1) of n-tile nt.
    float acc[4][4];
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      acc[b][0] = acc[b][1] = acc[b][2] = acc[b][3] = 0.f;
      const uint32_t* kr = reinterpret_cast<const uint32_t*>(ks + (nt * 8 + g) * kKeyStride);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int ks16 = b * 2 + half, c = ks16 * 8 + tig;
        mma_bf16(acc[b], qa[ks16], kr[c], kr[c + 4]);
      }
    }
    // Exact dots in double (block order), then the reference's per-head term.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      double dot = double(acc[0][i]);
      dot = __dadd_rn(dot, double(acc[1][i]));
      dot = __dadd_rn(dot, double(acc[2][i]));
      dot = __dadd_rn(dot, double(acc[3][i]));
      const int key = nt * 8 + tig * 2 + (i & 1), h = (i < 2) ? hA : hB;
      const double wh = (i < 2) ? wA : wB;
      terms[key * TS + h] = __dmul_rn(wh, fmax(dot, 0.0));
    }
  }
  __syncthreads();
  // Sum over heads in ascending order, one thread per key row.
  for (int k = threadIdx.x; k < kRowsPerCta; k += blockDim.x) {
    if (row_of[k] < 0) continue;
    double s = 0.0;
    const double* tk = terms + k * TS;
    for (int h = 0; h < P.Hi; ++h) s = __dadd_rn(s, tk[h]);
    P.scores[int64_t(t) * P.n_max + row_of[k]] = __double2float_rn(s);
  }
}

template <int MT>
size_t smem_bytes() {
  return size_t(kRowsPerCta) * kKeyStride * 2 + size_t(kRowsPerCta) * (MT * 16 + 1) * 8 + size_t(MT) * 16 * 4 +
         size_t(kRowsPerCta) * 4;
}

template <int MT>
void launch_scores(Ctx& c, const MmaParams& P, int T) {
  const size_t sm = smem_bytes<MT>();
  DIL_CUDA(cudaFuncSetAttribute(idx_score_mma_kernel<MT>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(sm)));
  const int64_t rows = P.cand ? int64_t(P.cand_topk) * P.cand_block : P.n_max;
  dim3 grid(unsigned(ceil_div(rows, kRowsPerCta)), unsigned(T));
  idx_score_mma_kernel<MT><<<grid, kWarps * 32, sm, c.stream>>>(P);
  DIL_LAUNCH_CHECK("idx_score_mma_kernel");
}

}  // namespace

// The shapes the kernel has (registry.cpp "mma_exact" states the same): head dim kDi, and
// MT = Hi/16 m-tiles dividing the CTA's warps (V4: 64 heads, V4.1: 32, fixtures: 16).
bool indexer_mma_shape(const IndexerArgs& a) {
  const int64_t Hi = a.q.size(1), di = a.q.size(2);
  return di == kDi && (Hi == 16 || Hi == 32 || Hi == kMaxHeads);
}

void indexer_scores_mma(Ctx& c, const IndexerArgs& a, const StepMeta& m, int n_max, float* scores) {
  const int T = int(a.q.size(0)), Hi = int(a.q.size(1));
  DIL_CHECK(indexer_mma_shape(a), "indexer_scores_mma: unsupported q ", a.q.shape_str());
  DIL_CHECK(a.keys.size(2) == kDi, "indexer_scores_mma: keys ", a.keys.shape_str());
  DIL_CHECK(a.w.dtype == DType::F32 || a.w.dtype == DType::BF16, "indexer_scores_mma: w ", dtype_name(a.w.dtype));
  // q as BF16: bf16 read in place; f32 rounded (exact for FP4-QDQ'd values).
  const int64_t nq = int64_t(T) * Hi * kDi;
  Buffer qb;
  const uint16_t* q16 = nullptr;  // [T, Hi, 128] bf16
  with_act(a.q, "indexer q", [&](auto tq) {
    using TQ = decltype(tq);
    if constexpr (std::is_same_v<TQ, bf16_t>) {
      q16 = a.q.ptr<const uint16_t>();
    } else {
      qb = c.scratch(size_t(nq) * 2);
      convert(c, a.q.ptr<const float>(), static_cast<bf16_t*>(qb.data()), nq);
      q16 = static_cast<const uint16_t*>(qb.data());
    }
  });
  // Keys: each step sequence's visible rows, densely, at host-computed offsets.
  std::vector<int64_t> off(size_t(m.n_seqs));
  int64_t total = 0;
  int max_rows = 0;
  for (int s = 0; s < m.n_seqs; ++s) {
    const int n_rows = (m.h_start_pos[s] + m.h_len[s]) / a.ratio;
    off[s] = total;
    total += n_rows;
    max_rows = std::max(max_rows, n_rows);
  }
  Buffer ob = c.scratch(off.size() * sizeof(int64_t));
  DIL_CUDA(cudaMemcpyAsync(ob.data(), off.data(), off.size() * sizeof(int64_t), cudaMemcpyHostToDevice, c.stream));
  Buffer kb = c.scratch(size_t(std::max<int64_t>(total, 1)) * kDi * 2);
  if (total > 0) {
    dim3 gk(unsigned(ceil_div(max_rows, 8)), unsigned(m.n_seqs));
    with_act(a.keys, "indexer keys", [&](auto tk) {
      using TK = decltype(tk);
      gather_keys_kernel<TK><<<gk, 256, 0, c.stream>>>(a.keys.ptr<const TK>(), a.rows_per_block,
                                                       m.block_table.ptr<int32_t>(), m.max_blocks,
                                                       m.start_pos.ptr<int32_t>(), m.len.ptr<int32_t>(), a.ratio,
                                                       static_cast<const int64_t*>(ob.data()),
                                                       static_cast<uint16_t*>(kb.data()));
    });
    DIL_LAUNCH_CHECK("gather_keys_kernel");
  }
  MmaParams P{};
  P.q = q16;
  P.w = a.w.data;
  P.w_bf16 = a.w.dtype == DType::BF16;
  P.keys = static_cast<const uint16_t*>(kb.data());
  P.key_off = static_cast<const int64_t*>(ob.data());
  P.tok_seq = m.tok_seq.ptr<int32_t>();
  P.tok_pos = m.tok_pos.ptr<int32_t>();
  P.scores = scores;
  P.Hi = Hi;
  P.ratio = a.ratio;
  P.n_max = n_max;
  if (!a.cand_in.empty() && kRowsPerCta % a.cand_block == 0) {  // Reindex: candidate rows only
    P.cand = a.cand_in.ptr<int32_t>();
    P.cand_topk = a.cand_topk;
    P.cand_block = a.cand_block;
  }
  switch (Hi / 16) {
    case 1: launch_scores<1>(c, P, T); break;
    case 2: launch_scores<2>(c, P, T); break;
    default: launch_scores<4>(c, P, T); break;
  }
}

}  // namespace dil::cuda
