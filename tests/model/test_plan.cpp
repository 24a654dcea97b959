// The kernel plan (backend/plan.h) for the real configs, without a GPU: which implementation
// runs every op site of V4-Flash and V4.1-Flash in each numerics mode on each backend, that an
// impossible request fails at load naming its requirement, forced implementations, row regimes,
// and that a backend refuses an op site its installed plan lacks.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "backend/backend.h"
#include "model/model.h"

using namespace dil;

namespace {

const std::string kV4 = std::string(DIL_SOURCE_DIR) + "/configs/deepseek-v4-flash.json";
const std::string kV41 = std::string(DIL_SOURCE_DIR) + "/configs/deepseek-v4.1-flash.json";

KernelPlan plan_of(const std::string& config, BackendKind k, Numerics n, const BackendOptions& o = {}) {
  const ModelConfig cfg = load_model_config(config);
  return resolve_plan(kernel_registry(k), backend_kind_name(k), model_op_sites(cfg, n), n, o);
}

// The implementations chosen for the first site of `op` whose `where` contains `where`.
std::vector<std::string> impls(const KernelPlan& p, const std::string& op, const std::string& where) {
  for (const PlanEntry& e : p.entries())
    if (e.site.op == op && e.site.where.find(where) != std::string::npos) {
      std::vector<std::string> v;
      for (const KernelImpl* k : e.impls) v.push_back(k->name);
      return v;
    }
  ADD_FAILURE() << "no " << op << " site at '" << where << "'";
  return {};
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

using V = std::vector<std::string>;

}  // namespace

TEST(KernelPlan, V4FlashOnCudaPerMode) {
  const KernelPlan ref = plan_of(kV4, BackendKind::CUDA, Numerics::Reference);
  const KernelPlan off = plan_of(kV4, BackendKind::CUDA, Numerics::Official);
  const KernelPlan fast = plan_of(kV4, BackendKind::CUDA, Numerics::Fast);
  // Attention: exact FP64 in reference, BF16-split tensor cores in official, BF16 (FlashMLA-style) in fast.
  for (const char* kind : {"SWA attention", "CSA attention", "HCA attention"}) {
    EXPECT_EQ(impls(ref, "sparse_attention", kind), V{"fp64"}) << kind;
    EXPECT_EQ(impls(off, "sparse_attention", kind), V{"mma_split_bf16"}) << kind;
    EXPECT_EQ(impls(fast, "sparse_attention", kind), (V{"flash_bf16", "wgmma_bf16"})) << kind;  // wgmma from 128
  }
  // Projections: FP8 128x128 with act 128 on cuBLASLt once activations are quantized; reference
  // numerics quantize nothing, so the exact SIMT kernel runs them.
  EXPECT_EQ(impls(off, "linear", "CSA attn.wq_a"), V{"cublaslt_fp8"});
  // Fast numerics: the decode GEMV first (KernelImpl::max_rows), for one row where cuBLASLt
  // takes the weight (FP8 128x128 with act 128, BF16: faster from 2 rows on), then CUTLASS's
  // blockwise FP8 GEMM from 16 rows (bf16 in and out).
  EXPECT_EQ(impls(fast, "linear", "CSA attn.wq_a"), (V{"gemv", "cublaslt_fp8", "cutlass_fp8"}));
  for (const PlanEntry& e : fast.entries())
    if (e.site.op == "linear" && e.site.where.find("attn.wq_a") != std::string::npos) {
      EXPECT_EQ(e.for_rows(15).name, "cublaslt_fp8") << e.site.where;
      EXPECT_EQ(e.for_rows(16).name, "cutlass_fp8") << e.site.where;
      EXPECT_EQ(e.for_rows(4096).name, "cutlass_fp8") << e.site.where;
    }
  for (const PlanEntry& e : fast.entries())
    if (e.site.op == "linear" && (e.site.where.find("attn.wq_a") != std::string::npos ||
                                  e.site.where.find("head") != std::string::npos)) {
      // The head (1.06 GB, >= 256 MB) streams through shared memory; smaller weights take gemv.
      const std::string one = e.site.where.find("head") != std::string::npos ? "gemv_stream" : "gemv";
      EXPECT_EQ(e.for_rows(1).name, one) << e.site.where;
      EXPECT_NE(e.for_rows(2).name, one) << e.site.where;
    }
  EXPECT_EQ(impls(ref, "linear", "CSA attn.wq_a"), V{"simt"});
  // wo_a (FP8, no activation quant): the exact kernel below 64 rows, BF16 tensor cores above.
  EXPECT_EQ(impls(off, "grouped_linear", "attn.wo_a"), (V{"simt", "dequant_bf16_lt_split"}));
  EXPECT_EQ(impls(fast, "grouped_linear", "attn.wo_a"), (V{"gemv", "simt", "dequant_bf16_lt"}));
  EXPECT_EQ(impls(ref, "grouped_linear", "attn.wo_a"), V{"simt"});
  // The BF16 head: split f32 activations, or plain BF16 in fast.
  EXPECT_EQ(impls(off, "linear", "head"), V{"cublaslt_bf16_split"});
  EXPECT_EQ(impls(fast, "linear", "head"), (V{"gemv_stream", "cublaslt_bf16"}));
  // Indexer and experts.
  EXPECT_EQ(impls(off, "indexer_topk", "CSA indexer"), V{"mma_exact"});
  EXPECT_EQ(impls(ref, "indexer_topk", "CSA indexer"), V{"fp64"});
  // Fast: mma_fp8 below 128 tokens, the warpgroup scorer from there.
  EXPECT_EQ(impls(fast, "indexer_topk", "CSA indexer"), (V{"mma_fp8", "wgmma_fp8"}));
  EXPECT_EQ(impls(off, "moe_experts", "ffn.experts"), V{"mma_bf16"});
  EXPECT_EQ(impls(ref, "moe_experts", "ffn.experts"), V{"simt"});
  // Fast: the decode GEMV on FP8 tensor cores up to 64 tokens, then wgmma (FP4 experts, D and I
  // multiples of 128).
  EXPECT_EQ(impls(fast, "moe_experts", "ffn.experts"), (V{"gemv_fp8", "wgmma"}));
  // Every site's dtype follows the mode.
  for (const PlanEntry& e : fast.entries()) EXPECT_EQ(e.site.act, DType::BF16) << e.site.op << " " << e.site.where;
  for (const PlanEntry& e : off.entries()) EXPECT_EQ(e.site.act, DType::F32) << e.site.op << " " << e.site.where;
  // The table names every op family of the forward.
  const std::string t = fast.table();
  for (const char* op : {"linear", "grouped_linear", "sparse_attention", "indexer_topk", "moe_experts", "hc_pre",
                         "compressor", "rms_norm", "embed"})
    EXPECT_NE(t.find(std::string("| ") + op + " |"), std::string::npos) << op;
}

TEST(KernelPlan, V41FlashOnCudaRegimesAndCandidates) {
  const KernelPlan off = plan_of(kV41, BackendKind::CUDA, Numerics::Official);
  // FP8 weights with 32x32 blocks (cuBLASLt cannot scale them): exact SIMT below 64 rows,
  // dequantized BF16 tensor cores from 64.
  EXPECT_EQ(impls(off, "linear", "attn.wq_a"), (V{"simt", "dequant_bf16_lt"}));
  // The candidate source and the Reindex layers are distinct indexer sites.
  int cand_sites = 0;
  for (const PlanEntry& e : off.entries())
    if (e.site.op == "indexer_topk") {
      cand_sites += e.site.cand != 0;
      EXPECT_EQ(e.impls.size(), 1u);
      EXPECT_EQ(e.impls[0]->name, "mma_exact") << e.site.where;
    }
  EXPECT_GE(cand_sites, 1);
  EXPECT_EQ(impls(off, "sparse_attention", "Full-r2 attention"), V{"mma_split_bf16"});
  // Fast numerics: the FP8 tensor-core scorers at every indexer site: mma_fp8 below 128 tokens
  // and in Reindex layers (compact candidate entries), wgmma_fp8 from 128 tokens elsewhere.
  const KernelPlan fast = plan_of(kV41, BackendKind::CUDA, Numerics::Fast);
  for (const PlanEntry& e : fast.entries())
    if (e.site.op == "indexer_topk") {
      EXPECT_EQ(e.for_rows(127).name, "mma_fp8") << e.site.where;
      EXPECT_EQ(e.for_rows(128).name, e.site.cand == 2 ? "mma_fp8" : "wgmma_fp8") << e.site.where;
    }
  // Forced, the warpgroup scorer runs every row count of the sites it can run.
  BackendOptions wg;
  wg.force["indexer_topk"] = "wgmma_fp8";
  const std::string msg = error_of([&] { plan_of(kV41, BackendKind::CUDA, Numerics::Fast, wg); });
  EXPECT_NE(msg.find("not Reindex"), std::string::npos) << msg;
  // 64 heads of 512: the FlashMLA-style kernels at every attention site, wgmma from 128 tokens.
  for (const PlanEntry& e : fast.entries())
    if (e.site.op == "sparse_attention") {
      EXPECT_EQ(e.impls.size(), 2u);
      EXPECT_EQ(e.for_rows(127).name, "flash_bf16") << e.site.where;
      EXPECT_EQ(e.for_rows(128).name, "wgmma_bf16") << e.site.where;
    }
}

TEST(KernelPlan, CpuRunsEverySiteWithItsReference) {
  for (const std::string& c : {kV4, kV41})
    for (Numerics n : {Numerics::Reference, Numerics::Official, Numerics::Fast}) {
      const KernelPlan p = plan_of(c, BackendKind::CPU, n);
      ASSERT_FALSE(p.entries().empty());
      for (const PlanEntry& e : p.entries()) {
        ASSERT_EQ(e.impls.size(), 1u);
        EXPECT_EQ(e.impls[0]->name, "reference");
      }
    }
}

TEST(KernelPlan, ImpossibleRequestFailsNamingTheRequirement) {
  ModelConfig cfg = load_model_config(kV4);
  cfg.index_topk = 4096;  // above every indexer kernel's top-k limit
  const std::string msg = error_of([&] {
    resolve_plan(kernel_registry(BackendKind::CUDA), "cuda", model_op_sites(cfg, Numerics::Official), Numerics::Official,
                 {});
  });
  EXPECT_NE(msg.find("nothing can run indexer_topk"), std::string::npos) << msg;
  EXPECT_NE(msg.find("top-k and candidate top-k at most 2048"), std::string::npos) << msg;
  EXPECT_NE(msg.find("CSA indexer"), std::string::npos) << msg;
}

TEST(KernelPlan, ForcedImplementations) {
  BackendOptions o;
  o.force["linear"] = "simt";
  const KernelPlan p = plan_of(kV4, BackendKind::CUDA, Numerics::Official, o);
  for (const PlanEntry& e : p.entries())
    if (e.site.op == "linear") {
      EXPECT_EQ(e.impls.size() == 1 ? e.impls[0]->name : "", "simt") << e.site.where;
    }
  // A forced implementation that cannot run a site of its family fails, naming it.
  BackendOptions bad;
  bad.force["sparse_attention"] = "mma_bf16";
  const std::string msg = error_of([&] { plan_of(kV4, BackendKind::CUDA, Numerics::Official, bad); });
  EXPECT_NE(msg.find("sparse_attention=mma_bf16 cannot run"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fast numerics"), std::string::npos) << msg;
  BackendOptions unknown;
  unknown.force["linear"] = "no_such_kernel";
  EXPECT_NE(error_of([&] { plan_of(kV4, BackendKind::CUDA, Numerics::Official, unknown); }).find("no such implementation"),
            std::string::npos);
  BackendOptions parsed;
  parse_kernel_overrides("linear=simt,moe_experts=simt", &parsed);
  EXPECT_EQ(parsed.force.size(), 2u);
  EXPECT_EQ(parsed.force["moe_experts"], "simt");
  EXPECT_FALSE(error_of([&] { parse_kernel_overrides("linear", &parsed); }).empty());
}

TEST(KernelPlan, RowRegimesPickByRowCount) {
  const KernelPlan p = plan_of(kV41, BackendKind::CUDA, Numerics::Official);
  for (const PlanEntry& e : p.entries()) {
    if (e.site.op != "linear" || e.site.where.find("attn.wq_a") == std::string::npos) continue;
    EXPECT_EQ(e.for_rows(1).name, "simt");
    EXPECT_EQ(e.for_rows(63).name, "simt");
    EXPECT_EQ(e.for_rows(64).name, "dequant_bf16_lt");
    EXPECT_EQ(e.for_rows(4096).name, "dequant_bf16_lt");
    return;
  }
  FAIL() << "no wq_a site";
}

// A few-rows implementation (max_rows) takes rows [0, max_rows] ahead of the others' regimes,
// which then start after it; it is never a site's only choice.
TEST(KernelPlan, FewRowsRegimeComesFirst) {
  const KernelPlan fast = plan_of(kV41, BackendKind::CUDA, Numerics::Fast);
  EXPECT_EQ(impls(fast, "linear", "attn.wq_a"), (V{"gemv", "simt", "dequant_bf16_lt"}));
  for (const PlanEntry& e : fast.entries()) {
    if (e.site.op == "linear" && e.site.where.find("attn.wq_a") != std::string::npos) {
      EXPECT_EQ(e.for_rows(1).name, "gemv");
      EXPECT_EQ(e.for_rows(8).name, "gemv");
      EXPECT_EQ(e.for_rows(9).name, "simt");
      EXPECT_EQ(e.for_rows(63).name, "simt");
      EXPECT_EQ(e.for_rows(64).name, "dequant_bf16_lt");
      EXPECT_NE(fast.table().find("| 0..8 | gemv |"), std::string::npos) << fast.table();
      EXPECT_NE(fast.table().find("| 9..63 | simt |"), std::string::npos) << fast.table();
    }
    if (e.site.op == "moe_experts") {
      EXPECT_EQ(e.for_rows(64).name, "gemv_fp8");
      EXPECT_EQ(e.for_rows(65).name, "wgmma");
    }
  }
  // Official numerics keep the exact kernels.
  const KernelPlan off = plan_of(kV41, BackendKind::CUDA, Numerics::Official);
  EXPECT_EQ(impls(off, "linear", "attn.wq_a"), (V{"simt", "dequant_bf16_lt"}));
  // A forced implementation with a preferred start (min_rows) runs every row count.
  BackendOptions lt;
  lt.force["grouped_linear"] = "dequant_bf16_lt_split";
  const KernelPlan forced = plan_of(kV4, BackendKind::CUDA, Numerics::Official, lt);
  EXPECT_EQ(impls(forced, "grouped_linear", "attn.wo_a"), (V{"dequant_bf16_lt_split"}));
  // A forced few-rows implementation runs the rows it can; the plan's own regimes the rest (the
  // same-job baseline of a planned few-rows kernel).
  BackendOptions o;
  o.force["moe_experts"] = "gemv";
  const KernelPlan fg = plan_of(kV4, BackendKind::CUDA, Numerics::Fast, o);
  EXPECT_EQ(impls(fg, "moe_experts", "ffn.experts"), (V{"gemv", "wgmma"}));
  for (const PlanEntry& e : fg.entries())
    if (e.site.op == "moe_experts") {
      EXPECT_EQ(e.for_rows(1).name, "gemv");
      EXPECT_EQ(e.for_rows(64).name, "gemv");
      EXPECT_EQ(e.for_rows(65).name, "wgmma");
    }
}

TEST(KernelPlan, BackendRefusesAnUnplannedSite) {
  auto be = make_backend(BackendKind::CPU);
  const ModelConfig cfg = load_model_config(kV4);
  be->install_plan(be->make_plan(model_op_sites(cfg, Numerics::Official, {0}), Numerics::Official));
  EXPECT_EQ(be->numerics(), Numerics::Official);
  Weight w;
  w.kind = Weight::Kind::BF16;
  w.out = 3;
  w.in = 5;  // no site of the model has a [3 x 5] weight
  const std::string msg =
      error_of([&] { be->impl_for(linear_site(w, 0, DType::F32, DType::F32, Numerics::Official), 1); });
  EXPECT_NE(msg.find("op site not in the kernel plan"), std::string::npos) << msg;
  // Lazy mode (op-level tests): resolved on first use.
  be->set_numerics(Numerics::Fast);
  EXPECT_EQ(be->impl_for(linear_site(w, 0, DType::BF16, DType::BF16, Numerics::Fast), 1).name, "reference");
}

TEST(KernelPlan, RegistryMarkdownListsEveryImplementation) {
  const std::string md = registry_markdown(kernel_registry(BackendKind::CUDA), "cuda");
  for (const KernelImpl& k : kernel_registry(BackendKind::CUDA))
    EXPECT_NE(md.find("`" + k.name + "`"), std::string::npos) << k.op << " " << k.name;
}

TEST(KernelPlan, V41DsparkSitesOnCuda) {
  // With the DSpark drafter (load_mtp) V4.1-Flash's plan resolves on CUDA in both quantizing
  // modes; the draft block's non-causal attention is a site of its own (its key differs from the
  // window-only layers'), run by the same kernels as the backbone's (the mask is a flag).
  const ModelConfig cfg = load_model_config(kV41);
  for (Numerics n : {Numerics::Official, Numerics::Fast}) {
    SCOPED_TRACE(numerics_name(n));
    const KernelPlan p = resolve_plan(kernel_registry(BackendKind::CUDA), "cuda", model_op_sites(cfg, n, {}, true), n, {});
    int non_causal = 0;
    for (const PlanEntry& e : p.entries())
      if (e.site.op == "sparse_attention" && e.site.non_causal) {
        ++non_causal;
        EXPECT_NE(e.site.where.find("DSpark attention"), std::string::npos) << e.site.where;
        EXPECT_EQ(e.impls[0]->name, n == Numerics::Fast ? "flash_bf16" : "mma_split_bf16");
      }
    EXPECT_EQ(non_causal, 1);
    EXPECT_FALSE(impls(p, "linear", "DSpark confidence_head").empty());
    EXPECT_FALSE(impls(p, "linear", "DSpark markov_head").empty());
    // Without the drafter no such site.
    const KernelPlan q = resolve_plan(kernel_registry(BackendKind::CUDA), "cuda", model_op_sites(cfg, n), n, {});
    for (const PlanEntry& e : q.entries()) EXPECT_FALSE(e.site.non_causal) << e.site.where;
  }
}
