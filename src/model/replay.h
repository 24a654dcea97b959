// Exact decoder replay (V4.1 CED, model-spec §4.1, §4.9; docs/architecture.md "Decoder replay"):
// which rows of a prefill chunk each layer has to compute so that the chunk's last-token
// logits and every state the next step reads (SWA rings, compressed rows, indexer keys,
// compressor state) equal the full forward's.
//
// Derivation. A layer's output at a position feeds only the next layer at that position (mHC
// streams, MoE and norms are per token); across positions a layer reads (a) its own SWA ring,
// the window [p-W+1, p] of its window rows, and (b) the compressed rows / indexer keys of its kv
// source. Let F be the last kv source of the config: every layer up to F must see every token
// (F's compressor and indexer keys are needed for every position, and its input is the output of
// the layers before it), but from F on (F's own attention and MoE included) a layer writes
// nothing a later position reads except its window rows. Working back from the last layer:
// the chunk needs the last layer's output at its last token only (the logits; a chunk without
// logits still computes that one row, which keeps every count >= 1), and every layer's window
// rows of the last W-1 tokens (the ring the next chunk or decode step reads). A layer whose
// output is needed at the last `out` tokens reads window rows of the last out+W-1 tokens, so
// with k = layers after L:
//     out(L) = min(n, 1 + (W-1)*k)      rows running attention + MoE (and the indexer query)
//     kv(L)  = min(n, 1 + (W-1)*(k+1))  rows writing their window row  (= out(L-1))
// for F <= L, and out = kv = n below F. The rows are always the chunk's trailing ones. The
// ratio boundaries of F's compressor add nothing: it runs on every token (its pending state and
// emitted rows are the full forward's), whatever the chunk boundaries. This is the exact form;
// DeepSeek's bounded replay (all decoder layers on the last W tokens, model-spec §4.9) truncates
// the windows of the early replayed queries and is approximate by design (not implemented).
//
// V4.1-Flash (40 layers, F = 20, W = 128): a 4,096-token chunk runs layers 0..19 on 4,096 rows,
// layer 20's attention + MoE on 2,414, layer 39 on 1 (sum over layers 20..39: 24,150 rows
// instead of 81,920).
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/model.h"

namespace dil {

// From the config alone: where replay may start.
struct ReplaySchedule {
  int first = -1;  // F: the last kv source (0 without any); -1: no layer may skip rows
  int n_layers = 0;
  int window = 128;
};
ReplaySchedule replay_schedule(const ModelConfig& cfg);

// Trailing rows of a chunk of n tokens layer L computes: x enter it (its input streams), kv
// write their window row, out run attention + MoE. n >= x >= kv >= out >= 1 for n >= 1.
struct ReplayRows {
  int x = 0, kv = 0, out = 0;
};
ReplayRows replay_rows(const ReplaySchedule& s, int L, int n);

// Per chunk, the rows [begin, end) of its tokens that a layer computes.
struct RowSpan {
  int32_t begin = 0, end = 0;
  int32_t size() const { return end - begin; }
  bool operator==(const RowSpan&) const = default;
};
using RowSpans = std::vector<RowSpan>;  // [n_seqs]

// The spans of one layer for every chunk of a step.
struct LayerSpans {
  RowSpans x, head, out;  // head: rows writing a window row without running attention (kv minus out)
  bool trims() const { return !(x == out); }
};

// The spans of every backbone layer in one step, [n_layers]. A chunk replays when `enabled`
// and it does not ask for every position's logits (all_logits: prompt logprobs, tools);
// otherwise every layer computes all of its rows.
std::vector<LayerSpans> plan_replay(const ReplaySchedule& s, const StepBatch& batch, bool enabled);

// The rows `spans` of the step `m` as a step of their own: chunk c keeps its slot and block
// table and starts at start_pos + begin; chunks without rows are left out. Device copies go to
// `storage`.
StepMeta sub_meta(const StepMeta& m, const RowSpans& spans, Backend& be, std::vector<Buffer>* storage);

// dst's rows (laid out by `to`, chunk after chunk) <- the same tokens' rows of src (laid out by
// `from`); every span of `to` lies inside the same chunk's span of `from`. Contiguous runs are
// copied at once. src and dst: [rows, ...] of one dtype, distinct buffers.
void gather_rows(Backend& be, const Tensor& src, const RowSpans& from, Tensor dst, const RowSpans& to);

int64_t total_rows(const RowSpans& spans);

}  // namespace dil
