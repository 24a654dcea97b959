// Per-step temporaries: every activation of a forward step is allocated here and released
// together when the step ends.
#pragma once
#include <initializer_list>
#include <vector>

#include "backend/backend.h"

namespace dil {

class Scratch {
 public:
  explicit Scratch(Backend& be) : be_(be) {}
  Tensor f32(std::initializer_list<int64_t> dims) { return make(DType::F32, dims); }
  Tensor i32(std::initializer_list<int64_t> dims) { return make(DType::I32, dims); }
  // An activation of the model's numerics (activation_dtype: bf16 in fast, else f32).
  Tensor make(DType t, std::initializer_list<int64_t> dims) {
    Tensor v(nullptr, t, dims, be_.device());
    Buffer b = be_.alloc_scratch(std::max<size_t>(v.nbytes(), 4));  // every op writes its outputs whole
    v.data = b.data();
    bufs_.push_back(std::move(b));
    return v;
  }
  std::vector<Buffer>* storage() { return &bufs_; }

 private:
  Backend& be_;
  std::vector<Buffer> bufs_;
};

}  // namespace dil
