// Memory ops, embedding lookup and elementwise add of the CPU backend, plus the shared
// tensor checks.
#include <sys/mman.h>

#include <cstring>

#include "core/host_memory.h"

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/registry.h"
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
void check_act(const Tensor& t, const char* what) {
  DIL_CHECK(!t.empty() && t.device == Device::CPU && (t.dtype == DType::F32 || t.dtype == DType::BF16), what,
            ": expected a host f32 or bf16 tensor, got dtype ", dtype_name(t.dtype), " ", t.shape_str());
}

const float* act_row(const Tensor& t, int64_t i, int64_t d, float* tmp) {
  if (t.dtype == DType::F32) return t.ptr<float>() + i * d;
  const uint16_t* src = t.ptr<uint16_t>() + i * d;
  for (int64_t c = 0; c < d; ++c) tmp[c] = bf16_to_f32(src[c]);
  return tmp;
}

void set_act_row(Tensor& t, int64_t i, int64_t d, const float* v) {
  if (t.dtype == DType::F32) {
    std::memcpy(t.ptr<float>() + i * d, v, size_t(d) * 4);
    return;
  }
  uint16_t* dst = t.ptr<uint16_t>() + i * d;
  for (int64_t c = 0; c < d; ++c) dst[c] = f32_to_bf16(v[c]);
}

void check_kv(const Tensor& t, const kvpack::RowShape& pack, int64_t d, const char* what) {
  if (!pack.packed()) {
    check_act(t, what);
    DIL_CHECK(t.ndim == 3 && t.size(2) == d, what, ": ", t.shape_str(), " for rows of ", d);
    return;
  }
  DIL_CHECK(!t.empty() && t.device == Device::CPU && t.dtype == DType::U8 && t.ndim == 3 &&
                t.size(2) == int64_t(kvpack::row_bytes(pack)) && pack.d == d,
            what, ": expected packed rows U8 [n, rows, ", kvpack::row_bytes(pack), "] of ", pack.d, " values for ", d,
            ", got ", dtype_name(t.dtype), " ", t.shape_str());
}

const float* kv_row(const Tensor& t, const kvpack::RowShape& pack, int64_t i, int64_t d, float* tmp) {
  if (!pack.packed()) return act_row(t, i, d, tmp);
  kvpack::unpack_row(pack, t.ptr<uint8_t>() + size_t(i) * size_t(t.size(2)), tmp);
  return tmp;
}

void set_kv_row(Tensor& t, const kvpack::RowShape& pack, int64_t i, int64_t d, const float* v) {
  if (!pack.packed()) return set_act_row(t, i, d, v);
  kvpack::pack_row(pack, v, t.ptr<uint8_t>() + size_t(i) * size_t(t.size(2)));
}

Staged::Staged(const Tensor& t0, const char* what, bool write) : orig_(t0), write_(write) {
  check_act(t0, what);
  t = t0;
  if (t0.dtype == DType::F32) return;
  copy_ = host_alloc(std::max<size_t>(size_t(t0.numel()) * 4, 4));
  t.data = copy_.data();
  t.dtype = DType::F32;
  const uint16_t* src = t0.ptr<uint16_t>();
  float* dst = t.ptr<float>();
  for (int64_t i = 0; i < t0.numel(); ++i) dst[i] = bf16_to_f32(src[i]);
}

void Staged::flush() {
  if (!write_ || orig_.dtype == DType::F32 || copy_.data() == nullptr) return;
  write_ = false;
  const float* src = t.ptr<float>();
  uint16_t* dst = orig_.ptr<uint16_t>();
  for (int64_t i = 0; i < orig_.numel(); ++i) dst[i] = f32_to_bf16(src[i]);
}

}  // namespace cpu

const std::vector<KernelImpl>& CpuBackend::kernels() const { return cpu_kernel_registry(); }

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& o) { return std::make_unique<CpuBackend>(o); }

// Large buffers (KV pools, weights of dummy models) are anonymous mappings: the kernel hands
// out zero pages on first touch, so a pool sized for the limits costs only what sequences write
// (a memset would make every pool, and every engine a test starts, resident at once).
Buffer CpuBackend::alloc(size_t bytes) {
  constexpr size_t kMapFrom = size_t(1) << 20;
  if (bytes < kMapFrom) return host_alloc(bytes);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  DIL_CHECK(p != MAP_FAILED, "host allocation of ", bytes, " bytes failed (mmap)");
  return Buffer(p, bytes, Device::CPU, [bytes](void* q) { ::munmap(q, bytes); });
}

// Zero-filled as alloc gives it (the CPU's fill costs no launch), or poisoned for tests.
Buffer CpuBackend::alloc_scratch(size_t bytes) {
  Buffer b = alloc(bytes);
  if (options().poison_scratch && bytes) std::memset(b.data(), 0xff, bytes);
  return b;
}

Backend::MemoryInfo CpuBackend::memory_info() {
  const HostMemory h = host_memory();
  MemoryInfo m;
  m.total = h.total;
  m.available = h.available;
  return m;
}

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

// out[t, :] = table[ids[t], :] (table BF16 or F32 [V, D]; ids [T] i32; out [T, D] f32|bf16).
void CpuBackend::embed(const Weight& table, const Tensor& ids, Tensor out) {
  cpu::check_i32(ids, "embed ids");
  cpu::Staged so(out, "embed out", true);
  const int64_t V = table.w.size(0), D = table.w.size(1), T = ids.numel();
  DIL_CHECK(out.numel() == T * D, "embed: out ", out.shape_str(), " for ", T, " ids of width ", D);
  const int32_t* id = ids.ptr<int32_t>();
  float* o = so.f();
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

// out = a + b elementwise in f32 (each f32|bf16, same element count; out may alias a or b),
// rounded once to out's dtype.
void CpuBackend::add(const Tensor& a, const Tensor& b, Tensor out) {
  cpu::Staged sa(a, "add a"), sb(b, "add b"), so(out, "add out", true);
  DIL_CHECK(a.numel() == b.numel() && a.numel() == out.numel(), "add: sizes differ");
  const float *pa = sa.f(), *pb = sb.f();
  float* po = so.f();
  for (int64_t i = 0, n = out.numel(); i < n; ++i) po[i] = pa[i] + pb[i];
}

}  // namespace dil
