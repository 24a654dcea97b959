// The kernel plan: which implementation runs every op of every layer kind, decided once at
// load (design.md "Numerics"; docs/kernels.md is generated from the registries).
//
// - Each backend declares its implementations in one registry (KernelImpl): the op family,
//   what the implementation requires of an op site (numerics mode, dtypes, weight format, head
//   dim, head multiple, top-k limit, ...), the smallest row count it is used for, the
//   tolerance it is tested to and the test that checks it.
// - A model lists its op sites (OpSite: one op of one layer kind, described by the features
//   implementations are chosen by). resolve_plan() picks, for every site, the implementation
//   per row regime (registry order is preference; an implementation may be limited to few rows,
//   KernelImpl::max_rows, or to many, min_rows) and fails with an error naming the site and
//   every unmet requirement when nothing can run it.
// - At call time a backend's op builds the same site from its arguments (the *_site helpers
//   below, used on both sides) and asks Backend::impl_for(), the one dispatch point: a site the
//   installed plan lacks is an error, so a model and its enumeration cannot drift apart
//   unnoticed (the CPU backend checks it too, so CI catches it).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/numerics.h"
#include "backend/tolerance.h"
#include "core/dtype.h"

namespace dil {

struct Weight;

// Options of a backend, from the CLI / EngineOptions (no environment switches).
struct BackendOptions {
  // Op family -> implementation name the plan must use (e.g. {"linear", "simt"}); a forced
  // implementation that cannot run one of the family's sites fails the plan at load.
  std::map<std::string, std::string> force;
  // cuBLASLt block-scaled FP8 scale layouts "ab" (a: weight scales K- (0) or N-fastest (1);
  // b: activation scales token- (0) or K-fastest (1)); scripts/gpu-check probes the others.
  std::string lt_fp8_layout = "00";
  // alloc_scratch fills with 0xff bytes (tests: finds reads of unwritten output elements). Set
  // by make_backend from the environment variable DIL_POISON_SCRATCH=1 as well.
  bool poison_scratch = false;
  // CUDA: kernels written for it launch with programmatic dependent launch (each may start
  // while the previous kernel of the stream finishes; docs/architecture.md "Kernel launches").
  // make_backend clears it when the environment says DIL_PDL=0 (same-run A/B comparisons).
  bool pdl = true;
};
// "op=impl[,op=impl...]" -> BackendOptions::force entries; throws dil::Error on bad syntax.
void parse_kernel_overrides(const std::string& spec, BackendOptions* o);

// One op of one layer kind. Fields an op family does not use stay 0 / empty.
struct OpSite {
  std::string op;     // op family: "linear", "grouped_linear", "sparse_attention", ...
  std::string where;  // for people: "CSA attn.wq_a", "HCA attention" (not part of the key)
  Numerics numerics = Numerics::Official;
  DType act = DType::F32;  // activation dtype of the op's inputs and outputs
  DType out = DType::F32;  // output dtype where it differs (linear / moe outputs)
  // GEMM weight (linear, grouped_linear, moe_experts: one expert's w1).
  int wkind = -1;  // Weight::Kind as int, -1: no weight
  int block_out = 0, block_in = 0;
  int64_t n = 0, k = 0;
  int act_block = 0;  // FP8 activation-quant block of the GEMM input (0: none)
  int groups = 0;     // grouped_linear groups
  // Attention / indexer.
  int heads = 0, head_dim = 0;
  int ratio = 0;  // compressed rows' ratio (0: window only)
  int topk = 0;   // attention: index list width (0: all rows); indexer: k
  int non_causal = 0;  // attention: 1 = AttnArgs::non_causal (the DSpark draft block)
  int cand = 0;   // indexer: 0 V4, 1 candidate source (cand_out), 2 Reindex (cand_in)
  int cand_block = 0, cand_topk = 0;
  // The dispatch key: every field above but `where`.
  std::string key() const;
  std::string describe() const;  // features for people: "FP8 128x128 [4096 x 7168] act 128 bf16"
};

// Site builders, used by a model's enumeration and by the backends' ops alike.
OpSite linear_site(const Weight& w, int act_block, DType x, DType out, Numerics n);
OpSite grouped_linear_site(const Weight& w, int groups, DType x, DType out, Numerics n);
OpSite attention_site(int heads, int head_dim, int ratio, int topk, DType act, Numerics n, bool non_causal = false);
OpSite indexer_site(int heads, int head_dim, int topk, int cand, int cand_block, int cand_topk, DType act,
                    Numerics n);
OpSite moe_experts_site(const Weight& w1, int act_block, DType x, DType out, Numerics n);
// Families with one implementation per backend that still appear in the plan table.
OpSite simple_site(const std::string& op, DType act, Numerics n);

struct KernelImpl {
  std::string op;    // family
  std::string name;  // e.g. "cublaslt_fp8", "simt_fp64"
  std::string what;  // one line: what it does
  // The requirements of `s` this implementation does not meet (empty: it can run `s`).
  std::vector<std::string> (*unmet)(const OpSite& s) = nullptr;
  int64_t min_rows = 0;  // used for calls of at least this many rows (0: any)
  Tolerance tolerance;    // against the CPU reference of the same numerics (backend/tolerance.h)
  std::string test;       // where that tolerance is derived and checked
  // Used for calls of at most this many rows (0: any). Such an implementation (a decode-sized
  // GEMV) takes rows [0, max_rows] of a site ahead of the regimes of the others, when it comes
  // before the site's base implementation in registry order; it is never a site's only choice.
  int64_t max_rows = 0;
};

// The implementations chosen for one site, by row regime.
struct PlanEntry {
  OpSite site;
  std::vector<const KernelImpl*> impls;  // one per row regime, ascending
  std::vector<int64_t> from;             // first row of each regime (from[0] == 0)
  const KernelImpl& for_rows(int64_t rows) const;
};

class KernelPlan {
 public:
  KernelPlan() = default;
  KernelPlan(std::string backend, Numerics n) : backend_(std::move(backend)), numerics_(n) {}
  const std::string& backend() const { return backend_; }
  Numerics numerics() const { return numerics_; }
  const std::vector<PlanEntry>& entries() const { return entries_; }
  const PlanEntry* find(const std::string& key) const;
  void add(PlanEntry e);
  // One row per (site, regime): op | where | features | rows | implementation | tolerance.
  std::string table() const;
  // One line of the families with a choice: "linear cublaslt_fp8 x12, simt x3; sparse_attention
  // mma_bf16 x3; ..." (x N: the number of sites using it).
  std::string summary() const;

 private:
  std::string backend_;
  Numerics numerics_ = Numerics::Official;
  std::vector<PlanEntry> entries_;
  std::map<std::string, size_t> index_;  // key -> entries_ position
};

// Resolves every site (duplicates by key collapse into one entry, their `where`s joined).
// Throws dil::Error naming each site nothing can run, with every implementation's unmet
// requirements, or a forced implementation that cannot run a site of its family.
KernelPlan resolve_plan(const std::vector<KernelImpl>& registry, const std::string& backend,
                        const std::vector<OpSite>& sites, Numerics n, const BackendOptions& o);
// Resolves one site (a plan's entry for it).
PlanEntry resolve_site(const std::vector<KernelImpl>& registry, const OpSite& site, const BackendOptions& o);

// The op table of docs/kernels.md, generated from the registries (`deepinfer-lab kernels-doc`).
std::string registry_markdown(const std::vector<KernelImpl>& registry, const std::string& backend);

// Requirement helpers for registries: each returns "" when met, else the requirement's text.
std::string need(bool ok, const std::string& what);

}  // namespace dil
