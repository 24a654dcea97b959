// The structured-output fields of a request (response_format, vLLM's guided_* and
// structured_outputs), parsed in structured_protocol.cpp; structured.h compiles them.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dil::server {

using Json = nlohmann::ordered_json;

struct OutputFormat {
  enum class Kind : uint8_t { Text, JsonObject, JsonSchema, Regex, Choice };
  Kind kind = Kind::Text;
  Json schema;                       // JsonSchema
  std::string regex;                 // Regex
  std::vector<std::string> choices;  // Choice
  std::string param;                 // the request field it came from (errors name it)
  int max_whitespace = -1;           // -1: the default; structured_outputs.disable_any_whitespace: 0
  bool additional_properties = true; // false: structured_outputs.disable_additional_properties
};

// Reads and checks the structured-output fields of a request body (400 on a wrong shape, an
// unsupported kind, or more than one of them).
OutputFormat parse_output_format(const Json& body);

}  // namespace dil::server
