// Row launchers of kv_packed.cuh: one warp per scale block (pack), one thread per dim (unpack).
#include "kernels/cuda/kv_packed.cuh"
#include "kernels/cuda/kv_packed.h"

namespace dil::cuda {
namespace {

__global__ void pack_rows_kernel(KvRow s, const float* x, int64_t R, uint8_t* rows) {
  const int nb = kv_scale_blocks(s);
  const int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;  // one warp per (row, block)
  if (i >= R * nb) return;  // whole warps return: kv_pack_block's shuffles see all 32 lanes
  const int64_t r = i / nb;
  kv_pack_block(s, x + r * s.d, int(i % nb), rows + r * kv_row_bytes(s), int(threadIdx.x & 31));
}

__global__ void unpack_rows_kernel(KvRow s, const uint8_t* rows, int64_t R, float* x) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= R * s.d) return;
  const int64_t r = i / s.d;
  x[i] = kv_unpack_one(s, rows + r * kv_row_bytes(s), int(i % s.d));
}

KvRow dev_shape(const kvpack::RowShape& s) {
  (void)kvpack::row_bytes(s);  // checks the shape
  return {s.format, s.d, s.rope};
}

}  // namespace

void kv_pack_rows(kvpack::RowShape s, const float* x, int64_t R, uint8_t* rows, void* stream) {
  const KvRow k = dev_shape(s);
  const int64_t n = R * kv_scale_blocks(k);
  if (n == 0) return;
  pack_rows_kernel<<<grid_for(n * 32, 128), 128, 0, cudaStream_t(stream)>>>(k, x, R, rows);
  DIL_CUDA(cudaGetLastError());
}

void kv_unpack_rows(kvpack::RowShape s, const uint8_t* rows, int64_t R, float* x, void* stream) {
  const KvRow k = dev_shape(s);
  const int64_t n = R * k.d;
  if (n == 0) return;
  unpack_rows_kernel<<<grid_for(n, 256), 256, 0, cudaStream_t(stream)>>>(k, rows, R, x);
  DIL_CUDA(cudaGetLastError());
}

}  // namespace dil::cuda
