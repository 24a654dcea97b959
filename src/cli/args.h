// Tiny flag parser for the CLI: --name value, --name=value and boolean --flag.
#pragma once
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/check.h"

namespace dil::cli {

class Args {
 public:
  // `flags` lists the boolean options (no value).
  Args(int argc, char** argv, std::set<std::string> flags = {}) {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a.rfind("--", 0) != 0) {
        positional_.push_back(a);
        continue;
      }
      std::string k = a.substr(2), v;
      auto eq = k.find('=');
      if (eq != std::string::npos) {
        v = k.substr(eq + 1);
        k = k.substr(0, eq);
      } else if (flags.count(k)) {
        v = "1";
      } else {
        if (i + 1 >= argc) DIL_FAIL("option --", k, " needs a value");
        v = argv[++i];
      }
      values_[k] = v;
    }
  }
  bool has(const std::string& k) const { return values_.count(k) > 0; }
  std::string get(const std::string& k, const std::string& def = "") const {
    auto it = values_.find(k);
    return it == values_.end() ? def : it->second;
  }
  std::string need(const std::string& k) const {
    if (!has(k)) DIL_FAIL("missing required option --", k);
    return get(k);
  }
  long get_int(const std::string& k, long def) const {
    if (!has(k)) return def;
    try {
      return std::stol(get(k));
    } catch (...) {
      DIL_FAIL("option --", k, " expects an integer, got '", get(k), "'");
    }
  }
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

}  // namespace dil::cli
