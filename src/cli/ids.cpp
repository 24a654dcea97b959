#include "cli/ids.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/check.h"

namespace dil::cli {

std::vector<int> parse_int_list(const std::string& s) {
  std::vector<int> out;
  std::string cur;
  auto flush = [&] {
    if (cur.empty()) return;
    try {
      size_t used = 0;
      long v = std::stol(cur, &used);
      if (used != cur.size()) throw std::invalid_argument(cur);
      out.push_back(int(v));
    } catch (const std::exception&) {
      DIL_FAIL("not an integer: '", cur, "'");
    }
    cur.clear();
  };
  for (char ch : s) {
    if (ch == ',' || ch == ' ' || ch == '\n' || ch == '\t' || ch == '\r' || ch == '[' || ch == ']') flush();
    else cur += ch;
  }
  flush();
  return out;
}

std::vector<int32_t> parse_ids(const std::string& list_or_file) {
  std::string text = list_or_file;
  std::error_code ec;  // a long id list is not a valid path: no exception
  if (std::filesystem::is_regular_file(list_or_file, ec)) {
    std::ifstream in(list_or_file);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  std::vector<int> v = parse_int_list(text);
  return std::vector<int32_t>(v.begin(), v.end());
}

}  // namespace dil::cli
