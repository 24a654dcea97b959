#include "kernels/cpu/registry.h"

namespace dil {
namespace {

std::vector<std::string> any_act(const OpSite& s) {
  const bool ok = (s.act == DType::F32 || s.act == DType::BF16) && (s.out == DType::F32 || s.out == DType::BF16);
  return {need(ok, "f32 or bf16 activations")};
}

std::vector<KernelImpl> build() {
  const char* families[] = {"linear",     "grouped_linear", "sparse_attention", "indexer_topk", "moe_experts",
                            "embed",      "add",            "rms_norm",         "rope",         "fp8_qdq",
                            "fp4_qdq",    "hadamard",       "hc_mix",           "hc_collapse",  "hc_post",
                            "hc_expand",  "hc_pre",  "ring_write",     "paged_write",      "compressor",   "moe_route",
                            "swiglu",     "engram_mix"};
  Tolerance reference;
  reference.reference = true;  // the specification: exact against itself
  std::vector<KernelImpl> r;
  for (const char* f : families)
    r.push_back({f, "reference",
                 "plain loops, reductions in double rounded once, outputs rounded once to their dtype (formula in "
                 "src/kernels/cpu)",
                 any_act, 0, reference, "src/kernels/cpu"});
  return r;
}

}  // namespace

const std::vector<KernelImpl>& cpu_kernel_registry() {
  static const std::vector<KernelImpl> r = build();  // immutable after construction
  return r;
}

}  // namespace dil
