// Bytes of per-request cache state for a model configuration, from model-spec §3.9 (V4) and
// §4.9 (V4.1). Header-only so the model (Model::cache_spec) and the runtime's kv-report can
// both use it without a link dependency.
//
// Two storage formats:
// - F32: what the CPU reference keeps (every row and state value fp32, the shapes of the
//   Backend args: ring [slots, W, d], comp [blocks, rows, d], keys [blocks, rows, di],
//   compressor state kv+score [slots, rows, c*dc]).
// - Official: the packed formats of the official kernels (FlashMLA / DeepGEMM):
//   V4 rows 448 e4m3 + 64 bf16 rope + 7 ue8m0 + 1 pad = 584 B (vLLM fp8_ds_mla), indexer keys
//   e2m1 + ue8m0 per 32 = 68 B; V4.1 SWA rows e4m3 + ue8m0 per 32 = 528 B, global rows e2m1 +
//   E4M3 per 16 = 288 B, indexer keys 68 B. Compressor state stays fp32 in both.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/check.h"
#include "core/kv_packed.h"
#include "model/config.h"
#include "model/model.h"

namespace dil {

enum class KvFormat { F32, Official };

struct KvLayout {
  CacheSpec spec;                  // bytes_per_block (grows with length), bytes_per_slot (fixed)
  double global_bytes_per_token = 0;  // spec.bytes_per_block / block_tokens
  size_t swa_bytes_per_slot = 0;      // sliding-window rings, every layer (+ MTP/DSpark)
  size_t compressor_bytes_per_slot = 0;  // compressor partial state (main + indexer)
  size_t history_bytes_per_slot = 0;     // Engram token history (V4.1)
  int swa_layers = 0, kv_layers = 0;  // layers with a ring / with compressed rows
};

namespace kv_layout_detail {
inline size_t swa_row(const ModelConfig& c, KvFormat f) {
  const size_t d = size_t(c.head_dim), rope = size_t(c.rope_dims), nope = d - rope;
  if (f == KvFormat::F32) return d * 4;
  if (c.arch == Arch::V41) return d + d / 32;                // e4m3 + ue8m0 per 32 (rope included)
  return (nope + 2 * rope + nope / 64 + 7) / 8 * 8;          // e4m3 nope + bf16 rope + ue8m0 per 64, 8-aligned
}
inline size_t global_row(const ModelConfig& c, KvFormat f) {
  const size_t d = size_t(c.head_dim);
  if (f == KvFormat::F32) return d * 4;
  if (c.arch == Arch::V41) return d / 2 + d / 16;            // e2m1 + E4M3 per 16
  return swa_row(c, f);                                      // V4: same row format as the window
}
inline size_t index_row(const ModelConfig& c, KvFormat f) {
  const size_t di = size_t(c.index_head_dim);
  return f == KvFormat::F32 ? di * 4 : di / 2 + di / 32;     // e2m1 + ue8m0 per 32
}
}  // namespace kv_layout_detail

// The row formats of a layout: the official packed rows, or plain rows (F32: every shape
// unpacked, d == 0). Their sizes are the kv_layout_detail rows (checked).
struct KvRowShapes {
  kvpack::RowShape swa, global, index;  // window rings; compressed rows; indexer keys
};
inline KvRowShapes kv_row_shapes(const ModelConfig& c, KvFormat f) {
  using namespace kv_layout_detail;
  KvRowShapes r;
  if (f == KvFormat::F32) return r;
  const int d = c.head_dim, di = c.index_head_dim;
  if (c.arch == Arch::V41) {
    r.swa = {kvpack::Format::Fp8B32, d, 0};
    r.global = {kvpack::Format::Fp4E4m3B16, d, 0};
  } else {
    r.swa = r.global = {kvpack::Format::V4Row, d, c.rope_dims};
  }
  r.index = {kvpack::Format::Fp4B32, di, 0};
  DIL_CHECK(kvpack::row_bytes(r.swa) == swa_row(c, f) && kvpack::row_bytes(r.global) == global_row(c, f) &&
                kvpack::row_bytes(r.index) == index_row(c, f),
            "packed row sizes differ from kv_layout's");
  return r;
}

// The cache layout of a numerics mode (docs/architecture.md "Numerics modes and the kernel
// plan"): fast numerics store the official packed rows (the values the QDQ ops leave, so
// results do not change); reference keeps f32 rows; official keeps its f32 rows (the oracle
// keeps what the f32 run computes: V4's 64 rope dims would round to bf16 in the packed row).
inline KvFormat kv_format(Numerics n) { return n == Numerics::Fast ? KvFormat::Official : KvFormat::F32; }
// What a model stores: the mode's layout where the backend reads packed rows, else plain rows.
inline KvRowShapes stored_kv_rows(const ModelConfig& c, Numerics n, const Backend& be, bool plain_kv) {
  const bool packed = kv_format(n) == KvFormat::Official && be.reads_packed_kv() && !plain_kv;
  return kv_row_shapes(c, packed ? KvFormat::Official : KvFormat::F32);
}
// Bytes of one row of width d: packed, or d values of the plain dtype.
inline size_t kv_row_bytes(const kvpack::RowShape& p, int64_t d, DType plain) {
  return p.packed() ? kvpack::row_bytes(p) : size_t(d) * dtype_size(plain);
}
// A cache buffer as [n, rows, d] rows of `plain`, or U8 [n, rows, row_bytes] packed rows.
inline Tensor kv_tensor(const Buffer& b, int64_t n, int64_t rows, int64_t d, const kvpack::RowShape& p, DType plain) {
  if (p.packed()) return b.as(DType::U8, {n, rows, int64_t(kvpack::row_bytes(p))});
  return b.as(plain, {n, rows, d});
}

inline KvLayout kv_layout(const ModelConfig& c, int block_tokens, KvFormat f) {
  using namespace kv_layout_detail;
  KvLayout k;
  k.spec.block_tokens = block_tokens;
  const size_t W = size_t(c.window), d = size_t(c.head_dim), di = size_t(c.index_head_dim);
  const size_t bt = size_t(block_tokens);
  // Every backbone layer and every MTP / DSpark block keeps a window ring.
  k.swa_layers = c.n_layers + c.n_mtp;
  k.swa_bytes_per_slot = size_t(k.swa_layers) * W * swa_row(c, f);
  for (int l = 0; l < c.n_layers; ++l) {
    const int m = c.ratio(l);
    if (m == 0) continue;
    DIL_CHECK(block_tokens % m == 0, "block_tokens ", block_tokens, " not a multiple of ratio ", m);
    const size_t rows = bt / size_t(m);  // compressed rows per block
    if (c.arch == Arch::V4) {
      ++k.kv_layers;
      k.spec.bytes_per_block += rows * global_row(c, f);
      if (m == 4) {
        // CSA: overlapping compressor, state [8, 2*d] kv + score; indexer keys and the
        // indexer's own compressor state [8, 2*di].
        k.spec.bytes_per_block += rows * index_row(c, f);
        k.compressor_bytes_per_slot += 2 * 8 * (2 * d) * 4 + 2 * 8 * (2 * di) * 4;
      } else {
        k.compressor_bytes_per_slot += 2 * size_t(m) * d * 4;  // HCA: state [m, d] kv + score
      }
    } else {
      if (c.role(l) != LayerRole::Full) continue;  // Reuse / Reindex layers read their source's rows
      ++k.kv_layers;
      k.spec.bytes_per_block += rows * (global_row(c, f) + index_row(c, f));
      // Ratio 2: a and g of the pending tokens (official: the one unpaired token; F32: a
      // [m, d] ring like V4's). Ratio 1: no pending state.
      if (m > 1) k.compressor_bytes_per_slot += 2 * (f == KvFormat::F32 ? size_t(m) : size_t(m - 1)) * d * 4;
    }
  }
  if (!c.engram_layers.empty()) {
    // The last max_ngram-1 token ids: int32 each (F32, as V41Model keeps them), plus one
    // image-span flag byte each in the official accounting.
    const size_t n = size_t(c.engram_max_ngram > 0 ? c.engram_max_ngram - 1 : 0);
    k.history_bytes_per_slot = n * (f == KvFormat::F32 ? 4 : 5);
  }
  k.spec.bytes_per_slot = k.swa_bytes_per_slot + k.compressor_bytes_per_slot + k.history_bytes_per_slot;
  k.global_bytes_per_token = double(k.spec.bytes_per_block) / double(block_tokens);
  return k;
}

}  // namespace dil
