// The structured-output fields of a request body -> OutputFormat (structured.h).
#include "core/check.h"
#include "server/structured.h"

namespace dil::server {
namespace {

[[noreturn]] void bad(const std::string& param, const std::string& msg, const std::string& code = "") {
  throw ApiError(400, msg, param, code);
}

const Json* field(const Json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

// A schema given as an object/boolean, or as a string holding one (vLLM accepts both).
Json schema_of(const Json& v, const std::string& param) {
  if (v.is_object() || v.is_boolean()) return v;
  if (v.is_string()) {
    try {
      Json s = Json::parse(v.get<std::string>());
      if (s.is_object() || s.is_boolean()) return s;
    } catch (const Json::exception&) {
    }
    bad(param, "'" + param + "' holds a string that is not a JSON Schema object");
  }
  bad(param, "'" + param + "' must be a JSON Schema object");
}

std::vector<std::string> choices_of(const Json& v, const std::string& param) {
  if (!v.is_array() || v.empty()) bad(param, "'" + param + "' must be a non-empty array of strings");
  std::vector<std::string> out;
  for (const auto& c : v) {
    if (!c.is_string()) bad(param, "'" + param + "' must be a non-empty array of strings");
    out.push_back(c.get<std::string>());
  }
  return out;
}

[[noreturn]] void unsupported(const std::string& param, const std::string& what) {
  bad(param, "'" + param + "' is not supported: " + what, "unsupported_structured_output");
}

// Every constraint the body asks for, in the order the fields are checked.
std::vector<OutputFormat> read_all(const Json& j) {
  std::vector<OutputFormat> out;
  if (const Json* v = field(j, "response_format")) {
    if (!v->is_object()) bad("response_format", "'response_format' must be an object");
    const Json* t = field(*v, "type");
    if (!t || !t->is_string()) bad("response_format.type", "'response_format.type' must be a string");
    const std::string type = t->get<std::string>();
    OutputFormat f;
    f.param = "response_format";
    if (type == "json_object") {
      f.kind = OutputFormat::Kind::JsonObject;
      out.push_back(f);
    } else if (type == "json_schema") {
      const Json* js = field(*v, "json_schema");
      if (!js || !js->is_object())
        bad("response_format.json_schema", "response_format of type json_schema needs a 'json_schema' object");
      if (const Json* n = field(*js, "name"); n && !n->is_string())
        bad("response_format.json_schema.name", "'response_format.json_schema.name' must be a string");
      if (const Json* st = field(*js, "strict"); st && !st->is_boolean())
        bad("response_format.json_schema.strict", "'response_format.json_schema.strict' must be a boolean");
      f.param = "response_format.json_schema.schema";
      // No schema: any JSON object (the json_object mode), as OpenAI treats it.
      if (const Json* s = field(*js, "schema")) {
        f.kind = OutputFormat::Kind::JsonSchema;
        f.schema = schema_of(*s, f.param);
      } else {
        f.kind = OutputFormat::Kind::JsonObject;
      }
      out.push_back(f);
    } else if (type != "text") {
      unsupported("response_format.type", "'" + type + "' (expected text, json_object or json_schema)");
    }
  }
  if (const Json* v = field(j, "guided_json")) {
    OutputFormat f;
    f.kind = OutputFormat::Kind::JsonSchema;
    f.param = "guided_json";
    f.schema = schema_of(*v, f.param);
    out.push_back(f);
  }
  if (const Json* v = field(j, "guided_regex")) {
    if (!v->is_string()) bad("guided_regex", "'guided_regex' must be a string");
    OutputFormat f;
    f.kind = OutputFormat::Kind::Regex;
    f.param = "guided_regex";
    f.regex = v->get<std::string>();
    out.push_back(f);
  }
  if (const Json* v = field(j, "guided_choice")) {
    OutputFormat f;
    f.kind = OutputFormat::Kind::Choice;
    f.param = "guided_choice";
    f.choices = choices_of(*v, f.param);
    out.push_back(f);
  }
  if (field(j, "guided_grammar"))
    unsupported("guided_grammar", "EBNF/Lark grammars cannot be compiled here; use guided_json, guided_regex or guided_choice");
  if (field(j, "guided_whitespace_pattern"))
    unsupported("guided_whitespace_pattern", "whitespace is fixed to at most 2 of [ \\n\\t] between JSON tokens");
  if (const Json* so = field(j, "structured_outputs")) {
    if (!so->is_object()) bad("structured_outputs", "'structured_outputs' must be an object");
    std::vector<OutputFormat> inner;
    for (auto it = so->begin(); it != so->end(); ++it) {
      const std::string k = it.key(), p = "structured_outputs." + k;
      const Json& v = it.value();
      if (v.is_null()) continue;
      OutputFormat f;
      f.param = p;
      if (k == "json") {
        f.kind = OutputFormat::Kind::JsonSchema;
        f.schema = schema_of(v, p);
      } else if (k == "regex") {
        if (!v.is_string()) bad(p, "'" + p + "' must be a string");
        f.kind = OutputFormat::Kind::Regex;
        f.regex = v.get<std::string>();
      } else if (k == "choice") {
        f.kind = OutputFormat::Kind::Choice;
        f.choices = choices_of(v, p);
      } else if (k == "json_object") {
        if (!v.is_boolean()) bad(p, "'" + p + "' must be a boolean");
        if (!v.get<bool>()) continue;
        f.kind = OutputFormat::Kind::JsonObject;
      } else if (k == "disable_any_whitespace" || k == "disable_additional_properties" || k == "disable_fallback") {
        if (!v.is_boolean()) bad(p, "'" + p + "' must be a boolean");
        continue;  // options, read below
      } else if (k == "grammar" || k == "structural_tag" || k == "whitespace_pattern") {
        unsupported(p, "only json, regex, choice and json_object are");
      } else {
        bad(p, "unknown field '" + p + "'");
      }
      inner.push_back(f);
    }
    if (inner.size() > 1) bad(inner[1].param, "structured_outputs takes one of json, regex, choice and json_object");
    for (OutputFormat& f : inner) {
      if (const Json* w = field(*so, "disable_any_whitespace"); w && w->get<bool>()) f.max_whitespace = 0;
      if (const Json* a = field(*so, "disable_additional_properties"); a && a->get<bool>()) f.additional_properties = false;
      out.push_back(f);
    }
  }
  return out;
}

}  // namespace

OutputFormat parse_output_format(const Json& body) {
  std::vector<OutputFormat> all = read_all(body);
  if (all.size() > 1)
    bad(all[1].param, "'" + all[1].param + "' conflicts with '" + all[0].param +
                          "': give one of response_format, guided_json, guided_regex, guided_choice, structured_outputs");
  return all.empty() ? OutputFormat{} : all[0];
}

}  // namespace dil::server
