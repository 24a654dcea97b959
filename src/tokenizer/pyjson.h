// Python-compatible rendering of JSON values, so prompts match DeepSeek's Python encoders byte
// for byte: json.dumps(v, ensure_ascii=False) and str(v) of scalars.
#pragma once
#include <string>

#include "tokenizer/tokenizer.h"

namespace dil::tok {

// json.dumps(v, ensure_ascii=False): separators ", " and ": ", keys in insertion order,
// floats as Python's repr (1.0, 1e-05, 1e+16).
std::string py_json_dumps(const Json& v);
// JSON string literal of `s` the way json.dumps writes it (ensure_ascii=False).
std::string py_json_string(const std::string& s);
// Python truthiness of a JSON value (None, "", [], {}, 0, false are false).
bool py_truthy(const Json& v);
// str(v) for scalars as str.format would insert them; dil::Error for arrays/objects.
std::string py_str(const Json& v, const char* what);

}  // namespace dil::tok
