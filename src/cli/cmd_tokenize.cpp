// `deepinfer-lab tokenize --tokenizer PATH [--decode] [--no-special]`: JSON lines in, JSON lines
// out. Encode: {"text": ...} -> {"ids": [...]}; decode: {"ids": [...]} -> {"text": ...}.
// A bad line yields {"error": "..."} and processing continues (exit code 1 at the end).
#include <cstdio>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "tokenizer/tokenizer.h"

namespace dil::cli {

int cmd_tokenize(int argc, char** argv) {
  Args args(argc, argv, {"decode", "no-special", "skip-special"});
  auto tok = tok::Tokenizer::load(args.need("tokenizer"));
  const bool decode = args.has("decode");
  const bool parse_special = !args.has("no-special");
  const bool skip_special = args.has("skip-special");
  std::ios::sync_with_stdio(false);
  std::string line;
  int rc = 0;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    nlohmann::json out;
    try {
      auto in = nlohmann::json::parse(line);
      if (decode) {
        out["text"] = tok->decode(in.at("ids").get<std::vector<int32_t>>(), skip_special);
      } else {
        out["ids"] = tok->encode(in.at("text").get_ref<const std::string&>(), parse_special);
      }
    } catch (const std::exception& e) {
      out = {{"error", e.what()}};
      rc = 1;
    }
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  }
  std::cout.flush();
  return rc;
}

}  // namespace dil::cli
