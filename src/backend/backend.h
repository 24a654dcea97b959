// The op interface. The model (src/model) is written once against Backend&; the CPU backend
// (src/kernels/cpu, the executable specification) and the CUDA backend (src/kernels/cuda)
// implement it. One args struct per op family where the argument list is long.
//
// Conventions
// - Activations are f32 (reference, official numerics) or bf16 (fast numerics: the dtypes of
//   DeepSeek's inference/model.py) on the backend's device, row-major, first dim = tokens of the
//   step. An op documents which of its tensors may be bf16 ("f32|bf16"); it computes as on the
//   f32 values (bf16 widens exactly) and rounds each output once to its tensor's dtype (RNE).
// - Weights are in the checkpoint's own formats (Weight below); each op dequantizes by the
//   official formulas (model-spec §2.1).
// - Ops never synchronize with the host; everything data-dependent stays on the device.
// - Exact top-k ties are broken towards the lowest index (design.md, Numerics).
#pragma once
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/plan.h"
#include "backend/sampling.h"
#include "core/kv_packed.h"
#include "core/tensor.h"

namespace dil {

// A checkpoint matrix as stored, [out, in].
struct Weight {
  enum class Kind : uint8_t { F32, BF16, FP8, FP4 };
  Kind kind = Kind::BF16;
  Tensor w;      // F32/BF16/F8E4M3: [out, in]; FP4: I8 [out, in/2] (low nibble = even column)
  Tensor scale;  // FP8: E8M0 [ceil(out/bn), ceil(in/bk)]; FP4: E8M0 [out, in/32]; else empty
  int block_out = 0, block_in = 0;  // FP8 block shape (128x128 V4, 32x32 V4.1); FP4: 1x32
  int64_t out = 0, in = 0;
  bool empty() const { return w.empty(); }
};

// Per-step sequence layout, host copies plus device copies (uploaded once per step).
// Token t of the step belongs to sequence tok_seq[t] at absolute position tok_pos[t].
struct StepMeta {
  int n_seqs = 0;
  int n_tokens = 0;
  int max_blocks = 0;  // columns of block_table
  int block_tokens = 0;  // tokens per KV block (a multiple of 128)
  // host
  std::vector<int32_t> h_q_start, h_len, h_start_pos, h_slot;  // [n_seqs]
  std::vector<int32_t> h_tok_pos, h_tok_seq;                   // [n_tokens]
  std::vector<int32_t> h_block_table;                          // [n_seqs, max_blocks], -1 = none
  // device (same contents, i32)
  Tensor q_start, len, start_pos, slot, tok_pos, tok_seq, block_table;
};

// Rows emitted by a compressor during one step, in (seq, window) order; planned on the host
// from positions alone, so no device read-back is needed.
struct EmitPlan {
  int n = 0;
  std::vector<int32_t> h_seq, h_row, h_pos;  // [n] step-seq index, logical row w, position w*m
  Tensor seq, row, pos;                      // device copies, i32 [n]
};

struct RopeTable {
  Tensor inv_freq;  // [rope_dims/2] f32, already YaRN-corrected where the layer uses YaRN
  int rope_dims = 0;
};

struct HcArgs {
  Tensor fn;     // [m, n*D] f32 (m = n*(2+n) for a sublayer, n for the head)
  Tensor base;   // [m] f32
  Tensor scale;  // [3] f32 (sublayer) or [1] (head)
  int n = 4;
  int sinkhorn_iters = 20;
  float norm_eps = 1e-6f;
  float hc_eps = 1e-6f;
};

// KV caches (ring, comp, keys) hold plain rows of the activation dtype, or packed rows
// (core/kv_packed.h, the official formats: fast numerics) when their RowShape says so: then the
// tensor is U8 [..., row_bytes(shape)] with the same leading dims, written by ring_write /
// paged_write (which quantize each row once) and dequantized by the readers on load.
struct AttnArgs {
  // q, kv_new, ring, comp and out share one activation dtype (f32|bf16).
  Tensor q;          // [T, H, d]
  Tensor kv_new;     // [T, d]: this step's window rows (already rope'd / QDQ'd)
  Tensor ring;       // [n_slots, W, d]: window rows of earlier steps, slot = pos mod W (packed: U8 [n_slots, W, B])
  Tensor comp;       // [n_blocks, rows_per_block, d] compressed rows (empty: none; packed: U8 [.., .., B])
  kvpack::RowShape ring_pack, comp_pack;  // packed(): the formats of ring / comp
  int comp_ratio = 0;      // rows per token ratio m of `comp` (0: no compressed branch)
  int rows_per_block = 0;
  Tensor comp_idx;   // [T, K] i32 logical compressed rows per query (-1 skip); empty = all visible
  Tensor sink;       // [H] f32
  float scale = 0;
  int window = 128;
  // Non-causal (V4.1's DSpark draft block, model-spec §4.7; window only, comp_ratio 0): every
  // query of a chunk [start, start + len) attends to the ring rows of positions
  // [max(0, start - W), start - 1] and to all len rows of its chunk (kv_new), its own later
  // rows included. The chunk's rows are not part of the sequence: the caller does not write
  // them into the ring.
  bool non_causal = false;
  Tensor out;        // [T, H, d]
};

struct CompressorArgs {
  Tensor a;          // [T, c*dc] f32 wkv(x)
  Tensor g;          // [T, c*dc] f32 wgate(x) (ape added inside, by position mod m)
  Tensor ape;        // [m, c*dc] f32 (empty for V4.1)
  Tensor state_kv;   // [n_slots, rows, c*dc] f32
  Tensor state_score;// [n_slots, rows, c*dc] f32
  int ratio = 4;
  bool overlap = true;  // c = 2 (V4 ratio 4)
  int dc = 512;
  Tensor out;        // [plan.n, dc] f32|bf16 pooled rows (before norm / rope)
};

struct IndexerArgs {
  // q, w and keys: f32|bf16. With quantizing numerics (official, fast) q and keys hold
  // FP4-QDQ'd values (e2m1 times a power of two per 32 dims), which the plan's tensor-core
  // implementations rely on (exact in BF16).
  Tensor q;          // [T, Hi, di]
  Tensor w;          // [T, Hi] head weights (already scaled)
  Tensor keys;       // [n_blocks, rows_per_block, di] (packed: U8 [n_blocks, rows_per_block, B])
  kvpack::RowShape keys_pack;  // packed(): the keys' format (Fp4B32)
  int ratio = 4;
  int rows_per_block = 0;
  int topk = 512;
  Tensor out_idx;    // [T, topk] i32 logical rows, -1 padded; order: descending score
  bool sort_ascending = false;  // V4.1: selected rows sorted by index
  // V4.1 two-level selection (model-spec §4.3). Blocks are cand_block consecutive rows.
  // Candidate source: cand_out [T, cand_topk] i32 receives the top-cand_topk blocks by their
  // best row score (the block holding the newest visible row always kept), ascending, -1
  // padded; its own top-k is not restricted. Reindex: cand_in (a candidate source's cand_out
  // from the same step) restricts the rows to those blocks. Both empty: V4 behaviour.
  int cand_block = 0;
  int cand_topk = 0;
  Tensor cand_out;   // [T, cand_topk] i32
  Tensor cand_in;    // [T, cand_topk] i32
  // Optional (tests): [T, C] f32 receives the scores ranked, token t's visible row r at column r
  // for r < min(C, (pos+1)/ratio); other columns are left as they are. Not with cand_in.
  Tensor scores_out;
};

struct MoeRouteArgs {
  Tensor logits;     // [T, E] f32
  Tensor bias;       // [E] f32 selection bias (empty for hash layers)
  Tensor tid2eid;    // [V, k] i32 (hash routing) or empty
  Tensor ids;        // [T] i32 token ids (hash routing)
  int topk = 6;
  float route_scale = 1.5f;
  float norm_eps = 0.0f;  // V4: 0, V4.1: 1e-20
  Tensor bias_vl;    // [E] f32 V4.1 selection bias of image-span tokens (empty: none)
  Tensor image_mask; // [T] i32, non-zero = image-span token (selects bias_vl); empty: text only
  Tensor out_w;      // [T, k] f32
  Tensor out_idx;    // [T, k] i32
};

struct MoeExpertsArgs {
  Tensor x;                       // [T, D] f32|bf16
  const std::vector<Weight>* w1;  // per expert [I, D]
  const std::vector<Weight>* w2;  // per expert [D, I]
  const std::vector<Weight>* w3;  // per expert [I, D]
  Tensor route_w;                 // [T, k] f32
  Tensor route_idx;               // [T, k] i32
  int act_block = 0;              // FP8 activation-quant block (0: none)
  float swiglu_limit = 10.0f;
  Tensor out;                     // [T, D] f32|bf16 (overwritten with the routed sum)
  // Fast numerics: every expert GEMM output rounded to BF16 as the official fp8/fp4_gemm
  // writes it (g = bf16(w1 x), u = bf16(w3 x), y_e = bf16(w2 h)); the weighted sum of the
  // slots stays f32 and is rounded once to out's dtype.
  bool round_bf16 = false;
  // Expert parallelism: w1/w2/w3[j] hold global expert expert_offset + j. Routed slots whose
  // expert is not held (another rank's expert, or -1 for a padding row) contribute 0.
  int expert_offset = 0;
};

class Backend {
 public:
  explicit Backend(BackendOptions o = {}) : opts_(std::move(o)) {}
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;

  // The kernel plan (backend/plan.h). kernels(): this backend's registry. install_plan(): the
  // plan a model resolved at load (load_model does it); from then on every op site must be in
  // it. set_numerics(): no installed plan, sites resolved on first use (op-level tests).
  // impl_for(): the one dispatch point of every op with more than one implementation.
  virtual const std::vector<KernelImpl>& kernels() const = 0;
  const BackendOptions& options() const { return opts_; }
  KernelPlan make_plan(const std::vector<OpSite>& sites, Numerics n) const {
    return resolve_plan(kernels(), plan_name(), sites, n, opts_);
  }
  void install_plan(KernelPlan p) {
    plan_ = std::make_unique<KernelPlan>(std::move(p));
    numerics_ = plan_->numerics();
    lazy_.clear();
  }
  void set_numerics(Numerics n) {
    plan_.reset();
    numerics_ = n;
    lazy_.clear();
  }
  Numerics numerics() const { return numerics_; }
  const KernelPlan* plan() const { return plan_.get(); }
  const KernelImpl& impl_for(const OpSite& site, int64_t rows) {
    const std::string key = site.key();
    if (plan_) {
      const PlanEntry* e = plan_->find(key);
      if (!e) DIL_FAIL(name(), ": op site not in the kernel plan: ", site.op, " (", site.describe(), ")");
      return e->for_rows(rows);
    }
    auto it = lazy_.find(key);
    if (it == lazy_.end()) it = lazy_.emplace(key, resolve_site(kernels(), site, opts_)).first;
    return it->second.for_rows(rows);
  }
  // The name plans print: "cpu" | "cuda".
  virtual std::string plan_name() const = 0;

  // Memory. alloc returns zero-filled memory on the backend's device.
  virtual Buffer alloc(size_t bytes) = 0;
  // Memory for op outputs (the model's per-step Scratch): contents unspecified, because every op
  // writes each element of its outputs (backend ops' contract). A device backend skips alloc's
  // zero-fill there: one launch per tensor, about as many as the step's ops, each a host cost of
  // every step. With BackendOptions::poison_scratch the memory is filled with 0xff bytes instead
  // (NaN as f32 / bf16, -1 as i32), so that a test run exposes a read of an element no op wrote.
  virtual Buffer alloc_scratch(size_t bytes) { return alloc(bytes); }
  virtual void upload(Tensor dst, const void* host_src) = 0;    // dst.nbytes() bytes
  virtual void download(void* host_dst, const Tensor& src) = 0;
  virtual void fill(Tensor t, float value) = 0;                 // f32 tensors
  virtual void copy(Tensor dst, const Tensor& src) = 0;         // same size, device to device
  virtual void synchronize() = 0;
  // A weight in this backend's memory (CPU: the mapping itself; CUDA: a device copy).
  virtual Weight adopt_weight(const Weight& host) = 0;
  virtual Tensor adopt_tensor(const Tensor& host) = 0;
  // The device's memory, for sizing the KV cache (--gpu-memory-utilization). total: the device's
  // size; available: what this process could still allocate (free on the device plus what the
  // backend's allocator caches unused). in_use / peak_in_use: bytes the backend's allocations
  // hold now / at most since the last reset_memory_peak(); 0 where not tracked (the CPU, whose
  // figures are the system's: MemTotal, MemAvailable). tracks_peak: in_use/peak are meaningful.
  struct MemoryInfo {
    size_t total = 0, available = 0, in_use = 0, peak_in_use = 0;
    bool tracks_peak = false;
  };
  virtual MemoryInfo memory_info() { return {}; }
  virtual void reset_memory_peak() {}

  // Elementwise / token-wise.
  virtual void embed(const Weight& table, const Tensor& ids, Tensor out) = 0;  // ids [T] i32 -> [T, D]
  virtual void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor out) = 0;  // x [R, d]; w [d] or empty
  virtual void add(const Tensor& a, const Tensor& b, Tensor out) = 0;
  virtual void linear(const Tensor& x, const Weight& w, int act_block, Tensor out) = 0;  // [T,in] -> [T,out]
  // out[t, g, :] = W[g*N:(g+1)*N, :] . x[t, g, :]   (x [T, G, K], W [G*N, K], out [T, G, N])
  virtual void grouped_linear(const Tensor& x, const Weight& w, int groups, Tensor out) = 0;
  virtual void rope(Tensor x, const Tensor& pos, const RopeTable& table, bool inverse) = 0;  // x [R, H, d], pos [R]
  virtual void fp8_qdq(Tensor x, int cols, int block) = 0;  // x [R, d]: QDQ of columns [0, cols) in blocks
  virtual void fp4_qdq(Tensor x, int block, bool e4m3_scale) = 0;  // x [R, d]
  virtual void hadamard(Tensor x) = 0;                               // x [R, d], d a power of two

  // mHC. hc_mix: pre [T,n], post [T,n], comb [T,n,n] (post/comb unused when fn has n rows: head).
  virtual void hc_mix(const Tensor& X, const HcArgs& a, Tensor pre, Tensor post, Tensor comb) = 0;
  virtual void hc_collapse(const Tensor& X, const Tensor& pre, Tensor out) = 0;  // [T,n,D] -> [T,D]
  virtual void hc_post(const Tensor& F, const Tensor& X, const Tensor& post, const Tensor& comb, Tensor out) = 0;
  virtual void hc_expand(const Tensor& e, int n, Tensor X) = 0;  // [T,D] -> [T,n,D]
  // The fused mHC pre of a sublayer (or of the head) with the norm after it, one op so that a
  // backend reads the streams X [T,n,D] twice at most (the mixes, then the collapse):
  //   hc_mix(X, a, pre, post, comb);
  //   u = hc_collapse(X, cpre) rounded to xn's dtype, cpre = collapse_pre [T,n] f32 when given
  //       (V4.1's single-pass mHC collapses with the previous sublayer's pre), else pre;
  //   xn = rms_norm(u, norm_w, a.norm_eps)   (xn [T,D] f32|bf16; norm_w [D] f32|bf16).
  // The same function as the three ops in sequence (the CPU backend composes them).
  virtual void hc_pre(const Tensor& X, const HcArgs& a, const Tensor& collapse_pre, const Tensor& norm_w, Tensor pre,
                      Tensor post, Tensor comb, Tensor xn) = 0;

  // Attention and its state.
  virtual void sparse_attention(const AttnArgs& a, const StepMeta& m) = 0;
  // pack.packed(): ring / cache are U8 packed rows (AttnArgs), each row quantized once here.
  virtual void ring_write(const Tensor& kv_new, Tensor ring, const StepMeta& m, const kvpack::RowShape& pack) = 0;
  void ring_write(const Tensor& kv_new, Tensor ring, const StepMeta& m) { ring_write(kv_new, ring, m, {}); }
  virtual void compressor(const CompressorArgs& a, const EmitPlan& plan, const StepMeta& m) = 0;
  virtual void paged_write(const Tensor& rows, Tensor cache, int rows_per_block, const EmitPlan& plan,
                           const StepMeta& m, const kvpack::RowShape& pack) = 0;
  void paged_write(const Tensor& rows, Tensor cache, int rows_per_block, const EmitPlan& plan, const StepMeta& m) {
    paged_write(rows, cache, rows_per_block, plan, m, {});
  }
  // Whether this backend's cache readers and writers take packed rows (AttnArgs): the model
  // stores packed rows only where the numerics mode asks for them and the backend can.
  virtual bool reads_packed_kv() const { return false; }
  virtual void indexer_topk(const IndexerArgs& a, const StepMeta& m) = 0;

  // MoE.
  virtual void moe_route(const MoeRouteArgs& a) = 0;
  virtual void moe_experts(const MoeExpertsArgs& a) = 0;
  // out = silu(min(g, limit)) * clamp(u, -limit, limit) [* w per row]; g,u,out [T, I]; w [T] or empty
  virtual void swiglu(const Tensor& g, const Tensor& u, const Tensor& w, float limit, Tensor out) = 0;

  // V4.1 Engram gate and update (model-spec §4.5), per token t and stream j:
  //   key_j = kv[t, jD:(j+1)D], value = kv[t, nD:(n+1)D], h = X[t, j];
  //   s = sum_c h_c qk[j,c] key_jc * rsqrt(mean h^2 + eps) * rsqrt(mean key_j^2 + eps) * D^-0.5;
  //   gate = sigmoid(sign(s) sqrt(max(|s|, 1e-6))), 0 where mask[t] != 0 (image span);
  //   out[t, j] = h + gate * value.   X, out [T, n, D]; kv [T, (n+1)*D]; qk [n, D] f32; mask [T] i32 or empty.
  // Not every backend has it yet: the default names the backend and fails (a user asking for a
  // V4.1 model on such a backend gets a clear error, not a wrong result).
  virtual void engram_mix(const Tensor& X, const Tensor& kv, const Tensor& qk, const Tensor& mask, float eps,
                          Tensor out) {
    DIL_FAIL(name(), " backend: engram_mix (DeepSeek-V4.1 Engram) is not implemented yet");
  }

  // The sampler (backend/sampling.h: its specification): one token (+ logprobs) per row of
  // a.rows from a.logits, results in a.out. Only a.out needs to come back to the host. The
  // default runs the specification on the host (download, sample_rows_reference, upload): right
  // for the CPU backend, a synchronizing fallback for others; CUDA has its own kernels.
  virtual void sample(const SampleArgs& a);

  // Reset the recurrent state of the given slots (compressor scores -inf, kv 0).
  virtual void reset_state(Tensor state_kv, Tensor state_score, const std::vector<int32_t>& slots) = 0;

  // Benchmark timing: an event marks a point in the op stream; elapsed_ms(a, b) is the time
  // between two events (waiting for them as needed). The default synchronizes and reads the
  // host clock at each event; a device backend may override it with device events so that
  // marking does not stall the stream.
  virtual int record_event() {
    synchronize();
    host_events_.push_back(std::chrono::steady_clock::now());
    return int(host_events_.size()) - 1;
  }
  virtual double elapsed_ms(int from, int to) {
    DIL_CHECK(from >= 0 && to >= from && to < int(host_events_.size()), "bad event ids ", from, " ", to);
    return std::chrono::duration<double, std::milli>(host_events_[size_t(to)] - host_events_[size_t(from)]).count();
  }
  virtual void clear_events() { host_events_.clear(); }
  // Benchmark timing: the device stream waits `ms` before its next op, so that the host can
  // queue a whole step's launches meanwhile; events around that step then give its device
  // time without launch gaps (what a CUDA graph of the step could reach). A host backend,
  // whose ops run as they are called, does nothing.
  virtual void hold(double ms) { (void)ms; }
  // Hardware ceilings measured on this device for the benchmarks, e.g. "bf16_gemm_tflops",
  // "fp8_gemm_tflops", "hbm_copy_gbps" (read + write bytes). Empty where not measurable.
  virtual std::map<std::string, double> measure_ceilings() { return {}; }
  // The device stream every op is ordered on, as an opaque handle (CUDA: the cudaStream_t),
  // so that the NCCL communicator enqueues its collectives in the same order. CPU: nullptr.
  virtual void* native_stream() { return nullptr; }

 private:
  BackendOptions opts_;
  Numerics numerics_ = Numerics::Reference;  // lazy mode default: the exact implementations
  std::unique_ptr<KernelPlan> plan_;
  std::map<std::string, PlanEntry> lazy_;
  std::vector<std::chrono::steady_clock::time_point> host_events_;
};

enum class BackendKind { CPU, CUDA };
// The one dispatch point (the only #ifdef on CUDA outside CMake lives in its .cpp).
std::unique_ptr<Backend> make_backend(BackendKind kind, int device_index = 0, const BackendOptions& o = {});
// A backend's registry without the backend (`inspect --plan --device cuda` on a machine
// without a GPU or without the CUDA build).
const std::vector<KernelImpl>& kernel_registry(BackendKind kind);
const char* backend_kind_name(BackendKind kind);
BackendKind parse_backend_kind(const std::string& s);  // "cpu" | "cuda"; throws dil::Error

}  // namespace dil
