#include "grammar/json_schema.h"

#include <cctype>
#include <cmath>
#include <functional>
#include <set>

#include "grammar/json_number.h"
#include "grammar/regex.h"

namespace dil::grammar {
namespace {

constexpr int kMaxSchemaDepth = 64;
constexpr int kMaxStringLength = 2000;  // minLength / maxLength copies of a character automaton

const std::set<std::string>& annotations() {
  static const std::set<std::string> k = {"title", "description", "default", "examples", "example", "$schema", "$id",
                                          "$comment", "deprecated", "readOnly", "writeOnly", "discriminator",
                                          "nullable", "$defs", "definitions", "contentEncoding", "contentMediaType"};
  return k;
}
const std::set<std::string>& supported() {
  static const std::set<std::string> k = {
      "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems", "maxItems",
      "uniqueItems", "minLength", "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
      "exclusiveMaximum", "multipleOf", "enum", "const", "anyOf", "oneOf", "allOf", "$ref"};
  return k;
}
bool is_annotation(const std::string& k) { return annotations().count(k) || k.rfind("x-", 0) == 0; }

const std::set<std::string> kObjectKw = {"properties", "required", "additionalProperties"};
const std::set<std::string> kArrayKw = {"items", "prefixItems", "minItems", "maxItems", "uniqueItems"};
const std::set<std::string> kStringKw = {"minLength", "maxLength", "pattern", "format"};
const std::set<std::string> kNumberKw = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"};

std::string pointer_escape(const std::string& k) {
  std::string o;
  for (char c : k) {
    if (c == '~') o += "~0";
    else if (c == '/') o += "~1";
    else o += c;
  }
  return o;
}

// Regexes of the supported string formats, in decoded-string terms (RFC 3339, RFC 4122, ...).
// Each generates a subset of the format: days beyond the 28th of February are left out, IPv6
// is the full eight-group form.
const char* format_pattern(const std::string& f) {
  static const std::string kDate =
      "\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|02-(?:0[1-9]|1\\d|2[0-8]))";
  static const std::string kTime = "(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(?:\\.\\d{1,6})?(?:Z|[+-](?:[01]\\d|2[0-3]):[0-5]\\d)";
  static const std::string kDateTime = kDate + "T" + kTime;
  static const std::string kLabel = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
  static const std::string kHost = kLabel + "(?:\\." + kLabel + ")*";
  static const std::string kEmail = "[A-Za-z0-9_+-]+(?:\\.[A-Za-z0-9_+-]+)*@" + kLabel + "(?:\\." + kLabel + ")*\\.[A-Za-z]{2,6}";
  if (f == "date") return kDate.c_str();
  if (f == "time") return kTime.c_str();
  if (f == "date-time") return kDateTime.c_str();
  if (f == "uuid") return "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}";
  if (f == "ipv4") return "(?:(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)\\.){3}(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)";
  if (f == "ipv6") return "(?:[0-9a-f]{1,4}:){7}[0-9a-f]{1,4}";
  if (f == "hostname") return kHost.c_str();
  if (f == "email") return kEmail.c_str();
  return nullptr;
}

// JSON types a schema can produce, as bits (cheap and conservative: unknown -> all).
enum : unsigned { kNull = 1, kBool = 2, kNum = 4, kStr = 8, kArr = 16, kObj = 32, kAll = 63 };
unsigned type_bit(const std::string& t) {
  if (t == "null") return kNull;
  if (t == "boolean") return kBool;
  if (t == "number" || t == "integer") return kNum;
  if (t == "string") return kStr;
  if (t == "array") return kArr;
  if (t == "object") return kObj;
  return kAll;
}
unsigned value_bit(const Json& v) {
  if (v.is_null()) return kNull;
  if (v.is_boolean()) return kBool;
  if (v.is_number()) return kNum;
  if (v.is_string()) return kStr;
  if (v.is_array()) return kArr;
  return kObj;
}

int64_t read_count(const Json& s, const char* key, const std::string& path, int64_t dflt) {
  auto it = s.find(key);
  if (it == s.end()) return dflt;
  if (!it->is_number_integer() || it->get<int64_t>() < 0)
    throw GrammarError(str_cat("'", key, "' must be a non-negative integer"), key, path);
  return it->get<int64_t>();
}

}  // namespace

JsonSchemaCompiler::JsonSchemaCompiler(Builder& b, const Json& root, const GrammarOptions& o, CharSet string_chars)
    : b_(b), root_(root), o_(o), chars_(std::move(string_chars)) {}

Builder::Id JsonSchemaCompiler::ws() {
  if (o_.max_whitespace <= 0) return b_.empty();
  return b_.repeat(b_.bytes_in({{' ', ' '}, {'\n', '\n'}, {'\t', '\t'}}), 0, o_.max_whitespace);
}

Builder::Id JsonSchemaCompiler::value(const Json& s, const std::string& path, ValueForm form) {
  struct Depth {
    int& d;
    ~Depth() { --d; }
  } guard{++depth_};
  if (depth_ > kMaxSchemaDepth)
    throw GrammarError(str_cat("the schema nests deeper than ", kMaxSchemaDepth, " levels"), "", path);
  if (s.is_boolean()) return s.get<bool>() ? any_value(form) : b_.nothing();
  if (!s.is_object()) throw GrammarError("a schema must be an object or a boolean", "", path);
  std::vector<std::string> constraints;
  for (auto it = s.begin(); it != s.end(); ++it) {
    if (is_annotation(it.key())) continue;
    if (!supported().count(it.key()))
      throw GrammarError(str_cat("the JSON Schema keyword '", it.key(), "' is not supported"), it.key(), path);
    constraints.push_back(it.key());
  }
  auto others = [&](std::initializer_list<const char*> allowed) -> std::string {
    for (const std::string& c : constraints) {
      bool ok = false;
      for (const char* a : allowed) ok = ok || c == a;
      if (!ok) return c;
    }
    return "";
  };
  if (s.contains("$ref")) {
    if (std::string o = others({"$ref"}); !o.empty())
      throw GrammarError(str_cat("'", o, "' next to '$ref' is not supported"), o, path);
    if (!s["$ref"].is_string()) throw GrammarError("'$ref' must be a string", "$ref", path);
    return ref(s["$ref"].get<std::string>(), path, form);
  }
  if (s.contains("allOf")) {
    const Json& a = s["allOf"];
    if (!a.is_array() || a.size() != 1) throw GrammarError("'allOf' is supported with exactly one schema", "allOf", path);
    if (std::string o = others({"allOf"}); !o.empty())
      throw GrammarError(str_cat("'", o, "' next to 'allOf' is not supported"), o, path);
    return value(a[0], path + "/allOf/0", form);
  }
  for (const char* comb : {"anyOf", "oneOf"}) {
    if (!s.contains(comb)) continue;
    const Json& a = s[comb];
    if (!a.is_array() || a.empty()) throw GrammarError(str_cat("'", comb, "' must be a non-empty array"), comb, path);
    if (std::string o = others({comb}); !o.empty())
      throw GrammarError(str_cat("'", o, "' next to '", comb, "' is not supported"), o, path);
    if (std::string(comb) == "oneOf") check_one_of(a, path);
    std::vector<Builder::Id> alts;
    for (size_t i = 0; i < a.size(); ++i) alts.push_back(value(a[i], str_cat(path, "/", comb, "/", i), form));
    return b_.alt(std::move(alts));
  }
  // Types: given, or implied by the keywords (generating only those is a subset).
  std::vector<std::string> types;
  if (s.contains("type")) {
    const Json& t = s["type"];
    if (t.is_string()) types.push_back(t.get<std::string>());
    else if (t.is_array())
      for (const auto& x : t) {
        if (!x.is_string()) throw GrammarError("'type' must be a string or an array of strings", "type", path);
        types.push_back(x.get<std::string>());
      }
    else throw GrammarError("'type' must be a string or an array of strings", "type", path);
    for (const std::string& x : types)
      if (type_bit(x) == kAll) throw GrammarError(str_cat("unknown type '", x, "'"), "type", path);
  }
  auto has = [&](const char* t) {
    for (const std::string& x : types)
      if (x == t) return true;
    return false;
  };
  auto type_ok = [&](const Json& v) {
    if (types.empty()) return true;
    if (v.is_null()) return has("null");
    if (v.is_boolean()) return has("boolean");
    if (v.is_string()) return has("string");
    if (v.is_array()) return has("array");
    if (v.is_object()) return has("object");
    const bool whole = v.is_number_integer() || std::floor(v.get<double>()) == v.get<double>();
    return has("number") || (whole && has("integer"));
  };
  if (s.contains("const") || s.contains("enum")) {
    if (std::string o = others({"const", "enum", "type"}); !o.empty())
      throw GrammarError(str_cat("'", o, "' next to 'const'/'enum' is not supported"), o, path);
    std::vector<Json> values;
    if (s.contains("const")) values.push_back(s["const"]);
    if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty()) throw GrammarError("'enum' must be a non-empty array", "enum", path);
      if (s.contains("const")) throw GrammarError("'const' together with 'enum' is not supported", "enum", path);
      for (const auto& v : s["enum"]) values.push_back(v);
    }
    std::vector<Builder::Id> alts;
    for (const Json& v : values)
      if (type_ok(v)) alts.push_back(literal_value(v, form));
    return b_.alt(std::move(alts));
  }
  if (types.empty()) {
    auto has_any = [&](const std::set<std::string>& kw) {
      for (const std::string& c : constraints)
        if (kw.count(c)) return true;
      return false;
    };
    if (has_any(kObjectKw)) types.push_back("object");
    if (has_any(kArrayKw)) types.push_back("array");
    if (has_any(kStringKw)) types.push_back("string");
    if (has_any(kNumberKw)) types.push_back("number");
    if (types.empty()) return any_value(form);
  }
  std::vector<Builder::Id> alts;
  for (const std::string& t : types) {
    if (form == ValueForm::RawString && t != "string") continue;
    if (form == ValueForm::JsonNonString && t == "string") continue;
    alts.push_back(typed(s, path, t, form));
  }
  return b_.alt(std::move(alts));
}

Builder::Id JsonSchemaCompiler::typed(const Json& s, const std::string& path, const std::string& t, ValueForm form) {
  if (t == "string") return string(s, path, form);
  if (t == "number") return number(s, path, false);
  if (t == "integer") return number(s, path, true);
  if (t == "boolean") return b_.alt({b_.literal("true"), b_.literal("false")});
  if (t == "null") return b_.literal("null");
  if (t == "object") return object(s, path);
  if (t == "array") return array(s, path);
  throw GrammarError(str_cat("unknown type '", t, "'"), "type", path);
}

Builder::Id JsonSchemaCompiler::object(const Json& s, const std::string& path) {
  const Json empty_props = Json::object();
  const Json& props = s.contains("properties") ? s["properties"] : empty_props;
  if (!props.is_object()) throw GrammarError("'properties' must be an object", "properties", path);
  std::set<std::string> required;
  if (s.contains("required")) {
    if (!s["required"].is_array()) throw GrammarError("'required' must be an array of strings", "required", path);
    for (const auto& r : s["required"]) {
      if (!r.is_string()) throw GrammarError("'required' must be an array of strings", "required", path);
      required.insert(r.get<std::string>());
    }
  }
  // additionalProperties: false, or absent next to properties -> no other keys (a subset of
  // what an absent one allows, as OpenAI's strict mode); true, or absent without properties
  // (a bare {"type": "object"}) -> any value; a schema -> values of it.
  const Json* extra_schema = nullptr;
  const Json any_schema = true;
  bool extra_forbidden = false;
  if (!s.contains("additionalProperties") && !s.contains("properties")) extra_schema = &any_schema;
  if (s.contains("additionalProperties")) {
    const Json& a = s["additionalProperties"];
    if (a.is_boolean()) {
      if (a.get<bool>()) extra_schema = &any_schema;
      else extra_forbidden = true;
    } else if (a.is_object()) {
      extra_schema = &a;
    } else {
      throw GrammarError("'additionalProperties' must be a boolean or a schema", "additionalProperties", path);
    }
  }
  const Builder::Id colon = b_.seq({ws(), b_.byte(':'), ws()});
  std::vector<std::pair<Builder::Id, bool>> items;
  std::vector<std::string> keys;
  for (auto it = props.begin(); it != props.end(); ++it) {
    keys.push_back(it.key());
    const Builder::Id v = value(it.value(), path + "/properties/" + pointer_escape(it.key()));
    items.push_back({b_.seq({b_.literal(json_quote(it.key())), colon, v}), required.count(it.key()) > 0});
  }
  for (const std::string& r : required) {
    if (props.contains(r)) continue;
    if (extra_forbidden)
      throw GrammarError(str_cat("required property '", r, "' is not in 'properties' and additionalProperties is false"),
                         "required", path);
    const Builder::Id v = value(extra_schema ? *extra_schema : any_schema, path + "/additionalProperties");
    items.push_back({b_.seq({b_.literal(json_quote(r)), colon, v}), true});
    keys.push_back(r);
  }
  Builder::Id extra = -1;
  if (extra_schema && o_.additional_properties)
    extra = b_.seq({key_not_in(keys), colon, value(*extra_schema, path + "/additionalProperties")});
  const Builder::Id sep = b_.seq({ws(), b_.byte(','), ws()});
  return b_.seq({b_.byte('{'), ws(), b_.members(items, sep, extra, -1), ws(), b_.byte('}')});
}

Builder::Id JsonSchemaCompiler::array(const Json& s, const std::string& path) {
  const int64_t min = read_count(s, "minItems", path, 0);
  const int64_t max = read_count(s, "maxItems", path, -1);
  if (max >= 0 && max < min) throw GrammarError("'maxItems' is below 'minItems'", "maxItems", path);
  if (min > 1000 || max > 100000) throw GrammarError("minItems above 1000 / maxItems above 100000 are not supported", "maxItems", path);
  if (s.contains("uniqueItems") && !(s["uniqueItems"].is_boolean() && !s["uniqueItems"].get<bool>()))
    throw GrammarError("'uniqueItems' is not supported", "uniqueItems", path);
  std::vector<const Json*> prefix;
  std::string prefix_key = "prefixItems";
  if (s.contains("prefixItems")) {
    if (!s["prefixItems"].is_array()) throw GrammarError("'prefixItems' must be an array", "prefixItems", path);
    for (const auto& p : s["prefixItems"]) prefix.push_back(&p);
  }
  // Older drafts' tuple form (items: [...]): the tuple, with no further items.
  const Json any_schema = true, no_schema = false;
  const Json* items = &any_schema;
  std::string items_path = path + "/items";
  if (s.contains("items")) {
    const Json& it = s["items"];
    if (it.is_array()) {
      if (!prefix.empty()) throw GrammarError("'items' as an array next to 'prefixItems'", "items", path);
      for (const auto& p : it) prefix.push_back(&p);
      prefix_key = "items";
      items = &no_schema;
    } else {
      items = &it;
    }
  }
  const Builder::Id sep = b_.seq({ws(), b_.byte(','), ws()});
  const Builder::Id item = value(*items, items_path);
  const int64_t k = max >= 0 ? std::min<int64_t>(int64_t(prefix.size()), max) : int64_t(prefix.size());
  // Items after the prefix: seq(sep, item) a..b times (each after an element).
  const int64_t tail_min = std::max<int64_t>(min - k, 0);
  const int64_t tail_max = max < 0 ? -1 : max - k;
  Builder::Id list;
  if (k == 0) {
    if (max == 0) return b_.seq({b_.byte('['), ws(), b_.byte(']')});
    const Builder::Id rest = b_.repeat(b_.seq({sep, item}), int(std::max<int64_t>(min - 1, 0)), int(max < 0 ? -1 : max - 1));
    list = b_.seq({item, rest});
    if (min == 0) list = b_.optional(list);
  } else {
    Builder::Id acc = b_.node(item).kind == Builder::Kind::Nothing || tail_max == 0
                          ? (tail_min > 0 ? b_.nothing() : b_.empty())
                          : b_.repeat(b_.seq({sep, item}), int(tail_min), int(tail_max));
    for (int64_t i = k - 1; i >= 0; --i) {
      const Builder::Id v = value(*prefix[size_t(i)], str_cat(path, "/", prefix_key, "/", i));
      Builder::Id here = b_.seq({i > 0 ? sep : b_.empty(), v, acc});
      acc = i >= min ? b_.optional(here) : here;
    }
    list = acc;
  }
  return b_.seq({b_.byte('['), ws(), list, ws(), b_.byte(']')});
}

Builder::Id JsonSchemaCompiler::string(const Json& s, const std::string& path, ValueForm form) {
  const bool raw = form == ValueForm::RawString;
  const CharMode mode = raw ? CharMode::Raw : CharMode::JsonString;
  const CharSet& allowed = chars_;
  const int64_t min = read_count(s, "minLength", path, 0);
  const int64_t max = read_count(s, "maxLength", path, -1);
  if (max >= 0 && max < min) throw GrammarError("'maxLength' is below 'minLength'", "maxLength", path);
  if (min > kMaxStringLength || max > kMaxStringLength)
    throw GrammarError(str_cat("minLength/maxLength above ", kMaxStringLength, " are not supported"),
                       max > kMaxStringLength ? "maxLength" : "minLength", path);
  const bool counted = s.contains("minLength") || s.contains("maxLength");
  Builder::Id body;
  if (s.contains("pattern") || s.contains("format")) {
    const char* key = s.contains("pattern") ? "pattern" : "format";
    if (s.contains("pattern") && s.contains("format")) throw GrammarError("'pattern' together with 'format'", "format", path);
    if (counted) throw GrammarError(str_cat("'", key, "' together with minLength/maxLength is not supported"), key, path);
    if (!s[key].is_string()) throw GrammarError(str_cat("'", key, "' must be a string"), key, path);
    const std::string v = s[key].get<std::string>();
    std::string pattern = v;
    if (std::string(key) == "format") {
      const char* p = format_pattern(v);
      if (!p) throw GrammarError(str_cat("the string format '", v, "' is not supported"), "format", path);
      pattern = p;
    }
    try {
      body = regex_expr(b_, pattern, mode, allowed);
    } catch (const GrammarError& e) {
      throw GrammarError(str_cat("'", key, "': ", e.what()), key, path);
    }
  } else {
    body = b_.repeat(emit_chars(b_, allowed, mode), int(min), int(max), /*inline_copies=*/true);
  }
  if (raw) return body;
  return b_.seq({b_.byte('"'), body, b_.byte('"')});
}

Builder::Id JsonSchemaCompiler::number(const Json& s, const std::string& path, bool integer) {
  auto num = [&](const char* key) -> std::optional<double> {
    auto it = s.find(key);
    if (it == s.end() || it->is_boolean()) return std::nullopt;
    if (!it->is_number()) throw GrammarError(str_cat("'", key, "' must be a number"), key, path);
    return it->get<double>();
  };
  if (s.contains("multipleOf")) {
    const Json& m = s["multipleOf"];
    if (!(integer && m.is_number() && m.get<double>() == 1.0))
      throw GrammarError("'multipleOf' is not supported (except 1 on integers)", "multipleOf", path);
  }
  std::optional<double> mn = num("minimum"), mx = num("maximum"), xmn = num("exclusiveMinimum"), xmx = num("exclusiveMaximum");
  // Draft 4: exclusiveMinimum/exclusiveMaximum are booleans that modify minimum/maximum.
  if (s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_boolean() && s["exclusiveMinimum"].get<bool>() && mn) {
    xmn = mn;
    mn.reset();
  }
  if (s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_boolean() && s["exclusiveMaximum"].get<bool>() && mx) {
    xmx = mx;
    mx.reset();
  }
  if (integer) {
    constexpr double kLim = 9.0e18;
    auto clamp = [&](double v) { return int64_t(std::max(-kLim, std::min(kLim, v))); };
    std::optional<int64_t> lo, hi;
    if (mn) lo = clamp(std::ceil(*mn));
    if (xmn) lo = std::max(lo.value_or(INT64_MIN), clamp(std::floor(*xmn) + 1));
    if (mx) hi = clamp(std::floor(*mx));
    if (xmx) hi = std::min(hi.value_or(INT64_MAX), clamp(std::ceil(*xmx) - 1));
    try {
      return integer_expr(b_, lo, hi);
    } catch (const GrammarError& e) {
      throw GrammarError(e.what(), e.keyword, path);
    }
  }
  std::optional<DecimalBound> lo, hi;
  if (mn) lo = DecimalBound{plain_decimal(*mn), false};
  if (xmn && (!mn || *xmn >= *mn)) lo = DecimalBound{plain_decimal(*xmn), true};
  if (mx) hi = DecimalBound{plain_decimal(*mx), false};
  if (xmx && (!mx || *xmx <= *mx)) hi = DecimalBound{plain_decimal(*xmx), true};
  try {
    return number_expr(b_, lo, hi);
  } catch (const GrammarError& e) {
    throw GrammarError(e.what(), e.keyword, path);
  }
}

Builder::Id JsonSchemaCompiler::literal_value(const Json& v, ValueForm form) {
  switch (form) {
    case ValueForm::Json: return b_.literal(v.dump());
    case ValueForm::RawString: {
      if (!v.is_string()) return b_.nothing();
      const std::string t = v.get<std::string>();
      return chars_within(t, chars_) ? b_.literal(t) : b_.nothing();
    }
    case ValueForm::JsonNonString: return v.is_string() ? b_.nothing() : b_.literal(v.dump());
  }
  return b_.nothing();
}

Builder::Id JsonSchemaCompiler::any_string(ValueForm form) {
  if (form == ValueForm::RawString) return b_.repeat(emit_chars(b_, chars_, CharMode::Raw), 0, -1);
  return b_.seq({b_.byte('"'), b_.repeat(emit_chars(b_, chars_, CharMode::JsonString), 0, -1), b_.byte('"')});
}

int32_t JsonSchemaCompiler::any_rule(bool object) {
  int32_t& r = object ? any_object_rule_ : any_array_rule_;
  if (r >= 0) return r;
  r = b_.add_rule(object ? "json-object" : "json-array");
  const int32_t rule = r;  // any_value below may create the other rule
  const Builder::Id sep = b_.seq({ws(), b_.byte(','), ws()});
  Builder::Id body;
  if (object) {
    const Builder::Id pair = b_.seq({any_string(ValueForm::Json), ws(), b_.byte(':'), ws(), any_value()});
    body = b_.seq({b_.byte('{'), ws(), b_.optional(b_.seq({pair, b_.repeat(b_.seq({sep, pair}), 0, -1)})), ws(), b_.byte('}')});
  } else {
    const Builder::Id v = any_value();
    body = b_.seq({b_.byte('['), ws(), b_.optional(b_.seq({v, b_.repeat(b_.seq({sep, v}), 0, -1)})), ws(), b_.byte(']')});
  }
  b_.define(rule, body);
  return rule;
}

Builder::Id JsonSchemaCompiler::any_value(ValueForm form) {
  if (form == ValueForm::RawString) return any_string(form);
  std::vector<Builder::Id> alts;
  if (form == ValueForm::Json) alts.push_back(any_string(form));
  alts.push_back(number_expr(b_, std::nullopt, std::nullopt));
  alts.push_back(b_.literal("true"));
  alts.push_back(b_.literal("false"));
  alts.push_back(b_.literal("null"));
  // Objects and arrays nest through rules (their depth is bounded at run time).
  const int32_t obj = any_rule(true), arr = any_rule(false);
  alts.push_back(b_.call(obj));
  alts.push_back(b_.call(arr));
  return b_.alt(std::move(alts));
}

Builder::Id JsonSchemaCompiler::any_object() { return b_.call(any_rule(true)); }

// "key" for keys of [A-Za-z0-9_-]+ that are none of `keys` (extra properties must not repeat a
// declared one: a duplicate key would replace the declared value when parsed).
Builder::Id JsonSchemaCompiler::key_not_in(const std::vector<std::string>& keys) {
  static const char kAlphabet[] = "-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz";
  const std::string alphabet = kAlphabet;
  struct Trie {
    std::map<char, int> next;
    bool end = false;
  };
  std::vector<Trie> t(1);
  for (const std::string& k : keys) {
    if (k.empty() || k.find_first_not_of(alphabet) != std::string::npos) continue;  // cannot collide
    int n = 0;
    for (char c : k) {
      auto it = t[size_t(n)].next.find(c);
      if (it == t[size_t(n)].next.end()) {
        t.emplace_back();
        const int m = int(t.size() - 1);
        t[size_t(n)].next[c] = m;
        n = m;
      } else {
        n = it->second;
      }
    }
    t[size_t(n)].end = true;
  }
  auto ranges_of = [&](const std::string& chars) {
    std::vector<ByteRange> r;
    for (char c : chars) r.push_back({uint8_t(c), uint8_t(c)});
    return r;
  };
  const Builder::Id any_key_char = b_.bytes_in(ranges_of(alphabet));
  std::function<Builder::Id(int, bool)> rest = [&](int n, bool is_root) -> Builder::Id {
    std::vector<Builder::Id> alts;
    if (!is_root && !t[size_t(n)].end) alts.push_back(b_.empty());
    std::string others;
    for (char c : alphabet)
      if (!t[size_t(n)].next.count(c)) others += c;
    if (!others.empty()) alts.push_back(b_.seq({b_.bytes_in(ranges_of(others)), b_.repeat(any_key_char, 0, -1)}));
    for (auto [c, m] : t[size_t(n)].next) alts.push_back(b_.seq({b_.byte(uint8_t(c)), rest(m, false)}));
    return b_.alt(std::move(alts));
  };
  return b_.seq({b_.byte('"'), rest(0, true), b_.byte('"')});
}

const Json& JsonSchemaCompiler::resolve(const std::string& pointer, const std::string& path) const {
  if (pointer.empty() || pointer[0] != '#')
    throw GrammarError(str_cat("$ref '", pointer, "' is not supported (only local references, \"#...\")"), "$ref", path);
  std::string p;
  for (size_t i = 1; i < pointer.size(); ++i) {  // percent-decoding of the URI fragment
    if (pointer[i] == '%' && i + 2 < pointer.size() && std::isxdigit(uint8_t(pointer[i + 1])) &&
        std::isxdigit(uint8_t(pointer[i + 2]))) {
      p += char(std::stoi(pointer.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      p += pointer[i];
    }
  }
  try {
    return root_.at(Json::json_pointer(p));
  } catch (const std::exception&) {
    throw GrammarError(str_cat("$ref '", pointer, "' does not resolve in the schema"), "$ref", path);
  }
}

Builder::Id JsonSchemaCompiler::ref(const std::string& pointer, const std::string& path, ValueForm form) {
  const Json& target = resolve(pointer, path);
  if (form != ValueForm::Json) return value(target, pointer, form);  // the top of a DSML value: inline
  auto it = ref_rules_.find(pointer);
  if (it != ref_rules_.end()) return b_.call(it->second);
  const int32_t r = b_.add_rule(pointer);
  ref_rules_[pointer] = r;  // before the body: the body may refer to it again
  b_.define(r, value(target, pointer, ValueForm::Json));
  return b_.call(r);
}

// oneOf is anyOf when no value can match two alternatives: pairwise different JSON types, or
// objects told apart by a required property with different const/enum values.
void JsonSchemaCompiler::check_one_of(const Json& alts, const std::string& path) {
  std::function<const Json&(const Json&, int)> deref = [&](const Json& s, int d) -> const Json& {
    if (d < 16 && s.is_object() && s.contains("$ref") && s["$ref"].is_string())
      return deref(resolve(s["$ref"].get<std::string>(), path), d + 1);
    if (d < 16 && s.is_object() && s.contains("allOf") && s["allOf"].is_array() && s["allOf"].size() == 1)
      return deref(s["allOf"][0], d + 1);
    return s;
  };
  std::function<unsigned(const Json&, int)> types = [&](const Json& s0, int d) -> unsigned {
    const Json& s = deref(s0, 0);
    if (s.is_boolean()) return s.get<bool>() ? unsigned(kAll) : 0u;
    if (!s.is_object() || d > 16) return kAll;
    if (s.contains("const")) return value_bit(s["const"]);
    if (s.contains("enum") && s["enum"].is_array()) {
      unsigned m = 0;
      for (const auto& v : s["enum"]) m |= value_bit(v);
      return m;
    }
    for (const char* c : {"anyOf", "oneOf"})
      if (s.contains(c) && s[c].is_array()) {
        unsigned m = 0;
        for (const auto& a : s[c]) m |= types(a, d + 1);
        return m;
      }
    if (s.contains("type")) {
      unsigned m = 0;
      if (s["type"].is_string()) m = type_bit(s["type"].get<std::string>());
      else if (s["type"].is_array())
        for (const auto& t : s["type"]) m |= t.is_string() ? type_bit(t.get<std::string>()) : kAll;
      return m;
    }
    return kAll;
  };
  auto tag_values = [&](const Json& s0, const std::string& prop) -> std::set<std::string> {
    const Json& s = deref(s0, 0);
    std::set<std::string> out;
    if (!s.is_object() || !s.contains("required") || !s.contains("properties")) return out;
    bool req = false;
    for (const auto& r : s["required"]) req = req || (r.is_string() && r.get<std::string>() == prop);
    if (!req || !s["properties"].is_object() || !s["properties"].contains(prop)) return out;
    const Json& p = deref(s["properties"][prop], 0);
    if (!p.is_object()) return out;
    if (p.contains("const")) out.insert(p["const"].dump());
    else if (p.contains("enum") && p["enum"].is_array())
      for (const auto& v : p["enum"]) out.insert(v.dump());
    return out;
  };
  auto discriminated = [&](const Json& a, const Json& b) {
    const Json& s = deref(a, 0);
    if (!s.is_object() || !s.contains("properties") || !s["properties"].is_object()) return false;
    for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it) {
      const std::set<std::string> x = tag_values(a, it.key()), y = tag_values(b, it.key());
      if (x.empty() || y.empty()) continue;
      bool overlap = false;
      for (const std::string& v : x) overlap = overlap || y.count(v);
      if (!overlap) return true;
    }
    return false;
  };
  for (size_t i = 0; i < alts.size(); ++i)
    for (size_t j = i + 1; j < alts.size(); ++j) {
      const unsigned ti = types(alts[i], 0), tj = types(alts[j], 0);
      if ((ti & tj) == 0) continue;
      if (ti == kObj && tj == kObj && discriminated(alts[i], alts[j])) continue;
      throw GrammarError(str_cat("'oneOf' alternatives ", i, " and ", j,
                                 " may match the same value, which cannot be enforced (use anyOf, or tell objects "
                                 "apart by a required const property)"),
                         "oneOf", path);
    }
}

}  // namespace dil::grammar
