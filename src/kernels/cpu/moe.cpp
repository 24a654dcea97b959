// MoE routing (sqrt-softplus scores, hash or biased top-k), routed experts and SwiGLU
// (model-spec §3.8, §4.4).
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"

namespace dil {

namespace cpu {
float silu_f(float x) { return float(double(x) / (1.0 + std::exp(-double(x)))); }
}  // namespace cpu

namespace {
// torch.nn.functional.softplus (beta 1, threshold 20) followed by sqrt, in double, rounded once.
float sqrt_softplus(float l) {
  const double x = l;
  return float(std::sqrt(x > 20.0 ? x : std::log1p(std::exp(x))));
}

// h = silu(min(g, lim)) * clamp(u, -lim, lim) [* w], each step an f32 operation (official order).
float swiglu_one(float g, float u, float lim) {
  u = std::clamp(u, -lim, lim);
  g = std::min(g, lim);
  return cpu::silu_f(g) * u;
}
}  // namespace

// logits [T, E] -> out_w [T, k] f32, out_idx [T, k] i32. s = sqrt(softplus(l)).
// Hash layers (tid2eid [V, k] i32 non-empty): idx = tid2eid[ids[t], :] in table order.
// Otherwise idx = top-k of the f32 sums s + bias, exact ties to the lowest expert index, in
// descending order. w_i = s_{idx_i} / (f32(sum_k s_{idx_k}) + norm_eps) * route_scale, the sum
// in double rounded once, the rest f32.
void CpuBackend::moe_route(const MoeRouteArgs& a) {
  cpu::check_f32(a.logits, "moe_route logits");
  cpu::check_f32(a.out_w, "moe_route out_w");
  cpu::check_i32(a.out_idx, "moe_route out_idx");
  const int64_t T = cpu::n_rows(a.logits), E = cpu::last_dim(a.logits);
  const int k = a.topk;
  DIL_CHECK(a.out_w.numel() == T * k && a.out_idx.numel() == T * k, "moe_route: outputs for k ", k);
  const bool hash = !a.tid2eid.empty();
  if (hash) {
    cpu::check_i32(a.ids, "moe_route ids");
    DIL_CHECK(a.tid2eid.dtype == DType::I32 && a.tid2eid.size(1) == k && a.ids.numel() == T,
              "moe_route: tid2eid ", a.tid2eid.shape_str(), " ids ", a.ids.shape_str());
  } else {
    cpu::check_f32(a.bias, "moe_route bias");
    DIL_CHECK(a.bias.numel() == E && k <= E, "moe_route: bias ", a.bias.shape_str(), " for ", E, " experts");
    if (!a.image_mask.empty()) {
      cpu::check_i32(a.image_mask, "moe_route image_mask");
      cpu::check_f32(a.bias_vl, "moe_route bias_vl");
      DIL_CHECK(a.image_mask.numel() == T && a.bias_vl.numel() == E, "moe_route: image_mask ",
                a.image_mask.shape_str(), " bias_vl ", a.bias_vl.shape_str());
    }
  }
  std::vector<float> s(static_cast<size_t>(E)), sel(static_cast<size_t>(E));  // [E]
  std::vector<int32_t> order(static_cast<size_t>(E));           // [E]
  for (int64_t t = 0; t < T; ++t) {
    const float* l = a.logits.ptr<float>() + t * E;
    for (int64_t e = 0; e < E; ++e) s[e] = sqrt_softplus(l[e]);
    int32_t* idx = a.out_idx.ptr<int32_t>() + t * k;
    if (hash) {
      const int32_t id = a.ids.ptr<int32_t>()[t];
      DIL_CHECK(id >= 0 && id < a.tid2eid.size(0), "moe_route: token id ", id);
      for (int i = 0; i < k; ++i) {
        idx[i] = a.tid2eid.ptr<int32_t>()[int64_t(id) * k + i];
        DIL_CHECK(idx[i] >= 0 && idx[i] < E, "moe_route: tid2eid expert ", idx[i]);
      }
    } else {
      // Image-span tokens select with bias_vl (V4.1, model-spec §4.4).
      const bool vl = !a.image_mask.empty() && a.image_mask.ptr<int32_t>()[t] != 0;
      const float* bias = vl ? a.bias_vl.ptr<float>() : a.bias.ptr<float>();
      for (int64_t e = 0; e < E; ++e) sel[e] = s[e] + bias[e];
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t x, int32_t y) {
        return sel[x] != sel[y] ? sel[x] > sel[y] : x < y;
      });
      std::copy(order.begin(), order.begin() + k, idx);
    }
    double sum = 0.0;
    for (int i = 0; i < k; ++i) sum += s[idx[i]];
    const float den = float(sum) + a.norm_eps;
    float* w = a.out_w.ptr<float>() + t * k;
    for (int i = 0; i < k; ++i) w[i] = s[idx[i]] / den * a.route_scale;
  }
}

// x [T, D] f32|bf16 -> out [T, D] f32|bf16. For token t and its i-th expert
// e = route_idx[t, i] (held here: e - expert_offset in [0, w1.size()); other slots contribute 0):
//   g = linear(x_t, w1[e], act_block), u = linear(x_t, w3[e], act_block);
//   h = silu(min(g, lim)) * clamp(u, -lim, lim) * route_w[t, i]  (f32 steps);
//   y_i = linear(h, w2[e], act_block);
//   out[t] = sum_i y_i (i ascending, double, rounded once to f32, then to out's dtype).
// round_bf16 (fast numerics): g, u, h and y_i are rounded to bf16 where the official code holds
// them in bf16 (the fp8/fp4_gemm outputs, and h as w2's input).
// Tokens are grouped per expert so each expert's weights are dequantized once per call; each
// token's rows are computed independently, so grouping does not change any result.
void CpuBackend::moe_experts(const MoeExpertsArgs& a) {
  cpu::Staged sx(a.x, "moe_experts x"), so(a.out, "moe_experts out", true);
  const Tensor &x = sx.t, &out = so.t;
  cpu::check_f32(a.route_w, "moe_experts route_w");
  cpu::check_i32(a.route_idx, "moe_experts route_idx");
  DIL_CHECK(a.w1 && a.w2 && a.w3, "moe_experts: missing expert weights");
  if (!a.w1->empty())
    impl_for(moe_experts_site((*a.w1)[0], a.act_block, a.x.dtype, a.out.dtype, numerics()), cpu::n_rows(a.x));
  const int64_t T = cpu::n_rows(x), D = cpu::last_dim(x), k = T ? a.route_idx.numel() / T : 0;
  DIL_CHECK(out.numel() == T * D && a.route_w.numel() == T * k, "moe_experts: shapes");
  auto round_all = [&](std::vector<float>& v) {
    if (a.round_bf16)
      for (float& f : v) f = round_bf16(f);
  };
  const int64_t n_exp = int64_t(a.w1->size());
  // Rows (t * k + i) of each expert, in ascending order.
  std::map<int32_t, std::vector<int64_t>> by_expert;
  for (int64_t r = 0; r < T * k; ++r) {
    const int32_t g = a.route_idx.ptr<int32_t>()[r];
    DIL_CHECK(g >= -1, "moe_experts: expert ", g);
    const int32_t e = g < 0 ? -1 : g - a.expert_offset;
    if (e < 0 || e >= n_exp) continue;  // padding, or an expert held by another rank: y stays 0
    by_expert[e].push_back(r);
  }
  std::vector<float> y(static_cast<size_t>(T * k * D));  // [T, k, D] each expert's output per (token, slot)
  std::vector<float> xs, g, u;
  for (const auto& [e, rs] : by_expert) {
    const Weight &w1 = (*a.w1)[e], &w2 = (*a.w2)[e], &w3 = (*a.w3)[e];
    const int64_t n = int64_t(rs.size()), I = cpu::weight_rows(w1);
    DIL_CHECK(cpu::weight_cols(w1) == D && cpu::weight_rows(w3) == I && cpu::weight_cols(w2) == I &&
                  cpu::weight_rows(w2) == D,
              "moe_experts: expert ", e, " weight shapes");
    xs.resize(size_t(n * D));  // [n, D] gathered token rows
    for (int64_t j = 0; j < n; ++j)
      std::copy(x.ptr<float>() + (rs[j] / k) * D, x.ptr<float>() + (rs[j] / k + 1) * D, xs.begin() + j * D);
    g.resize(size_t(n * I));  // [n, I]
    u.resize(size_t(n * I));  // [n, I]
    cpu::linear_rows(xs.data(), n, D, w1, a.act_block, g.data(), I);
    cpu::linear_rows(xs.data(), n, D, w3, a.act_block, u.data(), I);
    round_all(g);
    round_all(u);
    for (int64_t j = 0; j < n; ++j) {
      const float rw = a.route_w.ptr<float>()[rs[j]];
      for (int64_t c = 0; c < I; ++c)
        g[j * I + c] = swiglu_one(g[j * I + c], u[j * I + c], a.swiglu_limit) * rw;
    }
    round_all(g);
    xs.resize(size_t(n * D));  // [n, D] expert outputs
    cpu::linear_rows(g.data(), n, I, w2, a.act_block, xs.data(), D);
    round_all(xs);
    for (int64_t j = 0; j < n; ++j) std::copy(xs.begin() + j * D, xs.begin() + (j + 1) * D, y.begin() + rs[j] * D);
  }
  float* po = out.ptr<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < D; ++c) {
      double acc = 0.0;
      for (int64_t i = 0; i < k; ++i) acc += y[(t * k + i) * D + c];
      po[t * D + c] = float(acc);
    }
}

// g, u, out [T, I] f32|bf16; w [T] f32 or empty (= 1):
// out = silu(min(g, limit)) * clamp(u, -limit, limit) [* w[t]], f32 steps, silu in double,
// rounded to out's dtype.
void CpuBackend::swiglu(const Tensor& g0, const Tensor& u0, const Tensor& w, float limit, Tensor out0) {
  cpu::Staged sg(g0, "swiglu g"), su(u0, "swiglu u"), so(out0, "swiglu out", true);
  const Tensor &g = sg.t, &u = su.t, &out = so.t;
  const int64_t T = cpu::n_rows(g), I = cpu::last_dim(g);
  DIL_CHECK(u.numel() == g.numel() && out.numel() == g.numel(), "swiglu: sizes differ");
  if (!w.empty()) {
    cpu::check_f32(w, "swiglu w");
    DIL_CHECK(w.numel() == T, "swiglu: w ", w.shape_str(), " for ", T, " rows");
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < I; ++c) {
      float h = swiglu_one(g.ptr<float>()[t * I + c], u.ptr<float>()[t * I + c], limit);
      if (!w.empty()) h = h * w.ptr<float>()[t];
      out.ptr<float>()[t * I + c] = h;
    }
}

}  // namespace dil
