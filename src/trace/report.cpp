#include "trace/report.h"

#include <cmath>
#include <map>

namespace dil::trace {

namespace {

std::string num(double v) {
  if (v == 0) return "0";
  if (std::isinf(v)) return "inf";
  char b[32];
  std::snprintf(b, sizeof b, "%.2e", v);
  return b;
}

std::string layer_cell(const Check& c) {
  if (c.layer < 0) return "-";
  return std::to_string(c.layer) + " " + c.kind;
}

std::string result_cell(const Check& c) {
  if (c.indices) {
    if (c.exact) return c.gate == "mode" ? "exact (mode)" : "exact";
    std::string d = std::to_string(c.differ) + " of " + std::to_string(c.n) + " differ";
    return (c.gate == "mode" ? "mode: " : "OVER: ") + d;
  }
  if (c.exact) return c.gate == "mode" ? "exact (mode)" : "exact";
  if (c.gate == "mode") return "mode";
  char b[48];
  std::snprintf(b, sizeof b, "%s %.2g", c.ok ? "ok" : "OVER", c.ratio);
  if (std::isinf(c.ratio)) std::snprintf(b, sizeof b, "%s", c.ok ? "ok" : "OVER (not exact)");
  return b;
}

std::string activation_name(Numerics n) { return activation_dtype(n) == DType::BF16 ? "bf16" : "f32"; }

}  // namespace

std::string describe(const Check& c) {
  std::string s = "#" + std::to_string(c.index) + " step " + std::to_string(c.step);
  if (c.layer >= 0) s += " layer " + std::to_string(c.layer) + " (" + c.kind + ")";
  if (!c.module.empty()) s += " " + c.module;
  return s + ": " + c.op + " " + c.output + " " + c.shape + " " + c.dtype;
}

void print_header(std::FILE* f, const TraceReport& r) {
  std::fprintf(f, "trace of %s: A %s (%s activations), B %s (%s activations); layers", r.model.c_str(),
               side_name(r.a).c_str(), activation_name(r.a.numerics).c_str(), side_name(r.b).c_str(),
               activation_name(r.b.numerics).c_str());
  for (size_t i = 0; i < r.layers.size(); ++i) std::fprintf(f, "%s%d", i ? "," : " ", r.layers[i]);
  std::fprintf(f, "\nsteps:");
  for (size_t i = 0; i < r.steps.size(); ++i) std::fprintf(f, "%s %zu %s", i ? ";" : "", i, r.steps[i].c_str());
  std::fprintf(f,
               "\nevery op of B runs on A's inputs and state (teacher forcing), so each row is that op's own error; "
               "bound: A's and B's implementation tolerances against the CPU reference added (docs/kernels.md; "
               "rel = rel_l2, abs = per element x max(1, max|A|)), exact for state and indices; result: the error "
               "as a fraction of the bound\n");
  if (r.mode_pair())
    std::fprintf(f,
                 "A and B run different numerics modes: this is not a kernel comparison. Ops whose inputs convert "
                 "to B's dtypes exactly and whose arithmetic is the same in both modes keep the bound (B's mode "
                 "stores A's result rounded to its dtype, compared as bf16 with one ulp more); the others, marked "
                 "'mode', show the mode difference (figures only, not gated)\n");
}

void print_table(std::FILE* f, const TraceReport& r, bool only_over) {
  std::fprintf(f, "%5s %4s %-14s %-15s %-16s %-11s %-20s %-9s %-9s %-9s %-22s %s\n", "#", "step", "layer", "module",
               "op", "output", "shape", "dtype", "rel_l2", "max_abs", "bound", "result");
  for (const Check& c : r.checks) {
    if (only_over && c.ok) continue;
    std::fprintf(f, "%5d %4d %-14s %-15s %-16s %-11s %-20s %-9s %-9s %-9s %-22s %s\n", c.index, c.step,
                 layer_cell(c).c_str(), c.module.c_str(), c.op.c_str(), c.output.c_str(), c.shape.c_str(),
                 c.dtype.c_str(), c.indices ? "-" : num(c.rel_l2).c_str(), c.indices ? "-" : num(c.max_abs).c_str(),
                 c.tol.brief().c_str(), result_cell(c).c_str());
  }
}

void print_layers(std::FILE* f, const TraceReport& r) {
  struct Agg {
    int checks = 0, exact = 0, within = 0, mode = 0, over = 0;
    const Check* worst = nullptr;
    std::string label;
  };
  std::vector<std::pair<std::pair<int, int>, Agg>> groups;  // (step, layer) in order of appearance
  bool layer_seen = false;  // in this step: ops outside a layer before it are the embedding, after it the head
  for (const Check& c : r.checks) {
    const std::pair<int, int> key{c.step, c.layer};
    if (groups.empty() || groups.back().first != key) {
      if (!groups.empty() && groups.back().first.first != c.step) layer_seen = false;
      groups.push_back({key, Agg{}});
      groups.back().second.label = c.layer >= 0 ? "layer " + std::to_string(c.layer) + " " + c.kind
                                   : layer_seen ? "head"
                                                : "embed";
      layer_seen = layer_seen || c.layer >= 0;
    }
    Agg& g = groups.back().second;
    ++g.checks;
    if (!c.ok) ++g.over;
    else if (c.gate == "mode") ++g.mode;
    else if (c.exact) ++g.exact;
    else ++g.within;
    const bool gated = c.gate != "mode";
    if (gated && !c.exact && (!g.worst || c.ratio > g.worst->ratio)) g.worst = &c;
  }
  for (const auto& [key, g] : groups) {
    std::fprintf(f, "step %d %-18s %4d checks: %4d exact, %3d within", key.first, g.label.c_str(), g.checks, g.exact,
                 g.within);
    if (g.worst) std::fprintf(f, " (worst %.2g of its bound: %s %s)", g.worst->ratio, g.worst->op.c_str(),
                             g.worst->output.c_str());
    if (r.mode_pair()) std::fprintf(f, ", %3d mode", g.mode);
    std::fprintf(f, ", %d over\n", g.over);
  }
}

void print_verdict(std::FILE* f, const TraceReport& r) {
  int exact = 0, within = 0, mode = 0;
  for (const Check& c : r.checks) {
    if (!c.ok) continue;
    if (c.gate == "mode") ++mode;
    else if (c.exact) ++exact;
    else ++within;
  }
  const int ops = r.checks.empty() ? 0 : r.checks.back().index;
  std::fprintf(f, "%zu checks of %d ops: %d exact, %d within their tolerance, ", r.checks.size(), ops, exact, within);
  if (r.mode_pair()) std::fprintf(f, "%d mode differences (not gated), ", mode);
  std::fprintf(f, "%lld over\n", (long long)r.over());
  std::fprintf(f, "time: load A %.1f s, B %.1f s; run A %.1f s (recording), B %.1f s (replay and comparison)\n",
               r.load_a_s, r.load_b_s, r.run_a_s, r.run_b_s);
  const Check* c = r.first_over();
  if (!c) {
    std::fprintf(f, "every op within its tolerance\n");
    return;
  }
  std::fprintf(f, "first op over its tolerance: %s: ", describe(*c).c_str());
  if (c->indices)
    std::fprintf(f, "%lld of %lld indices differ (exact required)", (long long)c->differ, (long long)c->n);
  else
    std::fprintf(f, "rel_l2 %s, max_abs %s (max|A| %s), %lld elements over, bound %s", num(c->rel_l2).c_str(),
                 num(c->max_abs).c_str(), num(c->max_ref).c_str(), (long long)c->bad, c->tol.brief().c_str());
  std::fprintf(f, " (B %s, A %s); %lld checks over in all\n", c->impl_b.c_str(), c->impl_a.c_str(),
               (long long)r.over());
}

nlohmann::json to_json(const TraceReport& r) {
  using json = nlohmann::json;
  json checks = json::array();
  for (const Check& c : r.checks) {
    json j = {{"index", c.index},   {"step", c.step},       {"layer", c.layer},   {"kind", c.kind},
              {"module", c.module}, {"op", c.op},           {"output", c.output}, {"shape", c.shape},
              {"dtype", c.dtype},   {"impl_a", c.impl_a},   {"impl_b", c.impl_b}, {"gate", c.gate},
              {"indices", c.indices}, {"n", c.n},           {"differ", c.differ}, {"bad", c.bad},
              {"exact", c.exact},   {"ok", c.ok},           {"bound", c.tol.brief()},
              {"tol_rel", c.tol.rel}, {"tol_abs", c.tol.abs}};
    if (!c.indices) {
      j["rel_l2"] = c.rel_l2;
      j["max_abs"] = c.max_abs;
      j["max_ref"] = c.max_ref;
      j["bf16"] = c.bf16;
    }
    j["ratio"] = std::isfinite(c.ratio) ? json(c.ratio) : json(nullptr);
    checks.push_back(std::move(j));
  }
  json out = {{"model", r.model},       {"a", side_name(r.a)},     {"b", side_name(r.b)},
              {"mode_pair", r.mode_pair()}, {"layers", r.layers},  {"steps", r.steps},
              {"checks", std::move(checks)}, {"over", r.over()},
              {"seconds", {{"load_a", r.load_a_s}, {"load_b", r.load_b_s}, {"run_a", r.run_a_s}, {"run_b", r.run_b_s}}}};
  const Check* c = r.first_over();
  out["first_over"] = c ? json{{"index", c->index}, {"step", c->step}, {"layer", c->layer}, {"op", c->op},
                               {"output", c->output}, {"describe", describe(*c)}}
                        : json(nullptr);
  return out;
}

}  // namespace dil::trace
