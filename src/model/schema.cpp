#include "model/schema.h"

#include <map>

#include "core/check.h"

namespace dil {

size_t TensorSpec::nbytes() const {
  size_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= size_t(d);
  return n;
}

std::vector<TensorSpec> expected_tensors(const ModelConfig& cfg, bool with_mtp) {
  return cfg.arch == Arch::V4 ? expected_tensors_v4(cfg, with_mtp) : expected_tensors_v41(cfg, with_mtp);
}

namespace {
std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}
}  // namespace

ValidationReport validate_checkpoint(const SafeTensors& st, const std::vector<TensorSpec>& specs) {
  ValidationReport r;
  std::map<std::string, const TensorSpec*> want;
  for (const auto& s : specs) want[s.name] = &s;
  for (const auto& s : specs) {
    const StEntry* e = st.find(s.name);
    if (!e) {
      r.errors.push_back(str_cat("missing tensor ", s.name, " (expected ", dtype_name(s.dtype), " ",
                                 shape_str(s.shape), ")"));
      continue;
    }
    if (e->dtype != s.dtype)
      r.errors.push_back(str_cat("tensor ", s.name, " in ", e->file, ": dtype ", dtype_name(e->dtype), ", expected ",
                                 dtype_name(s.dtype)));
    if (e->shape != s.shape)
      r.errors.push_back(str_cat("tensor ", s.name, " in ", e->file, ": shape ", shape_str(e->shape), ", expected ",
                                 shape_str(s.shape), " from config.json"));
    r.n_tensors++;
    r.total_bytes += e->nbytes;
  }
  for (const auto& [name, e] : st.entries())
    if (!want.count(name)) r.errors.push_back(str_cat("unexpected tensor ", name, " in ", e.file, " (not in the model's schema)"));
  return r;
}

}  // namespace dil
