// CUTLASS FP8 blockwise GEMM, 128x128x128 tiles, 2-CTA clusters along N, cooperative
// persistent kernel (gemm_cutlass.cuh): the prefill-sized configuration.
#include "kernels/cuda/gemm_cutlass.cuh"

namespace dil::cuda {
namespace {
using C = cutlass_fp8::Config<cute::Shape<cute::_128, cute::_128, cute::_128>, cute::Shape<cute::_1, cute::_2, cute::_1>,
                              cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise,
                              cutlass::epilogue::TmaWarpSpecializedCooperative>;
}  // namespace

size_t cutlass_fp8_workspace_m128(const CutlassFp8Gemm& g) { return C::workspace(g); }
bool cutlass_fp8_run_m128(const CutlassFp8Gemm& g, void* ws, cudaStream_t s) { return C::run(g, ws, s); }

}  // namespace dil::cuda
