// The CUTLASS kernel type behind gemm_cutlass.h, parameterised by CTA tile, cluster and
// schedule; each gemm_cutlass_*.cu instantiates exactly one (compile time ~1 min each).
// Built from CUTLASS example 67 (groupwise scaling): e4m3 A (activations, K-major) and B
// (weight rows, K-major), f32 scale factors with granularity 1 x 128 for A (M-major) and
// 128 x 128 for B (K-major), f32 accumulation promoted every 128 K, bf16 D row-major, no C.
#pragma once
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/numeric_types.h"
#include "cutlass/util/packed_stride.hpp"
#include <type_traits>
#include "kernels/cuda/gemm_cutlass.h"

namespace dil::cuda::cutlass_fp8 {

using namespace cute;

// kSwapAB: the GEMM runs transposed, D^T [n, m] = W [n, k] . X^T, so that the weight rows fill
// the 128-row MMA tile and the few tokens the narrow N tile (decode and small prefill chunks);
// D^T column-major is D row-major. Scheduler: the persistent data-parallel scheduler (void) or
// stream-K (splits K over CTAs when the output tiles are too few to fill the GPU; the partial
// f32 accumulators of one tile meet in a fixed order).
template <class TileShape, class ClusterShape, class KernelSchedule, class EpilogueSchedule, bool kSwapAB = false,
          class Scheduler = void>
struct Config {
  using ElementA = cutlass::float_e4m3_t;
  using ElementB = cutlass::float_e4m3_t;
  using ElementD = cutlass::bfloat16_t;
  using LayoutA = cutlass::layout::RowMajor;     // [m, k] (swapped: the weight [n, k])
  using LayoutB = cutlass::layout::ColumnMajor;  // [k, n] column-major = the [n, k] weight rows (swapped: x)
  using LayoutD = std::conditional_t<kSwapAB, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr int kAlignAB = 16, kAlignD = 8;  // 16-byte accesses
  using Accum = float;
  // Scale granularity (rows of A, rows of B, K) and majorness: the activations' scales are per
  // token and 128 K, tokens fastest; the weight's per 128 x 128 block, K blocks fastest.
  using ScaleConfig = std::conditional_t<
      kSwapAB, cutlass::detail::Sm90BlockwiseScaleConfig<128, 1, 128, cute::GMMA::Major::K, cute::GMMA::Major::MN>,
      cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128, cute::GMMA::Major::MN, cute::GMMA::Major::K>>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, Accum, Accum, void, LayoutD, kAlignD, ElementD, LayoutD,
      kAlignD, EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<ElementD, Accum, void, Accum>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, cute::tuple<LayoutA, LayoutSFA>, kAlignAB,
      ElementB, cute::tuple<LayoutB, LayoutSFB>, kAlignAB, Accum, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, Scheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments arguments(const CutlassFp8Gemm& g) {
    using StrideA = typename Gemm::GemmKernel::StrideA;
    using StrideB = typename Gemm::GemmKernel::StrideB;
    using StrideD = typename Gemm::GemmKernel::StrideD;
    // The problem as CUTLASS sees it: (M, N) = (tokens, weight rows), or swapped.
    const int pm = kSwapAB ? g.n : g.m, pn = kSwapAB ? g.m : g.n;
    const void* pa = kSwapAB ? g.b : g.a;
    const void* pb = kSwapAB ? g.a : g.b;
    const float* psa = kSwapAB ? g.sfb : g.sfa;
    const float* psb = kSwapAB ? g.sfa : g.sfb;
    auto sa = cutlass::make_cute_packed_stride(StrideA{}, cute::make_shape(pm, g.k, 1));
    auto sb = cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(pn, g.k, 1));
    auto sd = cutlass::make_cute_packed_stride(StrideD{}, cute::make_shape(pm, pn, 1));
    auto lsfa = ScaleConfig::tile_atom_to_shape_SFA(make_shape(pm, pn, g.k, 1));
    auto lsfb = ScaleConfig::tile_atom_to_shape_SFB(make_shape(pm, pn, g.k, 1));
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {pm, pn, g.k, 1},
                                  {static_cast<const ElementA*>(pa), sa, static_cast<const ElementB*>(pb), sb,
                                   psa, lsfa, psb, lsfb},
                                  {{}, nullptr, sd, static_cast<ElementD*>(g.d), sd}};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    return args;
  }
  static size_t workspace(const CutlassFp8Gemm& g) { return Gemm::get_workspace_size(arguments(g)); }
  static bool run(const CutlassFp8Gemm& g, void* ws, cudaStream_t stream) {
    Gemm gemm;
    auto args = arguments(g);
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return false;
    if (gemm.initialize(args, ws, stream) != cutlass::Status::kSuccess) return false;
    return gemm.run(stream) == cutlass::Status::kSuccess;
  }
};

}  // namespace dil::cuda::cutlass_fp8
