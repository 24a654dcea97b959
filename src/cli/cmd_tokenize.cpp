// `deepinfer-lab tokenize --tokenizer PATH [--decode] [--no-special]`: JSON lines in, JSON lines
// out. Encode: {"text": ...} -> {"ids": [...]}; decode: {"ids": [...]} -> {"text": ...}.
// A bad line yields {"error": "..."} and processing continues (exit code 1 at the end).
// --bench FILE: encode every {"text"} line of FILE single-threaded and print
// {"bytes", "tokens", "seconds"} (loading excluded) for bench/tokenizer_bench.py.
#include <chrono>
#include <ctime>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/check.h"
#include "tokenizer/tokenizer.h"

namespace dil::cli {
namespace {

struct TokenizeOptions {
  std::string tokenizer;       // tokenizer.json
  bool decode = false;         // ids -> text
  bool no_special = false;     // encode special-token text as plain text
  bool skip_special = false;   // decode without special tokens
  std::string bench;           // FILE: time the encoding of its lines instead
};

int run_tokenize(const TokenizeOptions& o) {
  auto tok = tok::Tokenizer::load(o.tokenizer);
  const bool decode = o.decode;
  const bool parse_special = !o.no_special;
  const bool skip_special = o.skip_special;
  if (!o.bench.empty()) {
    std::ifstream f(o.bench);
    if (!f) DIL_FAIL("cannot open ", o.bench);
    std::vector<std::string> docs;
    for (std::string l; std::getline(f, l);)
      if (!l.empty()) docs.push_back(nlohmann::json::parse(l).at("text").get<std::string>());
    size_t bytes = 0, tokens = 0;
    // CPU time of this thread as well as wall time: the machine may be shared.
    timespec c0, c1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    auto t0 = std::chrono::steady_clock::now();
    for (const auto& d : docs) {
      tokens += tok->encode(d, parse_special).size();
      bytes += d.size();
    }
    double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    double cpu = (c1.tv_sec - c0.tv_sec) + 1e-9 * (c1.tv_nsec - c0.tv_nsec);
    std::cout << nlohmann::json{{"bytes", bytes}, {"tokens", tokens}, {"seconds", sec}, {"cpu_seconds", cpu}}.dump()
              << std::endl;
    return 0;
  }
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

}  // namespace

void add_tokenize(CLI::App& top, std::vector<Declared>* out) {
  auto o = std::make_shared<TokenizeOptions>();
  CLI::App* c = top.add_subcommand("tokenize", "encode/decode JSON lines with a tokenizer.json");
  c->add_option("--tokenizer", o->tokenizer, "tokenizer.json");
  add_switch(c, "--decode", o->decode, "decode {\"ids\"} lines instead of encoding {\"text\"} lines");
  add_switch(c, "--no-special", o->no_special, "encode special-token text as plain text");
  add_switch(c, "--skip-special", o->skip_special, "decode without the special tokens");
  c->add_option("--bench", o->bench, "time the encoding of every {\"text\"} line of FILE instead (one thread)");
  require(c, {"--tokenizer"});
  out->push_back({c, [o](const ProgramArgs&) { return run_tokenize(*o); }});
}

}  // namespace dil::cli
