// Dispatch of the CUTLASS FP8 configurations (gemm_cutlass.h); each lives in its own
// translation unit (gemm_cutlass_m128.cu, gemm_cutlass_m64.cu, gemm_cutlass_swap.cu).
#include "kernels/cuda/gemm_cutlass.h"

#include "core/check.h"

namespace dil::cuda {

size_t cutlass_fp8_workspace_m128(const CutlassFp8Gemm& g);
bool cutlass_fp8_run_m128(const CutlassFp8Gemm& g, void* ws, cudaStream_t s);
size_t cutlass_fp8_workspace_m64(const CutlassFp8Gemm& g);
bool cutlass_fp8_run_m64(const CutlassFp8Gemm& g, void* ws, cudaStream_t s);
size_t cutlass_fp8_workspace_swap(const CutlassFp8Gemm& g);
bool cutlass_fp8_run_swap(const CutlassFp8Gemm& g, void* ws, cudaStream_t s);

const char* cutlass_tile_name(CutlassTile t) {
  switch (t) {
    case CutlassTile::M128: return "m128";
    case CutlassTile::M64: return "m64";
    case CutlassTile::Swap: return "swap";
  }
  DIL_FAIL("cutlass_tile_name: unknown configuration");
}

size_t cutlass_fp8_workspace(CutlassTile t, const CutlassFp8Gemm& g) {
  switch (t) {
    case CutlassTile::M128: return cutlass_fp8_workspace_m128(g);
    case CutlassTile::M64: return cutlass_fp8_workspace_m64(g);
    case CutlassTile::Swap: return cutlass_fp8_workspace_swap(g);
  }
  DIL_FAIL("cutlass_fp8_workspace: unknown configuration");
}

bool cutlass_fp8_run(CutlassTile t, const CutlassFp8Gemm& g, void* workspace, size_t workspace_bytes,
                     cudaStream_t stream) {
  DIL_CHECK(workspace_bytes >= cutlass_fp8_workspace(t, g), "cutlass_fp8_run: workspace of ", workspace_bytes,
            " bytes, ", cutlass_fp8_workspace(t, g), " needed");
  DIL_CHECK(g.n % 128 == 0 && g.k % 128 == 0 && g.m % 4 == 0, "cutlass_fp8_run: m ", g.m, " n ", g.n, " k ", g.k,
            " (n, k multiples of 128, m of 4)");
  switch (t) {
    case CutlassTile::M128: return cutlass_fp8_run_m128(g, workspace, stream);
    case CutlassTile::M64: return cutlass_fp8_run_m64(g, workspace, stream);
    case CutlassTile::Swap: return cutlass_fp8_run_swap(g, workspace, stream);
  }
  DIL_FAIL("cutlass_fp8_run: unknown configuration");
}

}  // namespace dil::cuda
