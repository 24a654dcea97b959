// Parsing token-id lists for the CLI: "1,2,3", "1 2 3", a JSON array, or a file holding any of these.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dil::cli {
std::vector<int32_t> parse_ids(const std::string& list_or_file);
std::vector<int> parse_int_list(const std::string& s);
}  // namespace dil::cli
