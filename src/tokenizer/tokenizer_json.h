// Fast tokenizer.json reader: the 128k-entry vocabulary and merge list go straight into flat
// containers (a DOM of them takes ~5x longer to build); everything else becomes a normal DOM.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace dil::tok {

struct TokenizerJson {
  nlohmann::json doc;  // the whole file except model.vocab and model.merges
  bool has_vocab = false;
  std::vector<std::pair<std::string, int32_t>> vocab;        // model.vocab in file order
  std::vector<std::pair<std::string, std::string>> merges;   // model.merges ("a b" or ["a", "b"])
};

TokenizerJson read_tokenizer_json(const std::string& path);  // throws dil::Error

}  // namespace dil::tok
