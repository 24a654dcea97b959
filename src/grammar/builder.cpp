#include "grammar/builder.h"

namespace dil::grammar {

Builder::Id Builder::add(Node n) {
  nodes_.push_back(std::move(n));
  return Id(nodes_.size() - 1);
}

Builder::Id Builder::empty() { return add(Node{}); }

Builder::Id Builder::nothing() {
  Node n;
  n.kind = Kind::Nothing;
  return add(std::move(n));
}

Builder::Id Builder::literal(std::string_view bytes) {
  if (bytes.empty()) return empty();
  Node n;
  n.kind = Kind::Literal;
  n.bytes = std::string(bytes);
  return add(std::move(n));
}

Builder::Id Builder::bytes_in(std::vector<ByteRange> ranges) {
  Node n;
  n.kind = Kind::Bytes;
  for (const ByteRange& r : ranges) DIL_CHECK(r.lo <= r.hi, "byte range ", int(r.lo), "-", int(r.hi));
  n.ranges = std::move(ranges);
  if (n.ranges.empty()) return nothing();
  return add(std::move(n));
}

Builder::Id Builder::seq(std::vector<Id> parts) {
  std::vector<Id> keep;
  for (Id p : parts) {
    const Node& n = node(p);
    if (n.kind == Kind::Nothing) return nothing();
    if (n.kind == Kind::Empty) continue;
    keep.push_back(p);
  }
  if (keep.empty()) return empty();
  if (keep.size() == 1) return keep[0];
  Node n;
  n.kind = Kind::Seq;
  n.kids = std::move(keep);
  return add(std::move(n));
}

Builder::Id Builder::alt(std::vector<Id> options) {
  std::vector<Id> keep;
  for (Id o : options)
    if (node(o).kind != Kind::Nothing) keep.push_back(o);
  if (keep.empty()) return nothing();
  if (keep.size() == 1) return keep[0];
  Node n;
  n.kind = Kind::Alt;
  n.kids = std::move(keep);
  return add(std::move(n));
}

Builder::Id Builder::repeat(Id e, int min, int max, bool inline_copies) {
  DIL_CHECK(min >= 0 && (max < 0 || max >= min), "repeat {", min, ",", max, "}");
  if (max == 0) return empty();
  if (min == 1 && max == 1) return e;
  if (node(e).kind == Kind::Nothing) return min == 0 ? empty() : nothing();
  Node n;
  n.kind = Kind::Repeat;
  n.kids = {e};
  n.min = min;
  n.max = max;
  n.inline_copies = inline_copies;
  return add(std::move(n));
}

Builder::Id Builder::members(const std::vector<std::pair<Id, bool>>& items, Id sep, Id extra, int extra_max) {
  Node n;
  n.kind = Kind::Members;
  for (auto [m, req] : items) {
    if (node(m).kind == Kind::Nothing) {
      if (req) return nothing();
      continue;  // a member that cannot be written is left out
    }
    n.kids.push_back(m);
    n.required.push_back(req ? 1 : 0);
  }
  if (extra >= 0 && node(extra).kind == Kind::Nothing) extra = -1;
  n.kids.push_back(sep);
  n.kids.push_back(extra);
  n.max = extra < 0 ? 0 : extra_max;
  return add(std::move(n));
}

Builder::Id Builder::text_without(std::vector<std::string> forbidden) {
  Node n;
  n.kind = Kind::TextWithout;
  for (auto& f : forbidden) DIL_CHECK(!f.empty(), "text_without: empty forbidden string");
  n.forbidden = std::move(forbidden);
  return add(std::move(n));
}

int32_t Builder::add_rule(std::string name) {
  rule_body_.push_back(-1);
  rule_name_.push_back(std::move(name));
  return int32_t(rule_body_.size() - 1);
}

void Builder::define(int32_t rule, Id body) {
  DIL_CHECK(rule >= 0 && rule < n_rules() && rule_body_[size_t(rule)] < 0, "rule ", rule, " defined twice or unknown");
  rule_body_[size_t(rule)] = body;
}

Builder::Id Builder::call(int32_t rule) {
  DIL_CHECK(rule >= 0 && rule < n_rules(), "call of unknown rule ", rule);
  Node n;
  n.kind = Kind::Call;
  n.rule = rule;
  return add(std::move(n));
}

}  // namespace dil::grammar
