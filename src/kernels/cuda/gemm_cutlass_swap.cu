// CUTLASS FP8 blockwise GEMM run transposed (swap-AB: the weight rows fill the 128-row MMA tile,
// the tokens a 64-wide N tile), cooperative, stream-K (gemm_cutlass.cuh): problems of few
// tokens, where a token-major tile idles most of its MMA rows and the output tiles are too few
// to fill the GPU without splitting K.
#include "kernels/cuda/gemm_cutlass.cuh"

namespace dil::cuda {
namespace {
using C = cutlass_fp8::Config<cute::Shape<cute::_128, cute::_64, cute::_128>, cute::Shape<cute::_1, cute::_1, cute::_1>,
                              cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise,
                              cutlass::epilogue::TmaWarpSpecializedCooperative, true, cutlass::gemm::StreamKScheduler>;
}  // namespace

size_t cutlass_fp8_workspace_swap(const CutlassFp8Gemm& g) { return C::workspace(g); }
bool cutlass_fp8_run_swap(const CutlassFp8Gemm& g, void* ws, cudaStream_t s) { return C::run(g, ws, s); }

}  // namespace dil::cuda
