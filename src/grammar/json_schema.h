// JSON Schema -> grammar expressions for one JSON value.
//
// The subset of the OpenAI structured-outputs documentation, plus a little:
//  - type (one or a list): string, number, integer, boolean, null, object, array
//  - object: properties (written in their declared order, each optional one may be left out),
//    required, additionalProperties (false, or absent next to properties: no other keys; true,
//    a schema, or absent without properties: extra keys of [A-Za-z0-9_-] that differ from the
//    declared ones)
//  - array: items, prefixItems, minItems, maxItems
//  - string: minLength, maxLength (<= 2000), pattern (regex.h), format (date, time,
//    date-time, uuid, email, ipv4, ipv6, hostname)
//  - number/integer: minimum, maximum, exclusiveMinimum, exclusiveMaximum
//  - enum, const, anyOf, oneOf (when its alternatives cannot overlap), allOf of one schema,
//    $ref to "#..." JSON pointers ($defs, definitions, recursion through rules)
//  - annotations (title, description, default, examples, $schema, $id, $comment, deprecated,
//    readOnly, writeOnly, discriminator, nullable, x-*) are ignored: they do not restrict
// Any other keyword throws GrammarError naming it and its JSON pointer: nothing a schema
// requires is silently dropped. Free choices are bounded (whitespace, digit counts), so the
// language is a subset of the schema's and every output of it validates.
#pragma once
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "grammar/builder.h"
#include "grammar/charset.h"

namespace dil::grammar {

using Json = nlohmann::ordered_json;

// How the value is written. The DSML tool-call format writes a string parameter raw (its
// characters, no quotes or escapes) and any other parameter as JSON.
enum class ValueForm : uint8_t { Json, RawString, JsonNonString };

class JsonSchemaCompiler {
 public:
  // `root` ($ref pointers resolve against it) must outlive the compiler. `string_chars`: the
  // characters a generated string may hold (raw or JSON; enum/const values outside it are
  // left out of raw strings).
  JsonSchemaCompiler(Builder& b, const Json& root, const GrammarOptions& o, CharSet string_chars = CharSet::all());

  // The value `schema` describes; `path` is its JSON pointer (for errors).
  Builder::Id value(const Json& schema, const std::string& path, ValueForm form = ValueForm::Json);
  Builder::Id root_value() { return value(root_, ""); }
  Builder::Id any_value(ValueForm form = ValueForm::Json);  // any JSON value, nesting bounded by max_depth
  Builder::Id any_object();                                 // json_object mode
  Builder::Id ws();                                         // optional bounded whitespace

 private:
  Builder::Id typed(const Json& s, const std::string& path, const std::string& type, ValueForm form);
  Builder::Id object(const Json& s, const std::string& path);
  Builder::Id array(const Json& s, const std::string& path);
  Builder::Id string(const Json& s, const std::string& path, ValueForm form);
  Builder::Id number(const Json& s, const std::string& path, bool integer);
  Builder::Id literal_value(const Json& v, ValueForm form);
  Builder::Id any_string(ValueForm form);
  Builder::Id key_not_in(const std::vector<std::string>& keys);
  Builder::Id ref(const std::string& pointer, const std::string& path, ValueForm form);
  const Json& resolve(const std::string& pointer, const std::string& path) const;
  void check_one_of(const Json& alts, const std::string& path);
  int32_t any_rule(bool object);

  Builder& b_;
  const Json& root_;
  GrammarOptions o_;
  CharSet chars_;
  std::map<std::string, int32_t> ref_rules_;  // pointer -> rule
  int32_t any_object_rule_ = -1, any_array_rule_ = -1;
  int depth_ = 0;  // schema nesting while compiling
};

}  // namespace dil::grammar
