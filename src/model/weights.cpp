#include "model/weights.h"

#include "model/load_meter.h"

namespace dil {

void WeightBinder::count(const StEntry& e) {
  if (meter_) meter_->bound(e.nbytes);
}

Weight matrix_format(const std::string& name, DType dtype, const std::vector<int64_t>& shape, int weight_block) {
  DIL_CHECK(shape.size() == 2, name, ": a matrix must be 2-d");
  Weight w;
  w.out = shape[0];
  switch (dtype) {
    case DType::F8E4M3:
      w.kind = Weight::Kind::FP8;
      w.in = shape[1];
      w.block_out = w.block_in = weight_block;
      break;
    case DType::I8:
      w.kind = Weight::Kind::FP4;
      w.in = shape[1] * 2;
      w.block_out = 1;
      w.block_in = 32;
      break;
    case DType::BF16: w.kind = Weight::Kind::BF16; w.in = shape[1]; break;
    case DType::F32: w.kind = Weight::Kind::F32; w.in = shape[1]; break;
    default: DIL_FAIL("tensor ", name, ".weight: unsupported dtype ", dtype_name(dtype));
  }
  return w;
}

Weight WeightBinder::matrix(const std::string& name) {
  const StEntry& e = st_.at(name + ".weight");
  Weight w;
  try {
    w = matrix_format(name, e.dtype, e.shape, cfg_.weight_block);
  } catch (const Error& err) {
    DIL_FAIL(err.what(), " (in ", e.file, ")");
  }
  w.w = e.tensor();
  const bool scaled = w.kind == Weight::Kind::FP8 || w.kind == Weight::Kind::FP4;
  if (scaled) w.scale = st_.at(name + ".scale").tensor();
  Weight dev = be_.adopt_weight(w);
  count(e);
  if (scaled) count(st_.at(name + ".scale"));
  return dev;
}

Tensor WeightBinder::tensor(const std::string& name) {
  const StEntry& e = st_.at(name);
  Tensor dev = be_.adopt_tensor(e.tensor());
  count(e);
  return dev;
}

Tensor WeightBinder::table_i32(const std::string& name) {
  const StEntry& e = st_.at(name);
  DIL_CHECK(e.dtype == DType::I64 && e.shape.size() == 2, name, ": expected a 2-d I64 table");
  Buffer b = host_alloc(size_t(e.numel()) * 4);
  const int64_t* src = reinterpret_cast<const int64_t*>(e.data);
  int32_t* dst = static_cast<int32_t*>(b.data());
  for (int64_t i = 0; i < e.numel(); ++i) {
    if (src[i] < 0 || src[i] >= cfg_.n_routed)
      DIL_FAIL("tensor ", name, " in ", e.file, ": expert id ", src[i], " out of range [0, ", cfg_.n_routed, ")");
    dst[i] = int32_t(src[i]);
  }
  Tensor t(b.data(), DType::I32, {e.shape[0], e.shape[1]});
  owned_.push_back(std::move(b));
  Tensor dev = be_.adopt_tensor(t);
  count(e);  // the checkpoint's bytes, as expected_load counts them
  return dev;
}

}  // namespace dil
