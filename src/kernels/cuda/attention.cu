// Sparse attention with a sink over the window rows plus compressed rows (all visible ones,
// or those an indexer selected), reading KV rows by index; and the two cache writers (SWA
// ring, paged compressed rows). A correct first version: one block per (token, 8 heads),
// one warp per head, online softmax in fp32 over chunks of 16 rows staged in shared memory
// (the rows are shared by all heads: MQA), the 16 rows of a chunk processed together.
// docs/kernels.md says what a tensor-core version needs. Scores, the softmax and the weighted
// sum run in double (rows and q stay f32, their products are exact in double), so the result
// is the reference's to a last-bit rounding. q, the rows and out are f32 or bf16 (one dtype,
// AttnArgs): the kernels are templates over its storage type; bf16 rows are widened exactly
// when staged, the output rounded once (after its f32 rounding, as the reference).
#include "kernels/cuda/attention_flash.cuh"
#include "kernels/cuda/attention_mma.cuh"

namespace dil::cuda {
namespace {

constexpr int kHeadsPerBlock = 8, kChunk = 16, kMaxD = 512;

template <class T>
__global__ void __launch_bounds__(256) sparse_attn_kernel(AttnParams<T> P) {
  __shared__ __align__(16) float rows[kChunk][kMaxD];
  __shared__ KvRef ptrs[kChunk];
  const int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int h = blockIdx.y * kHeadsPerBlock + warp;
  const int s = P.tok_seq[t], p = P.tok_pos[t];
  int pw;  // the window's last position (p unless non-causal)
  const int n_win = attn_window(P, s, p, &pw);
  const int n_comp = P.ratio > 0 ? (P.comp_idx ? P.K : (p + 1) / P.ratio) : 0;
  const int n_cand = n_win + n_comp;
  const int dl = P.d / 32;  // values per lane
  float q[kMaxD / 32];
  double acc[kMaxD / 32];
#pragma unroll
  for (int i = 0; i < kMaxD / 32; ++i) {
    q[i] = (h < P.H && i < dl) ? ld_act(P.q[(int64_t(t) * P.H + h) * P.d + lane + 32 * i]) : 0.f;
    acc[i] = 0.0;
  }
  double m = -INFINITY, l = 0.0;
  for (int c0 = 0; c0 < n_cand; c0 += kChunk) {
    __syncthreads();
    if (threadIdx.x < kChunk) {
      int c = c0 + threadIdx.x;
      ptrs[threadIdx.x] = c < n_cand ? attn_row(P, t, s, pw, n_win, c) : KvRef{nullptr, 0};
    }
    __syncthreads();
    const int d4 = P.d / 4;  // 4 values per load (rows are d*sizeof(T) >= 64 bytes apart, aligned)
    for (int i = threadIdx.x; i < kChunk * d4; i += blockDim.x) {
      int r = i / d4, k = i % d4;
      reinterpret_cast<float4*>(&rows[r][0])[k] = attn_row4(P, ptrs[r], k);
    }
    __syncthreads();
    if (h >= P.H) continue;
    // The chunk's 16 rows at once, so that their independent dot products, warp reductions
    // and exponentials overlap (one row at a time left the warp waiting on a chain of
    // shuffles and a double exp per row). Same double arithmetic: one rescale per chunk.
    double sc[kChunk];
#pragma unroll
    for (int r = 0; r < kChunk; ++r) {
      double dot = 0.0;
#pragma unroll
      for (int i = 0; i < kMaxD / 32; ++i)
        if (i < dl) dot += double(q[i]) * double(rows[r][lane + 32 * i]);
      sc[r] = dot;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
      for (int r = 0; r < kChunk; ++r) sc[r] += __shfl_xor_sync(0xffffffffu, sc[r], o);
    }
    double mn = m;
#pragma unroll
    for (int r = 0; r < kChunk; ++r) {
      sc[r] = ptrs[r].p ? sc[r] * double(P.scale) : -INFINITY;
      mn = fmax(mn, sc[r]);
    }
    if (mn == -INFINITY) continue;  // no row of this chunk is visible (and none before)
    const double corr = exp(m - mn);  // m = -inf before the first row: corr = 0, acc and l are 0
    double e_sum = 0.0;
#pragma unroll
    for (int r = 0; r < kChunk; ++r) {
      sc[r] = ptrs[r].p ? exp(sc[r] - mn) : 0.0;
      e_sum += sc[r];
    }
    l = l * corr + e_sum;
#pragma unroll
    for (int i = 0; i < kMaxD / 32; ++i) {
      if (i >= dl) continue;
      double v = acc[i] * corr;
#pragma unroll
      for (int r = 0; r < kChunk; ++r) v += sc[r] * rows[r][lane + 32 * i];
      acc[i] = v;
    }
    m = mn;
  }
  if (h >= P.H) return;
  double sink = P.sink[h];
  double mf = fmax(m, sink);
  double a = l > 0.0 ? exp(m - mf) : 0.0;
  double denom = l * a + exp(sink - mf);
#pragma unroll
  for (int i = 0; i < kMaxD / 32; ++i)
    if (i < dl) st_act(P.out + (int64_t(t) * P.H + h) * P.d + lane + 32 * i, float(acc[i] * a / denom));
}

// Row copies (T: the rows' storage type; the ring and the cache hold the activation dtype).
template <class T>
__global__ void ring_write_kernel(const T* kv_new, T* ring, const int32_t* tok_seq, const int32_t* tok_pos,
                                  const int32_t* start_pos, const int32_t* len, const int32_t* slot, int W, int d) {
  pdl_enter();
  int t = blockIdx.x;
  int s = tok_seq[t], p = tok_pos[t];
  if (p < start_pos[s] + len[s] - W) return;  // a later token of this step takes the slot
  T* dst = ring + (int64_t(slot[s]) * W + p % W) * d;
  for (int k = threadIdx.x; k < d; k += blockDim.x) dst[k] = kv_new[int64_t(t) * d + k];
}

template <class T>
__global__ void paged_write_kernel(const T* rows, T* cache, int rpb, int d, const int32_t* seq,
                                   const int32_t* row, const int32_t* block_table, int max_blocks) {
  pdl_enter();
  int e = blockIdx.x;
  int r = row[e];
  int b = block_table[seq[e] * max_blocks + r / rpb];
  if (b < 0) return;
  T* dst = cache + (int64_t(b) * rpb + r % rpb) * d;
  for (int k = threadIdx.x; k < d; k += blockDim.x) dst[k] = rows[int64_t(e) * d + k];
}

// The same into packed rows (fmt, rb bytes each): the row widened to f32 in shared memory, then
// one warp per scale block quantizes it (kv_pack_block: the QDQ formulas, so a row that was
// QDQ'd at the official point is stored exactly). blockDim.x: a multiple of 32.
template <class T>
__device__ __forceinline__ void pack_row_block(const T* src, uint8_t* dst, const KvRow& fmt) {
  __shared__ float x[kMaxD];
  for (int k = threadIdx.x; k < fmt.d; k += blockDim.x) x[k] = ld_act(src[k]);
  __syncthreads();
  const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int b = warp; b < kv_scale_blocks(fmt); b += nw) kv_pack_block(fmt, x, b, dst, threadIdx.x & 31);
}
template <class T>
__global__ void ring_write_packed_kernel(const T* kv_new, uint8_t* ring, KvRow fmt, int64_t rb, const int32_t* tok_seq,
                                         const int32_t* tok_pos, const int32_t* start_pos, const int32_t* len,
                                         const int32_t* slot, int W) {
  pdl_enter();
  const int t = blockIdx.x;
  const int s = tok_seq[t], p = tok_pos[t];
  if (p < start_pos[s] + len[s] - W) return;  // the whole block returns: no barrier is left waiting
  pack_row_block(kv_new + int64_t(t) * fmt.d, ring + (int64_t(slot[s]) * W + p % W) * rb, fmt);
}
template <class T>
__global__ void paged_write_packed_kernel(const T* rows, uint8_t* cache, KvRow fmt, int64_t rb, int rpb,
                                          const int32_t* seq, const int32_t* row, const int32_t* block_table,
                                          int max_blocks) {
  pdl_enter();
  const int e = blockIdx.x, r = row[e];
  const int b = block_table[seq[e] * max_blocks + r / rpb];
  if (b < 0) return;
  pack_row_block(rows + int64_t(e) * fmt.d, cache + (int64_t(b) * rpb + r % rpb) * rb, fmt);
}

}  // namespace

template <class T>
AttnParams<T> make_attn_params(const AttnArgs& a, const StepMeta& m) {
  AttnParams<T> P{};
  const int T_tokens = int(a.q.size(0));
  P.H = int(a.q.size(1));
  P.d = int(a.q.size(2));
  DIL_CHECK(P.d % 32 == 0 && P.d <= kMaxD, "sparse_attention: head dim ", P.d);
  DIL_CHECK(a.kv_new.size(0) == T_tokens && a.kv_new.size(1) == P.d, "sparse_attention: kv_new ", a.kv_new.shape_str());
  DIL_CHECK(a.out.numel() == a.q.numel(), "sparse_attention: out ", a.out.shape_str(), " q ", a.q.shape_str());
  DIL_CHECK(a.sink.numel() == P.H, "sparse_attention: sink ", a.sink.shape_str(), " for ", P.H, " heads");
  check_f32(a.sink, "sparse_attention sink");
  // AttnArgs: q, kv_new, ring, comp and out share one activation dtype; ring and comp may hold
  // packed rows instead (U8 [.., .., row bytes], AttnArgs::ring_pack / comp_pack).
  for (const Tensor* t : {&a.kv_new, &a.out})
    DIL_CHECK(t->dtype == a.q.dtype, "sparse_attention: q is ", dtype_name(a.q.dtype), " but kv_new or out is ",
              dtype_name(t->dtype), " (one activation dtype)");
  auto rows = [&](const Tensor& c, const kvpack::RowShape& pack, const char* what, const uint8_t*& ptr, int64_t& rb,
                  KvRow& fmt) {
    ptr = nullptr;
    rb = int64_t(P.d) * int64_t(sizeof(T));
    fmt = KvRow{};
    fmt.d = 0;
    if (c.empty()) return;
    DIL_CHECK(c.ndim == 3, "sparse_attention: ", what, " ", c.shape_str());
    if (pack.packed()) {
      DIL_CHECK(c.dtype == DType::U8 && pack.d == P.d && c.size(2) == int64_t(kvpack::row_bytes(pack)),
                "sparse_attention: packed ", what, " ", c.shape_str(), " ", dtype_name(c.dtype), " for rows of ", P.d);
      // The formats the kernels decode (flash_bf16's in-place conversion knows these three), and
      // the 8-byte alignment the head-dim-512 kernels' cp.async and vector loads need (fp64 reads
      // bytes: the tiny fixtures' 132-byte V4.1 window rows are fine there).
      DIL_CHECK(pack.format == kvpack::Format::V4Row || pack.format == kvpack::Format::Fp8B32 ||
                    pack.format == kvpack::Format::Fp4E4m3B16,
                "sparse_attention: packed ", what, " rows in a format the attention kernels do not read");
      DIL_CHECK(P.d != 512 || (reinterpret_cast<uintptr_t>(c.data) % 8 == 0 && c.size(2) % 8 == 0),
                "sparse_attention: packed ", what, " rows of 512 values must be 8-byte aligned");
      fmt = KvRow{pack.format, pack.d, pack.rope};
      rb = c.size(2);
    } else {
      DIL_CHECK(c.dtype == a.q.dtype && c.size(2) == P.d, "sparse_attention: q is ", dtype_name(a.q.dtype), " but ",
                what, " is ", dtype_name(c.dtype), " ", c.shape_str(), " (one activation dtype)");
    }
    ptr = static_cast<const uint8_t*>(c.data);
  };
  P.q = a.q.ptr<const T>();
  P.kv_new = a.kv_new.ptr<const T>();
  rows(a.ring, a.ring_pack, "ring", P.ring, P.ring_rb, P.ring_fmt);
  P.ring_len = a.ring.empty() ? a.window : int(a.ring.size(1));
  rows(a.comp, a.comp_pack, "comp", P.comp, P.comp_rb, P.comp_fmt);
  P.ratio = (a.comp.empty() || a.comp_ratio <= 0) ? 0 : a.comp_ratio;
  P.rpb = a.rows_per_block;
  P.comp_idx = (P.ratio && !a.comp_idx.empty()) ? a.comp_idx.ptr<int32_t>() : nullptr;
  P.K = P.comp_idx ? int(a.comp_idx.size(1)) : 0;
  P.sink = a.sink.ptr<float>();
  P.out = a.out.ptr<T>();
  P.scale = a.scale;
  P.W = a.window;
  P.q_start = m.q_start.ptr<int32_t>();
  P.start_pos = m.start_pos.ptr<int32_t>();
  P.slot = m.slot.ptr<int32_t>();
  P.tok_pos = m.tok_pos.ptr<int32_t>();
  P.tok_seq = m.tok_seq.ptr<int32_t>();
  P.block_table = m.block_table.empty() ? nullptr : m.block_table.ptr<int32_t>();
  P.max_blocks = m.max_blocks;
  P.len = m.len.ptr<int32_t>();
  P.non_causal = a.non_causal ? 1 : 0;
  DIL_CHECK(!a.non_causal || P.ratio == 0, "sparse_attention: non-causal attention has no compressed rows");
  DIL_CHECK(!P.ratio || (P.block_table && P.rpb > 0), "sparse_attention: compressed rows need a block table");
  return P;
}

void sparse_attention(Ctx& c, const AttnArgs& a, const StepMeta& m, const std::string& impl) {
  const int T_tokens = int(a.q.size(0));
  with_act(a.q, "sparse_attention q", [&](auto tq) {
    using T = decltype(tq);
    const AttnParams<T> P = make_attn_params<T>(a, m);
    if (T_tokens == 0) return;
    if (impl == "flash_bf16" || impl == "wgmma_bf16") {  // fast: CTA per (token, 64 heads), rows gathered once
      if constexpr (std::is_same_v<T, bf16_t>) {
        sparse_attention_flash(c, P, a, m, T_tokens, 0, impl == "wgmma_bf16" ? FlashKernel::Wgmma : FlashKernel::Mma);
        return;
      }
      DIL_FAIL("sparse_attention ", impl, ": ", dtype_name(a.q.dtype), " activations (bf16 only)");
    }
    if (impl == "mma_split_bf16" || impl == "mma_bf16") {
      // official: f32 operands split hi + lo; fast: BF16 operands and probabilities.
      constexpr bool kBf16 = std::is_same_v<T, bf16_t>;
      DIL_CHECK((impl == "mma_bf16") == kBf16, "sparse_attention ", impl, ": ", dtype_name(a.q.dtype), " activations");
      sparse_attention_mma(c, P, T_tokens);
      return;
    }
    DIL_CHECK(impl == "fp64", "sparse_attention: implementation '", impl, "' has no launcher");
    dim3 grid(unsigned(T_tokens), unsigned(ceil_div(P.H, kHeadsPerBlock)));
    sparse_attn_kernel<T><<<grid, 256, 0, c.stream>>>(P);
    DIL_LAUNCH_CHECK("sparse_attn_kernel");
  });
}

void ring_write(Ctx& c, const Tensor& kv_new, Tensor ring, const StepMeta& m, const kvpack::RowShape& pack) {
  int n_tok = int(kv_new.size(0)), d = int(kv_new.size(1));
  if (pack.packed()) {
    DIL_CHECK(ring.dtype == DType::U8 && ring.ndim == 3 && pack.d == d && d <= kMaxD &&
                  ring.size(2) == int64_t(kvpack::row_bytes(pack)),
              "ring_write: packed ring ", ring.shape_str(), " ", dtype_name(ring.dtype), " kv ", kv_new.shape_str());
  } else {
    DIL_CHECK(kv_new.dtype == ring.dtype, "ring_write: ", dtype_name(kv_new.dtype), " rows into a ",
              dtype_name(ring.dtype), " ring");
    DIL_CHECK(ring.ndim == 3 && ring.size(2) == d, "ring_write: ring ", ring.shape_str(), " kv ", kv_new.shape_str());
  }
  if (n_tok == 0) return;
  with_act(kv_new, "ring_write kv_new", [&](auto tr) {
    using T = decltype(tr);
    if (pack.packed()) {
      launch_pdl(c, "ring_write_packed_kernel", ring_write_packed_kernel<T>, dim3(unsigned(n_tok)), dim3(128), 0,
          kv_new.ptr<const T>(), ring.ptr<uint8_t>(), KvRow{pack.format, pack.d, pack.rope}, ring.size(2),
          m.tok_seq.ptr<int32_t>(), m.tok_pos.ptr<int32_t>(), m.start_pos.ptr<int32_t>(), m.len.ptr<int32_t>(),
          m.slot.ptr<int32_t>(), int(ring.size(1)));
      return;
    }
    launch_pdl(c, "ring_write_kernel", ring_write_kernel<T>, dim3(unsigned(n_tok)), dim3(128), 0, kv_new.ptr<const T>(), ring.ptr<T>(),
                                                            m.tok_seq.ptr<int32_t>(), m.tok_pos.ptr<int32_t>(),
                                                            m.start_pos.ptr<int32_t>(), m.len.ptr<int32_t>(),
                                                            m.slot.ptr<int32_t>(), int(ring.size(1)), d);
  });
}

void paged_write(Ctx& c, const Tensor& rows, Tensor cache, int rows_per_block, const EmitPlan& plan,
                 const StepMeta& m, const kvpack::RowShape& pack) {
  if (plan.n == 0) return;
  int d = int(rows.size(-1));
  DIL_CHECK(cache.ndim == 3 && cache.size(1) == rows_per_block && rows.numel() >= int64_t(plan.n) * d,
            "paged_write: rows ", rows.shape_str(), " cache ", cache.shape_str(), " rpb ", rows_per_block);
  if (pack.packed()) {
    DIL_CHECK(cache.dtype == DType::U8 && pack.d == d && d <= kMaxD && cache.size(2) == int64_t(kvpack::row_bytes(pack)),
              "paged_write: packed cache ", cache.shape_str(), " ", dtype_name(cache.dtype), " rows ", rows.shape_str());
  } else {
    DIL_CHECK(rows.dtype == cache.dtype, "paged_write: rows ", dtype_name(rows.dtype), " into a ",
              dtype_name(cache.dtype), " cache");
    DIL_CHECK(cache.size(2) == d, "paged_write: rows ", rows.shape_str(), " cache ", cache.shape_str());
  }
  with_act(rows, "paged_write rows", [&](auto tc) {
    using T = decltype(tc);
    if (pack.packed()) {
      launch_pdl(c, "paged_write_packed_kernel", paged_write_packed_kernel<T>, dim3(unsigned(plan.n)), dim3(128), 0,
          rows.ptr<const T>(), cache.ptr<uint8_t>(), KvRow{pack.format, pack.d, pack.rope}, cache.size(2),
          rows_per_block, plan.seq.ptr<int32_t>(), plan.row.ptr<int32_t>(), m.block_table.ptr<int32_t>(), m.max_blocks);
      return;
    }
    launch_pdl(c, "paged_write_kernel", paged_write_kernel<T>, dim3(unsigned(plan.n)), dim3(128), 0, rows.ptr<const T>(), cache.ptr<T>(), rows_per_block,
                                                                  d, plan.seq.ptr<int32_t>(), plan.row.ptr<int32_t>(),
                                                                  m.block_table.ptr<int32_t>(), m.max_blocks);
  });
}

}  // namespace dil::cuda
