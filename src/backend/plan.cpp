#include "backend/plan.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "backend/backend.h"
#include "core/check.h"

namespace dil {

Numerics parse_numerics(const std::string& s) {
  if (s == "reference") return Numerics::Reference;
  if (s == "official") return Numerics::Official;
  if (s == "fast") return Numerics::Fast;
  DIL_FAIL("unknown numerics mode '", s, "' (expected ", numerics_choices(), ")");
}

const char* numerics_name(Numerics n) {
  switch (n) {
    case Numerics::Reference: return "reference";
    case Numerics::Official: return "official";
    case Numerics::Fast: return "fast";
  }
  return "?";
}

const char* numerics_choices() { return "reference|official|fast"; }

void parse_kernel_overrides(const std::string& spec, BackendOptions* o) {
  size_t i = 0;
  while (i < spec.size()) {
    size_t j = spec.find(',', i);
    if (j == std::string::npos) j = spec.size();
    const std::string item = spec.substr(i, j - i);
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
      DIL_FAIL("kernel override '", item, "': expected op=implementation (e.g. linear=simt)");
    o->force[item.substr(0, eq)] = item.substr(eq + 1);
    i = j + 1;
  }
}

namespace {

const char* kind_name(int k) {
  switch (k) {
    case 0: return "F32";
    case 1: return "BF16";
    case 2: return "FP8";
    case 3: return "FP4";
  }
  return "-";
}

}  // namespace

std::string OpSite::key() const {
  std::ostringstream s;
  s << op << '|' << int(numerics) << '|' << int(act) << '|' << int(out) << '|' << wkind << '|' << block_out << 'x'
    << block_in << '|' << n << 'x' << k << '|' << act_block << '|' << groups << '|' << heads << 'x' << head_dim
    << '|' << ratio << '|' << topk << '|' << cand << '|' << cand_block << '|' << cand_topk;
  if (non_causal) s << "|nc";  // appended only when set: every other key stays as it was
  return s.str();
}

std::string OpSite::describe() const {
  std::ostringstream s;
  if (wkind >= 0) {
    s << kind_name(wkind);
    if (wkind == 2) s << ' ' << block_out << 'x' << block_in;
    s << " [" << n << " x " << k << ']';
    if (groups > 1) s << " groups " << groups;
    if (act_block > 0) s << " act " << act_block;
  }
  if (heads > 0) {
    if (s.tellp() > 0) s << ' ';
    s << heads << " x " << head_dim;
    if (op == "sparse_attention") {
      s << (ratio ? " ratio " + std::to_string(ratio) : std::string(" window"));
      if (ratio) s << (topk ? " top-" + std::to_string(topk) : std::string(" all rows"));
      if (non_causal) s << " non-causal";
    } else {
      s << " top-" << topk;
      if (cand == 1) s << " cand-source " << cand_topk << "x" << cand_block;
      if (cand == 2) s << " reindex";
    }
  }
  if (s.tellp() > 0) s << ' ';
  s << dtype_name(act);
  if (out != act) s << "->" << dtype_name(out);
  return s.str();
}

OpSite linear_site(const Weight& w, int act_block, DType x, DType out, Numerics n) {
  OpSite s;
  s.op = "linear";
  s.numerics = n;
  s.act = x;
  s.out = out;
  s.wkind = int(w.kind);
  s.block_out = w.block_out;
  s.block_in = w.block_in;
  s.n = w.out;
  s.k = w.in;
  // The activation quantization applies to FP8/FP4 weights only (official linear()).
  s.act_block = (w.kind == Weight::Kind::FP8 || w.kind == Weight::Kind::FP4) ? act_block : 0;
  return s;
}

OpSite grouped_linear_site(const Weight& w, int groups, DType x, DType out, Numerics n) {
  OpSite s = linear_site(w, 0, x, out, n);
  s.op = "grouped_linear";
  s.groups = groups;
  return s;
}

OpSite attention_site(int heads, int head_dim, int ratio, int topk, DType act, Numerics n, bool non_causal) {
  OpSite s;
  s.op = "sparse_attention";
  s.non_causal = non_causal ? 1 : 0;
  s.numerics = n;
  s.act = s.out = act;
  s.heads = heads;
  s.head_dim = head_dim;
  s.ratio = ratio;
  s.topk = ratio ? topk : 0;
  return s;
}

OpSite indexer_site(int heads, int head_dim, int topk, int cand, int cand_block, int cand_topk, DType act,
                    Numerics n) {
  OpSite s;
  s.op = "indexer_topk";
  s.numerics = n;
  s.act = s.out = act;
  s.heads = heads;
  s.head_dim = head_dim;
  s.topk = topk;
  s.cand = cand;
  s.cand_block = cand ? cand_block : 0;
  s.cand_topk = cand ? cand_topk : 0;
  return s;
}

OpSite moe_experts_site(const Weight& w1, int act_block, DType x, DType out, Numerics n) {
  OpSite s = linear_site(w1, act_block, x, out, n);
  s.op = "moe_experts";
  return s;
}

OpSite simple_site(const std::string& op, DType act, Numerics n) {
  OpSite s;
  s.op = op;
  s.numerics = n;
  s.act = s.out = act;
  return s;
}

const KernelImpl& PlanEntry::for_rows(int64_t rows) const {
  DIL_CHECK(!impls.empty() && from.size() == impls.size(), "plan entry without row regimes: ", site.key());
  size_t i = impls.size() - 1;
  while (i > 0 && rows < from[i]) --i;
  return *impls[i];
}

const PlanEntry* KernelPlan::find(const std::string& key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

void KernelPlan::add(PlanEntry e) {
  const std::string k = e.site.key();
  auto it = index_.find(k);
  if (it != index_.end()) {
    std::string& w = entries_[it->second].site.where;
    if (!e.site.where.empty() && w.find(e.site.where) == std::string::npos) w += w.empty() ? e.site.where : ", " + e.site.where;
    return;
  }
  index_[k] = entries_.size();
  entries_.push_back(std::move(e));
}

std::string KernelPlan::table() const {
  std::ostringstream s;
  s << "kernel plan: backend " << backend_ << ", numerics " << numerics_name(numerics_) << "\n";
  s << "| op | where | features | rows | implementation | tolerance |\n|---|---|---|---|---|---|\n";
  for (const PlanEntry& e : entries_) {
    for (size_t i = 0; i < e.impls.size(); ++i) {
      const KernelImpl& k = *e.impls[i];
      std::string rows = i + 1 < e.impls.size() ? str_cat(e.from[i], "..", e.from[i + 1] - 1)
                                                : str_cat(e.from[i], "+");
      if (e.impls.size() == 1) rows = "all";
      s << "| " << e.site.op << " | " << e.site.where << " | " << e.site.describe() << " | " << rows << " | "
        << k.name << " | " << k.tolerance.text() << " |\n";
    }
  }
  return s.str();
}

std::string KernelPlan::summary() const {
  // op -> impl -> count of sites, in first-seen order.
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, int>>>> agg;
  for (const PlanEntry& e : entries_) {
    auto it = std::find_if(agg.begin(), agg.end(), [&](const auto& p) { return p.first == e.site.op; });
    if (it == agg.end()) {
      agg.push_back({e.site.op, {}});
      it = agg.end() - 1;
    }
    for (const KernelImpl* k : e.impls) {
      auto jt = std::find_if(it->second.begin(), it->second.end(), [&](const auto& p) { return p.first == k->name; });
      if (jt == it->second.end()) it->second.push_back({k->name, 1});
      else ++jt->second;
    }
  }
  std::ostringstream s;
  bool first = true;
  for (const auto& [op, impls] : agg) {
    // Families with one implementation everywhere say nothing about the plan.
    if (impls.size() == 1 && (impls[0].first == "reference" || impls[0].first == "default")) continue;
    s << (first ? "" : "; ") << op;
    first = false;
    for (size_t i = 0; i < impls.size(); ++i) s << (i ? ", " : " ") << impls[i].first << " x" << impls[i].second;
  }
  if (first) s << "the reference of every op";
  return s.str();
}

std::string need(bool ok, const std::string& what) { return ok ? std::string() : what; }

// Rows [0, few->max_rows] of e go to `few`; e's regimes above keep their starts, or start after it.
static void put_few(PlanEntry& e, const KernelImpl* few) {
  std::vector<const KernelImpl*> impls{few};
  std::vector<int64_t> from{0};
  for (size_t i = 0; i < e.impls.size(); ++i) {
    const int64_t end = i + 1 < e.impls.size() ? e.from[i + 1] : INT64_MAX;  // exclusive
    if (end <= few->max_rows + 1) continue;
    impls.push_back(e.impls[i]);
    from.push_back(std::max(e.from[i], few->max_rows + 1));
  }
  e.impls = std::move(impls);
  e.from = std::move(from);
}

PlanEntry resolve_site(const std::vector<KernelImpl>& registry, const OpSite& site, const BackendOptions& o) {
  PlanEntry e;
  e.site = site;
  auto forced = o.force.find(site.op);
  std::ostringstream why;
  bool family = false;
  std::vector<const KernelImpl*> ok;
  for (const KernelImpl& k : registry) {
    if (k.op != site.op) continue;
    family = true;
    if (forced != o.force.end() && k.name != forced->second) continue;
    std::vector<std::string> unmet = k.unmet ? k.unmet(site) : std::vector<std::string>{};
    unmet.erase(std::remove(unmet.begin(), unmet.end(), std::string()), unmet.end());
    if (unmet.empty()) {
      ok.push_back(&k);
    } else {
      why << "\n  " << k.name << ": needs ";
      for (size_t i = 0; i < unmet.size(); ++i) why << (i ? "; " : "") << unmet[i];
    }
  }
  if (!family) DIL_FAIL("kernel plan: no implementation of op '", site.op, "' is registered");
  if (forced != o.force.end() && ok.empty()) {
    bool known = std::any_of(registry.begin(), registry.end(),
                             [&](const KernelImpl& k) { return k.op == site.op && k.name == forced->second; });
    if (!known) DIL_FAIL("kernel override ", site.op, "=", forced->second, ": no such implementation of ", site.op);
    DIL_FAIL("kernel override ", site.op, "=", forced->second, " cannot run ", site.op, " at ", site.where, " (",
             site.describe(), ", numerics ", numerics_name(site.numerics), "):", why.str());
  }
  if (ok.empty())
    DIL_FAIL("kernel plan: nothing can run ", site.op, " at ", site.where.empty() ? "(unnamed site)" : site.where,
             " (", site.describe(), ", numerics ", numerics_name(site.numerics), "):", why.str());
  // A forced implementation runs every row count: its min_rows says from where the plan prefers
  // it, not what it can do. A forced few-rows implementation (max_rows, a limit) runs the rows it
  // can, [0, max_rows], and the plan's own regimes the rest: the same-job baseline of a planned
  // few-rows kernel (`--kernels moe_experts=gemv`).
  if (forced != o.force.end() && ok[0]->max_rows == 0) {
    e.impls.push_back(ok[0]);
    e.from.push_back(0);
    return e;
  }
  if (forced != o.force.end()) {
    BackendOptions rest = o;
    rest.force.erase(site.op);
    PlanEntry r = resolve_site(registry, site, rest);
    put_few(r, ok[0]);
    return r;
  }
  // Registry order is preference. The first implementation usable at any row count is the
  // base; preferred ones before it that start at a larger row count take over from there.
  size_t base = ok.size();
  for (size_t i = 0; i < ok.size(); ++i)
    if (ok[i]->min_rows == 0 && ok[i]->max_rows == 0) {
      base = i;
      break;
    }
  if (base == ok.size())
    DIL_FAIL("kernel plan: ", site.op, " at ", site.where, " (", site.describe(),
             "): every usable implementation is limited to a row range (", ok[0]->name, ": rows ",
             ok[0]->max_rows ? str_cat("<= ", ok[0]->max_rows) : str_cat(">= ", ok[0]->min_rows), ")");
  e.impls.push_back(ok[base]);
  int64_t lowest = INT64_MAX;  // a preferred regime must start below the ones already placed after it
  std::vector<const KernelImpl*> above;
  const KernelImpl* few = nullptr;  // the preferred few-rows implementation, if any
  for (size_t i = 0; i < base; ++i) {
    if (ok[i]->max_rows > 0) {
      if (!few) few = ok[i];
      continue;
    }
    if (ok[i]->min_rows < lowest) {
      above.push_back(ok[i]);
      lowest = ok[i]->min_rows;
    }
  }
  // `above` is in preference order with strictly decreasing min_rows: ascending after reversal.
  std::reverse(above.begin(), above.end());
  for (const KernelImpl* k : above) e.impls.push_back(k);
  for (const KernelImpl* k : e.impls) e.from.push_back(k->min_rows);
  if (few) put_few(e, few);
  return e;
}

KernelPlan resolve_plan(const std::vector<KernelImpl>& registry, const std::string& backend,
                        const std::vector<OpSite>& sites, Numerics n, const BackendOptions& o) {
  KernelPlan p(backend, n);
  std::vector<std::string> errors;
  for (const OpSite& s : sites) {
    DIL_CHECK(s.numerics == n, "op site ", s.op, " at ", s.where, " built for numerics ", numerics_name(s.numerics),
              " in a ", numerics_name(n), " plan");
    try {
      p.add(resolve_site(registry, s, o));
    } catch (const Error& e) {
      std::string m = e.what();
      if (std::find(errors.begin(), errors.end(), m) == errors.end()) errors.push_back(m);
    }
  }
  if (!errors.empty()) {
    std::string all;
    for (const std::string& m : errors) all += (all.empty() ? "" : "\n") + m;
    DIL_FAIL(all);
  }
  return p;
}

std::string registry_markdown(const std::vector<KernelImpl>& registry, const std::string& backend) {
  std::ostringstream s;
  s << "| op | " << backend << " implementation | rows | what it does | tolerance | test |\n";
  s << "|---|---|---|---|---|---|\n";
  for (const KernelImpl& k : registry)
    s << "| " << k.op << " | `" << k.name << "` | "
      << (k.min_rows ? str_cat(">= ", k.min_rows) : k.max_rows ? str_cat("<= ", k.max_rows) : std::string("any"))
      << " | " << k.what << " | " << k.tolerance.text() << " | " << k.test << " |\n";
  return s.str();
}

}  // namespace dil
