// How many KV blocks and state slots the engine allocates (docs/architecture.md "KV pool
// sizing"). Three sources of the byte budget, first that applies:
// - EngineOptions::kv_blocks: that many blocks, the slots on top (tests);
// - EngineOptions::kv_memory_bytes (--kv-memory-mb): blocks + slots within it;
// - automatic (--gpu-memory-utilization F):
//   on a device whose allocator tracks its peak (CUDA), one profiling forward of the largest
//   step the scheduler forms (max_num_batched_tokens new tokens of one sequence at the end of
//   max_model_len, so every context-sized temporary is at its largest) on a cache of that one
//   sequence; the budget is F x total - what is in use once that cache is dropped (weights,
//   workspaces, other processes) - the step's scratch high-water mark (vLLM's rule);
//   on the CPU, min(F x MemAvailable, what the limits can use: every slot plus max_num_seqs
//   sequences of max_model_len, plus the copy-on-write block of pool_blocks_needed). The CPU's pages are only touched when written, but a pool
//   larger than the limits can fill would only let the prefix cache grow without bound.
//   In the automatic case, when the budget cannot hold max_num_seqs slots next to one
//   sequence of max_model_len, fewer slots are made (>= 1): max_num_seqs is a limit, the
//   memory is what it is (an explicit budget or --kv-slots fails instead).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/check.h"
#include "core/host_memory.h"
#include "runtime/engine_internal.h"

namespace dil::runtime {
namespace {

constexpr double kGiB = double(1ll << 30);

// GiB, or MiB below one GiB (the CPU's pools of tiny models).
std::string gib(double b) {
  char buf[32];
  if (std::abs(b) >= kGiB) std::snprintf(buf, sizeof buf, "%.2f GiB", b / kGiB);
  else std::snprintf(buf, sizeof buf, "%.1f MiB", b / double(1 << 20));
  return buf;
}

int64_t blocks_for(int64_t tokens, int block_tokens) { return (tokens + block_tokens - 1) / block_tokens; }

// Bytes the scratch of the largest step needs: one forward of it, on a cache of that one
// sequence (allocated here and dropped again, so the caller measures without it).
int64_t profile_step_scratch(const EngineOptions& o, Model& model, Backend& be, int64_t* tokens, int64_t* pos) {
  const int bt = o.block_tokens;
  const int64_t T = std::min<int64_t>(o.max_num_batched_tokens, o.max_model_len);
  const int64_t nb = blocks_for(o.max_model_len, bt);
  model.allocate_cache(int(nb), 1, bt);
  StepBatch b;
  SeqChunk c;
  c.slot = 0;
  c.start_pos = int32_t(o.max_model_len - T);
  c.n_tokens = int32_t(T);
  for (int64_t i = 0; i < nb; ++i) c.blocks.push_back(int32_t(i));
  b.seqs.push_back(c);
  const int64_t vocab = model.config().vocab_size;
  for (int64_t t = 0; t < T; ++t) b.tokens.push_back(int32_t((t * 7919 + 13) % vocab));
  be.synchronize();
  be.reset_memory_peak();
  const int64_t before = int64_t(be.memory_info().in_use);
  std::vector<float> logits;
  model.forward(b, &logits);
  be.synchronize();
  const int64_t scratch = int64_t(be.memory_info().peak_in_use) - before;
  model.allocate_cache(1, 1, bt);  // drop the profiling cache (its memory returns to the allocator)
  be.synchronize();
  *tokens = T;
  *pos = c.start_pos;
  return std::max<int64_t>(scratch, 0);
}

}  // namespace

int64_t pool_blocks_needed(const EngineOptions& o) { return blocks_for(o.max_model_len, o.block_tokens) + 1; }

int64_t pool_bytes_at_limits(const EngineOptions& o, const CacheSpec& spec) {
  const int64_t slots = (o.kv_slots > 0 ? o.kv_slots : o.max_num_seqs) +
                        (o.enable_prefix_cache ? std::max(0, o.prefix_cache_slots) : 0);
  return slots * int64_t(spec.bytes_per_slot) +
         (int64_t(o.max_num_seqs) * blocks_for(o.max_model_len, o.block_tokens) + 1) * int64_t(spec.bytes_per_block);
}

KvBudget auto_kv_budget(const EngineOptions& o, const CacheSpec& spec, Model& model, Backend* be) {
  const double f = o.gpu_memory_utilization;
  if (!(f > 0.0 && f <= 1.0)) DIL_FAIL("gpu_memory_utilization must be in (0, 1], got ", f);
  KvBudget b;
  b.automatic = true;
  const Backend::MemoryInfo mem = be ? be->memory_info() : Backend::MemoryInfo{};
  if (be && mem.tracks_peak) {
    int64_t T = 0, pos = 0;
    const int64_t scratch = profile_step_scratch(o, model, *be, &T, &pos);
    const Backend::MemoryInfo m = be->memory_info();
    const int64_t used = int64_t(m.total) - int64_t(m.available);
    b.bytes = int64_t(f * double(m.total)) - used - scratch;
    b.scratch_bytes = scratch;
    b.how = str_cat("gpu-memory-utilization ", f, " of ", gib(double(m.total)), ": ", gib(double(used)),
                    " in use after load, step scratch ", gib(double(scratch)), " (profiled: ", T,
                    " tokens at position ", pos, ")");
    if (b.bytes <= 0)
      DIL_FAIL("no memory left for the KV cache: gpu_memory_utilization ", f, " x ", gib(double(m.total)), " = ",
               gib(f * double(m.total)), ", but the weights and the rest hold ", gib(double(used)),
               " and a step of ", T, " tokens needs ", gib(double(scratch)),
               " of scratch; raise --gpu-memory-utilization or lower --max-num-batched-tokens/--max-model-len");
    return b;
  }
  // The CPU (or no backend: a fake model): the system's memory.
  const HostMemory h = host_memory();
  const int64_t avail = int64_t(mem.available ? mem.available : h.available);
  const int64_t limits = pool_bytes_at_limits(o, spec);
  if (avail <= 0) {
    b.bytes = std::min<int64_t>(limits, 256ll << 20);
    b.how = "system memory unknown: min(256 MiB, the limits)";
    return b;
  }
  b.bytes = std::min<int64_t>(int64_t(f * double(avail)), limits);
  b.how = str_cat("min(", f, " x ", gib(double(avail)), " available, ", gib(double(limits)),
                  " for max_num_seqs sequences of max_model_len)");
  return b;
}

PoolPlan plan_pool(const EngineOptions& opts, const CacheSpec& spec, const KvBudget& budget, bool speculative) {
  PoolPlan p;
  p.n_slots = opts.kv_slots > 0 ? opts.kv_slots : opts.max_num_seqs;
  if (opts.prefix_cache_slots < 0) DIL_FAIL("prefix_cache_slots must be >= 0, got ", opts.prefix_cache_slots);
  p.n_extra_slots = opts.enable_prefix_cache ? opts.prefix_cache_slots : 0;
  // One per drafting sequence of a step; at most kMaxDraftingSeqs sequences draft per step (a
  // V4-Flash slot is ~24 MB in f32: 64 spare slots are 1.5 GB), the others decode plainly.
  constexpr int kMaxDraftingSeqs = 64;
  p.n_spec_slots = speculative ? std::min({opts.max_num_seqs, p.n_slots, kMaxDraftingSeqs}) : 0;
  if (opts.kv_blocks > 0) {
    p.n_blocks = opts.kv_blocks;
    p.sizing = "kv_blocks";
    return p;
  }
  DIL_CHECK(spec.bytes_per_block > 0, "cache spec without bytes_per_block");
  const int64_t bytes = opts.kv_memory_bytes > 0 ? opts.kv_memory_bytes : budget.bytes;
  p.budget_bytes = bytes;
  p.sizing = opts.kv_memory_bytes > 0 ? str_cat("kv-memory-mb ", opts.kv_memory_bytes >> 20) : budget.how;
  const int64_t slot = int64_t(spec.bytes_per_slot), block = int64_t(spec.bytes_per_block);
  if (budget.automatic && opts.kv_memory_bytes <= 0 && opts.kv_slots <= 0) {
    // Fewer sequence slots when the memory cannot hold them all next to one full-length sequence.
    const int64_t one_seq = pool_blocks_needed(opts) * block;
    const int64_t fit = slot > 0 ? (bytes - one_seq) / slot - p.n_extra_slots - p.n_spec_slots : p.n_slots;
    if (fit < p.n_slots) {
      if (fit < 1)
        DIL_FAIL("the KV budget of ", gib(double(bytes)), " (", p.sizing, ") cannot hold one sequence of max_model_len ",
                 opts.max_model_len, " (", gib(double(one_seq + slot)), " with its state slot) and the ",
                 p.n_extra_slots, " prefix-cache slots; lower --max-model-len or raise the memory");
      p.n_slots = int(fit);
      p.n_spec_slots = std::min(p.n_spec_slots, p.n_slots);
      p.sizing += str_cat("; ", p.n_slots, " state slots fit, not max_num_seqs ", opts.max_num_seqs);
    }
  }
  const int64_t slot_bytes = int64_t(p.n_slots + p.n_extra_slots + p.n_spec_slots) * slot;
  if (bytes <= slot_bytes)
    DIL_FAIL("kv_memory_bytes ", bytes, " cannot even hold the ", p.n_slots, " state slots, ", p.n_extra_slots,
             " prefix-cache slots and ", p.n_spec_slots, " speculative-decoding slots (", slot_bytes,
             " bytes); lower max_num_seqs/kv_slots/prefix_cache_slots or raise the KV memory");
  p.n_blocks = (bytes - slot_bytes) / block;
  return p;
}

}  // namespace dil::runtime
