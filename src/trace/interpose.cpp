#include "trace/interpose.h"

namespace dil::trace {

ImplInfo implementation(Backend& be, const Call& c) {
  if (!c.planned) return {"-", exact_tolerance()};
  // The plan's entry when the site is planned (what impl_for dispatches on), else the registry's
  // resolution of the site (op-level use without a plan).
  const KernelPlan* plan = be.plan();
  const PlanEntry* e = plan ? plan->find(c.site.key()) : nullptr;
  PlanEntry local;
  if (!e) {
    local = resolve_site(be.kernels(), c.site, be.options());
    e = &local;
  }
  const KernelImpl& k = e->for_rows(c.rows);
  return {k.name, k.tolerance};
}

InterposingBackend::InterposingBackend(Backend& inner, CallHook& hook, std::string label)
    : Backend(inner.options()), in_(inner), hook_(hook), label_(std::move(label)) {}

void InterposingBackend::sync_plan() {
  if (plan()) in_.install_plan(*plan());
  else in_.set_numerics(numerics());
  if (auto* w = dynamic_cast<InterposingBackend*>(&in_)) w->sync_plan();
}

Call InterposingBackend::simple(const char* op, int64_t rows) const {
  Call c;
  c.op = op;
  c.site = simple_site(op, activation_dtype(in_.numerics()), in_.numerics());
  c.rows = rows;
  return c;
}

void InterposingBackend::embed(const Weight& table, const Tensor& ids0, Tensor out) {
  Tensor ids = ids0;
  Call c = simple("embed", ids.numel());
  c.args = {{"ids", &ids, Role::In}, {"out", &out, Role::Out}};
  run(c, [&] { in_.embed(table, ids, out); });
}

void InterposingBackend::rms_norm(const Tensor& x0, const Tensor& w, float eps, Tensor out) {
  Tensor x = x0;
  Call c = simple("rms_norm", x.ndim ? x.size(0) : 0);
  c.args = {{"x", &x, Role::In}, {"out", &out, Role::Out}};
  run(c, [&] { in_.rms_norm(x, w, eps, out); });
}

void InterposingBackend::add(const Tensor& a0, const Tensor& b0, Tensor out) {
  Tensor a = a0, b = b0;
  Call c = simple("add", a.ndim ? a.size(0) : 0);
  c.args = {{"a", &a, Role::In}, {"b", &b, Role::In}, {"out", &out, Role::Out}};
  run(c, [&] { in_.add(a, b, out); });
}

void InterposingBackend::linear(const Tensor& x0, const Weight& w, int act_block, Tensor out) {
  Tensor x = x0;
  Call c;
  c.op = "linear";
  c.site = linear_site(w, act_block, x.dtype, out.dtype, in_.numerics());
  c.rows = w.in ? x.numel() / w.in : 0;  // as the backends dispatch
  c.args = {{"x", &x, Role::In}, {"out", &out, Role::Out}};
  run(c, [&] { in_.linear(x, w, act_block, out); });
}

void InterposingBackend::grouped_linear(const Tensor& x0, const Weight& w, int groups, Tensor out) {
  Tensor x = x0;
  Call c;
  c.op = "grouped_linear";
  c.site = grouped_linear_site(w, groups, x.dtype, out.dtype, in_.numerics());
  c.rows = x.size(0);
  c.args = {{"x", &x, Role::In}, {"out", &out, Role::Out}};
  run(c, [&] { in_.grouped_linear(x, w, groups, out); });
}

void InterposingBackend::rope(Tensor x, const Tensor& pos, const RopeTable& table, bool inverse) {
  Call c = simple("rope", x.ndim ? x.size(0) : 0);
  c.args = {{"x", &x, Role::InOut}};
  run(c, [&] { in_.rope(x, pos, table, inverse); });
}

void InterposingBackend::fp8_qdq(Tensor x, int cols, int block) {
  Call c = simple("fp8_qdq", x.ndim ? x.size(0) : 0);
  c.args = {{"x", &x, Role::InOut}};
  run(c, [&] { in_.fp8_qdq(x, cols, block); });
}

void InterposingBackend::fp4_qdq(Tensor x, int block, bool e4m3_scale) {
  Call c = simple("fp4_qdq", x.ndim ? x.size(0) : 0);
  c.args = {{"x", &x, Role::InOut}};
  run(c, [&] { in_.fp4_qdq(x, block, e4m3_scale); });
}

void InterposingBackend::hadamard(Tensor x) {
  Call c = simple("hadamard", x.ndim ? x.size(0) : 0);
  c.args = {{"x", &x, Role::InOut}};
  run(c, [&] { in_.hadamard(x); });
}

void InterposingBackend::hc_mix(const Tensor& X0, const HcArgs& a, Tensor pre, Tensor post, Tensor comb) {
  Tensor X = X0;
  Call c = simple("hc_mix", X.size(0));
  // The head's mix (fn with n rows) writes pre only.
  const bool sublayer = a.fn.ndim && a.fn.size(0) != a.n;
  c.args = {{"X", &X, Role::In},
            {"pre", &pre, Role::Out},
            {"post", &post, Role::Out, false, false, sublayer},
            {"comb", &comb, Role::Out, false, false, sublayer}};
  run(c, [&] { in_.hc_mix(X, a, pre, post, comb); });
}

void InterposingBackend::hc_collapse(const Tensor& X0, const Tensor& pre0, Tensor out) {
  Tensor X = X0, pre = pre0;
  Call c = simple("hc_collapse", X.size(0));
  c.args = {{"X", &X, Role::In}, {"pre", &pre, Role::In}, {"out", &out, Role::Out}};
  run(c, [&] { in_.hc_collapse(X, pre, out); });
}

void InterposingBackend::hc_post(const Tensor& F0, const Tensor& X0, const Tensor& post0, const Tensor& comb0,
                                 Tensor out) {
  Tensor F = F0, X = X0, post = post0, comb = comb0;
  Call c = simple("hc_post", X.size(0));
  c.args = {{"F", &F, Role::In}, {"X", &X, Role::In}, {"post", &post, Role::In}, {"comb", &comb, Role::In},
            {"out", &out, Role::Out}};
  run(c, [&] { in_.hc_post(F, X, post, comb, out); });
}

void InterposingBackend::hc_expand(const Tensor& e0, int n, Tensor X) {
  Tensor e = e0;
  Call c = simple("hc_expand", e.size(0));
  c.args = {{"e", &e, Role::In}, {"X", &X, Role::Out}};
  run(c, [&] { in_.hc_expand(e, n, X); });
}

void InterposingBackend::hc_pre(const Tensor& X0, const HcArgs& a, const Tensor& cpre0, const Tensor& norm_w,
                                Tensor pre, Tensor post, Tensor comb, Tensor xn) {
  Tensor X = X0, cpre = cpre0;
  Call c = simple("hc_pre", X.size(0));
  const bool sublayer = a.fn.ndim && a.fn.size(0) != a.n;  // the head's mix writes pre only
  c.args = {{"X", &X, Role::In},
            {"xn", &xn, Role::Out},
            {"pre", &pre, Role::Out},
            {"post", &post, Role::Out, false, false, sublayer},
            {"comb", &comb, Role::Out, false, false, sublayer}};
  if (!cpre.empty()) c.args.push_back({"collapse_pre", &cpre, Role::In});
  // The collapsed row is rounded to xn's dtype inside the op (bf16 in fast numerics): a mode
  // pair's hc_pre is the mode difference even where its inputs agree.
  c.round_bf16 = xn.dtype == DType::BF16;
  run(c, [&] { in_.hc_pre(X, a, cpre, norm_w, pre, post, comb, xn); });
}

void InterposingBackend::sparse_attention(const AttnArgs& a0, const StepMeta& m) {
  AttnArgs a = a0;
  Call c;
  c.op = "sparse_attention";
  const int K = a.comp_idx.empty() ? 0 : int(a.comp_idx.size(1));
  c.site = attention_site(int(a.q.size(1)), int(a.q.size(2)), a.comp.empty() ? 0 : a.comp_ratio, K, a.q.dtype,
                          in_.numerics(), a.non_causal);
  c.rows = a.q.size(0);
  c.args = {{"q", &a.q, Role::In},
            {"kv_new", &a.kv_new, Role::In, false, true},
            {"ring", &a.ring, Role::In, false, true},
            {"comp", &a.comp, Role::In, false, true},
            {"comp_idx", &a.comp_idx, Role::In},
            {"out", &a.out, Role::Out}};
  run(c, [&] { in_.sparse_attention(a, m); });
}

void InterposingBackend::ring_write(const Tensor& kv0, Tensor ring, const StepMeta& m, const kvpack::RowShape& pack) {
  Tensor kv = kv0;
  Call c = simple("ring_write", kv.size(0));
  c.args = {{"kv_new", &kv, Role::In}, {"ring", &ring, Role::InOut, true}};
  run(c, [&] { in_.ring_write(kv, ring, m, pack); });
}

void InterposingBackend::compressor(const CompressorArgs& a0, const EmitPlan& plan, const StepMeta& m) {
  CompressorArgs a = a0;
  Call c = simple("compressor", plan.n);
  c.args = {{"a", &a.a, Role::In},
            {"g", &a.g, Role::In},
            {"state_kv", &a.state_kv, Role::InOut, true},
            {"state_score", &a.state_score, Role::InOut, true},
            {"out", &a.out, Role::Out}};
  run(c, [&] { in_.compressor(a, plan, m); });
}

void InterposingBackend::paged_write(const Tensor& rows0, Tensor cache, int rows_per_block, const EmitPlan& plan,
                                     const StepMeta& m, const kvpack::RowShape& pack) {
  Tensor rows = rows0;
  Call c = simple("paged_write", plan.n);
  c.args = {{"rows", &rows, Role::In}, {"cache", &cache, Role::InOut, true}};
  run(c, [&] { in_.paged_write(rows, cache, rows_per_block, plan, m, pack); });
}

void InterposingBackend::indexer_topk(const IndexerArgs& a0, const StepMeta& m) {
  IndexerArgs a = a0;
  Call c;
  c.op = "indexer_topk";
  const int cand = !a.cand_out.empty() ? 1 : !a.cand_in.empty() ? 2 : 0;
  c.site = indexer_site(int(a.q.size(1)), int(a.q.size(2)), a.topk, cand, a.cand_block, a.cand_topk, a.q.dtype,
                        in_.numerics());
  c.rows = a.q.size(0);
  c.args = {{"q", &a.q, Role::In},          {"w", &a.w, Role::In},
            {"keys", &a.keys, Role::In},    {"cand_in", &a.cand_in, Role::In},
            {"out_idx", &a.out_idx, Role::Out}, {"cand_out", &a.cand_out, Role::Out}};
  run(c, [&] { in_.indexer_topk(a, m); });
}

void InterposingBackend::moe_route(const MoeRouteArgs& a0) {
  MoeRouteArgs a = a0;
  Call c = simple("moe_route", a.logits.size(0));
  c.args = {{"logits", &a.logits, Role::In}, {"ids", &a.ids, Role::In},        {"image_mask", &a.image_mask, Role::In},
            {"out_w", &a.out_w, Role::Out},  {"out_idx", &a.out_idx, Role::Out}};
  run(c, [&] { in_.moe_route(a); });
}

void InterposingBackend::moe_experts(const MoeExpertsArgs& a0) {
  MoeExpertsArgs a = a0;
  DIL_CHECK(a.w1 && !a.w1->empty(), "moe_experts: no experts");
  Call c;
  c.op = "moe_experts";
  c.site = moe_experts_site((*a.w1)[0], a.act_block, a.x.dtype, a.out.dtype, in_.numerics());
  c.rows = a.x.size(0);
  c.round_bf16 = a.round_bf16;
  c.args = {{"x", &a.x, Role::In}, {"route_w", &a.route_w, Role::In}, {"route_idx", &a.route_idx, Role::In},
            {"out", &a.out, Role::Out}};
  run(c, [&] { in_.moe_experts(a); });
}

void InterposingBackend::swiglu(const Tensor& g0, const Tensor& u0, const Tensor& w0, float limit, Tensor out) {
  Tensor g = g0, u = u0, w = w0;
  Call c = simple("swiglu", g.size(0));
  c.args = {{"g", &g, Role::In}, {"u", &u, Role::In}, {"w", &w, Role::In}, {"out", &out, Role::Out}};
  run(c, [&] { in_.swiglu(g, u, w, limit, out); });
}

void InterposingBackend::engram_mix(const Tensor& X0, const Tensor& kv0, const Tensor& qk, const Tensor& mask0,
                                    float eps, Tensor out) {
  Tensor X = X0, kv = kv0, mask = mask0;
  Call c = simple("engram_mix", X.size(0));
  c.args = {{"X", &X, Role::In}, {"kv", &kv, Role::In}, {"mask", &mask, Role::In}, {"out", &out, Role::Out}};
  run(c, [&] { in_.engram_mix(X, kv, qk, mask, eps, out); });
}

void InterposingBackend::reset_state(Tensor state_kv, Tensor state_score, const std::vector<int32_t>& slots) {
  Call c;
  c.op = "reset_state";
  c.planned = false;
  c.rows = int64_t(slots.size());
  c.args = {{"state_kv", &state_kv, Role::InOut, true}, {"state_score", &state_score, Role::InOut, true}};
  run(c, [&] { in_.reset_state(state_kv, state_score, slots); });
}

}  // namespace dil::trace
