// Memory ops, embedding lookup and elementwise add of the CPU backend, plus the shared
// tensor checks.
#include <cstring>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"

namespace dil {

namespace cpu {
void check_f32(const Tensor& t, const char* what) {
  DIL_CHECK(!t.empty() && t.device == Device::CPU && t.dtype == DType::F32, what,
            ": expected a host f32 tensor, got dtype ", dtype_name(t.dtype), " ", t.shape_str());
}
void check_i32(const Tensor& t, const char* what) {
  DIL_CHECK(!t.empty() && t.device == Device::CPU && t.dtype == DType::I32, what,
            ": expected a host i32 tensor, got dtype ", dtype_name(t.dtype), " ", t.shape_str());
}
}  // namespace cpu

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

Buffer CpuBackend::alloc(size_t bytes) { return host_alloc(bytes); }

void CpuBackend::upload(Tensor dst, const void* host_src) {
  if (dst.nbytes()) std::memcpy(dst.data, host_src, dst.nbytes());
}

void CpuBackend::download(void* host_dst, const Tensor& src) {
  if (src.nbytes()) std::memcpy(host_dst, src.data, src.nbytes());
}

void CpuBackend::fill(Tensor t, float value) {
  cpu::check_f32(t, "fill");
  float* p = t.ptr<float>();
  for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = value;
}

void CpuBackend::copy(Tensor dst, const Tensor& src) {
  DIL_CHECK(dst.nbytes() == src.nbytes(), "copy: ", dst.nbytes(), " != ", src.nbytes(), " bytes");
  if (dst.nbytes() && dst.data != src.data) std::memmove(dst.data, src.data, dst.nbytes());
}

// out[t, :] = table[ids[t], :] as f32 (table BF16 or F32 [V, D]; ids [T] i32; out [T, D] f32).
void CpuBackend::embed(const Weight& table, const Tensor& ids, Tensor out) {
  cpu::check_i32(ids, "embed ids");
  cpu::check_f32(out, "embed out");
  const int64_t V = table.w.size(0), D = table.w.size(1), T = ids.numel();
  DIL_CHECK(out.numel() == T * D, "embed: out ", out.shape_str(), " for ", T, " ids of width ", D);
  const int32_t* id = ids.ptr<int32_t>();
  float* o = out.ptr<float>();
  for (int64_t t = 0; t < T; ++t) {
    DIL_CHECK(id[t] >= 0 && id[t] < V, "embed: token id ", id[t], " outside [0, ", V, ")");
    if (table.w.dtype == DType::BF16) {
      const uint16_t* row = table.w.ptr<uint16_t>() + int64_t(id[t]) * D;
      for (int64_t c = 0; c < D; ++c) o[t * D + c] = bf16_to_f32(row[c]);
    } else {
      DIL_CHECK(table.w.dtype == DType::F32, "embed: table must be BF16 or F32");
      std::memcpy(o + t * D, table.w.ptr<float>() + int64_t(id[t]) * D, size_t(D) * 4);
    }
  }
}

// out = a + b elementwise (f32, same element count; out may alias a or b).
void CpuBackend::add(const Tensor& a, const Tensor& b, Tensor out) {
  cpu::check_f32(a, "add a");
  cpu::check_f32(b, "add b");
  cpu::check_f32(out, "add out");
  DIL_CHECK(a.numel() == b.numel() && a.numel() == out.numel(), "add: sizes differ");
  const float *pa = a.ptr<float>(), *pb = b.ptr<float>();
  float* po = out.ptr<float>();
  for (int64_t i = 0, n = out.numel(); i < n; ++i) po[i] = pa[i] + pb[i];
}

}  // namespace dil
