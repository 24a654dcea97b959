// CUTLASS FP8 blockwise GEMM, 64x128x128 tiles, no cluster, ping-pong persistent kernel
// (gemm_cutlass.cuh): problems of few rows, where a 128-row tile would idle half its MMAs.
#include "kernels/cuda/gemm_cutlass.cuh"

namespace dil::cuda {
namespace {
using C = cutlass_fp8::Config<cute::Shape<cute::_64, cute::_128, cute::_128>, cute::Shape<cute::_1, cute::_1, cute::_1>,
                              cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8Blockwise,
                              cutlass::epilogue::TmaWarpSpecialized>;
}  // namespace

size_t cutlass_fp8_workspace_m64(const CutlassFp8Gemm& g) { return C::workspace(g); }
bool cutlass_fp8_run_m64(const CutlassFp8Gemm& g, void* ws, cudaStream_t s) { return C::run(g, ws, s); }

}  // namespace dil::cuda
