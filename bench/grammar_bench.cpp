// grammar_bench: token mask computation per decoding step at a real vocabulary.
//
//   build/bench/grammar_bench [--tokenizer tests/data/deepseek-v3-tokenizer/tokenizer.json]
//                             [--rounds 5] [--json OUT]
//
// For each schema: compile it, then replay sample documents as a model would write them (the
// tokenizer's encoding of each document), timing Matcher::fill_mask before every token and
// checking that the token is in the mask. Round 1 starts with an empty mask cache (cold: each
// new automaton node walks the vocabulary trie once); later rounds replay with the cache warm,
// which is the steady state of a server that sees a schema again. "tight" times the same steps
// with a budget that forces the exact distance check (the last tokens before max_tokens).
// Warm steps are timed by the wall clock; compile, cold and tight (milliseconds, where a busy
// machine's preemptions would dominate) by the thread's CPU clock.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "server/grammar_vocab.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace dil;
using Clock = std::chrono::steady_clock;
using grammar::Json;

struct Case {
  const char* name;
  const char* schema;  // "json_object": any JSON object
  std::vector<std::string> docs;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> k = {
      {"person",
       R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0,"maximum":150},
           "email":{"type":"string","format":"email"},"address":{"$ref":"#/$defs/address"},
           "tags":{"type":"array","items":{"type":"string"},"maxItems":5},
           "status":{"enum":["active","inactive","banned"]}},
           "required":["name","age","address","status"],"additionalProperties":false,
           "$defs":{"address":{"type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"},
           "zip":{"type":"string","pattern":"^[0-9]{5}$"}},"required":["street","city","zip"],"additionalProperties":false}}})",
       {R"({"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "address": {"street": "12 St James's Square", "city": "London", "zip": "10001"}, "tags": ["mathematics", "poetry", "engines"], "status": "active"})",
        R"({"name": "Grace Hopper", "age": 85, "address": {"street": "1 Navy Way", "city": "Arlington", "zip": "22202"}, "tags": [], "status": "inactive"})",
        R"({"name": "Zoë Müller-Łukasiewicz", "age": 7, "email": "zoe.m@uni-wien.ac.at", "address": {"street": "Universitätsring 1", "city": "Wien", "zip": "01010"}, "status": "banned"})"}},
      {"catalog",
       R"({"type":"object","properties":{"items":{"type":"array","minItems":1,"items":{"type":"object",
           "properties":{"id":{"type":"integer","minimum":1},"title":{"type":"string","maxLength":80},
           "price":{"type":"number","minimum":0},"in_stock":{"type":"boolean"},
           "category":{"enum":["books","music","tools"]}},"required":["id","title","price","in_stock","category"],
           "additionalProperties":false}}},"required":["items"],"additionalProperties":false})",
       {R"({"items": [{"id": 1, "title": "The Art of Computer Programming", "price": 199.99, "in_stock": true, "category": "books"}, {"id": 42, "title": "Kind of Blue", "price": 12.5, "in_stock": false, "category": "music"}]})",
        R"({"items": [{"id": 7, "title": "Hammer", "price": 0, "in_stock": true, "category": "tools"}, {"id": 8, "title": "Saw, 24 inch", "price": 31.25, "in_stock": true, "category": "tools"}, {"id": 9, "title": "Abbey Road", "price": 9.99, "in_stock": false, "category": "music"}]})"}},
      {"tree",
       R"({"$defs":{"node":{"type":"object","properties":{"label":{"type":"string"},"children":{"type":"array",
           "items":{"$ref":"#/$defs/node"}}},"required":["label","children"],"additionalProperties":false}},"$ref":"#/$defs/node"})",
       {R"({"label": "root", "children": [{"label": "left", "children": [{"label": "leaf 1", "children": []}]}, {"label": "right", "children": []}]})",
        R"({"label": "a", "children": [{"label": "b", "children": [{"label": "c", "children": [{"label": "d", "children": []}]}]}]})"}},
      {"event_anyof",
       R"({"anyOf":[{"type":"object","properties":{"kind":{"const":"click"},"x":{"type":"integer"},"y":{"type":"integer"}},
           "required":["kind","x","y"],"additionalProperties":false},
           {"type":"object","properties":{"kind":{"const":"key"},"key":{"type":"string","maxLength":16},
           "modifiers":{"type":"array","items":{"enum":["shift","ctrl","alt"]}}},"required":["kind","key"],"additionalProperties":false},
           {"type":"null"}]})",
       {R"({"kind": "click", "x": 1024, "y": -3})", R"({"kind": "key", "key": "Enter", "modifiers": ["ctrl", "shift"]})", "null"}},
      {"json_object", "json_object",
       {R"({"query": "weather in Paris", "units": "metric", "days": [1, 2, 3], "options": {"hourly": false, "alerts": null}})",
        R"({"id": "a3f9", "score": 0.875, "labels": ["x", "y"], "nested": {"deep": {"deeper": [true, false, {"k": "v"}]}}})"}},
  };
  return k;
}

double cpu_us() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) * 1e6 + double(t.tv_nsec) / 1e3;
}

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5));
  return v[i];
}

}  // namespace

int main(int argc, char** argv) {
  std::string tok_path = "tests/data/deepseek-v3-tokenizer/tokenizer.json", json_out;
  int rounds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokenizer")) tok_path = argv[i + 1];
    else if (!std::strcmp(argv[i], "--rounds")) rounds = std::max(2, std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--json")) json_out = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: grammar_bench [--tokenizer FILE] [--rounds N] [--json OUT]\n");
      return 2;
    }
  }
  try {
    auto tok = tok::Tokenizer::load(tok_path);
    auto t0 = Clock::now();
    auto vocab = server::grammar_vocabulary(*tok, tok->vocab_size(), true);
    const double vocab_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    std::printf("vocabulary: %d ids (%d usable), %d trie nodes, built in %.1f ms\n\n", vocab->size(), vocab->n_usable(),
                vocab->n_nodes(), vocab_ms);
    std::printf("%-12s %6s %8s %6s | %9s %9s %9s | %9s %9s %9s | %9s %9s\n", "schema", "nodes", "compile", "steps",
                "cold p50", "cold p99", "cold max", "warm p50", "warm p99", "warm max", "tight p50", "tight p99");
    std::printf("%-12s %6s %8s %6s | %29s | %29s | %19s\n", "", "", "(cpu)", "", "(cpu)", "(wall)", "(cpu)");
    std::vector<double> all_warm, all_cold, all_tight;
    nlohmann::json report = nlohmann::json::array();
    std::vector<uint64_t> mask(size_t(vocab->words()));
    for (const Case& c : cases()) {
      const double c0 = cpu_us();
      grammar::Builder b;
      const int32_t root = b.add_rule("root");
      const Json schema = std::string(c.schema) == "json_object" ? Json(true) : Json::parse(c.schema);
      grammar::JsonSchemaCompiler jc(b, schema, {});
      b.define(root, std::string(c.schema) == "json_object" ? jc.any_object() : jc.root_value());
      auto g = std::make_shared<grammar::CompiledGrammar>(grammar::compile(b, root, {}), vocab);
      const double compile_ms = (cpu_us() - c0) / 1e3;
      std::vector<double> cold, warm, tight;
      int steps = 0;
      for (int r = 0; r < rounds; ++r) {
        for (const std::string& doc : c.docs) {
          const std::vector<int32_t> ids = tok->encode(doc, /*parse_special=*/false);
          grammar::Matcher m(g);
          std::vector<uint64_t> m2(mask.size());
          for (size_t k = 0; k < ids.size(); ++k) {
            if (r == 0) {
              const double a = cpu_us();
              m.fill_mask(mask, -1);
              cold.push_back(cpu_us() - a);
            } else {
              const auto a = Clock::now();
              m.fill_mask(mask, -1);
              warm.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
            }
            if (r == 1) {
              // Budget exactly the distance left: the exact check runs on this step.
              const double a = cpu_us();
              m.fill_mask(m2, std::max<int64_t>(0, m.distance() - 1));
              tight.push_back(cpu_us() - a);
            }
            if (!grammar::test_bit(mask, ids[k]) || !m.advance(ids[k])) {
              std::fprintf(stderr, "%s: token %zu (%d '%s') of a sample document is not allowed\n", c.name, k, ids[k],
                           tok->token_bytes(ids[k]).c_str());
              return 1;
            }
          }
          if (!m.accepting()) {
            std::fprintf(stderr, "%s: a sample document is not complete\n", c.name);
            return 1;
          }
          if (r == 0) steps += int(ids.size());
        }
      }
      std::printf("%-12s %6d %6.1fms %6d | %7.1fus %7.1fus %7.1fus | %7.1fus %7.1fus %7.1fus | %7.1fus %7.1fus\n", c.name,
                  g->automaton().n_nodes(), compile_ms, steps, pct(cold, .5), pct(cold, .99), pct(cold, 1), pct(warm, .5),
                  pct(warm, .99), pct(warm, 1), pct(tight, .5), pct(tight, .99));
      all_warm.insert(all_warm.end(), warm.begin(), warm.end());
      all_cold.insert(all_cold.end(), cold.begin(), cold.end());
      all_tight.insert(all_tight.end(), tight.begin(), tight.end());
      report.push_back({{"schema", c.name}, {"nodes", g->automaton().n_nodes()}, {"compile_ms", compile_ms},
                        {"steps", steps}, {"cold_p50_us", pct(cold, .5)}, {"cold_p99_us", pct(cold, .99)},
                        {"warm_p50_us", pct(warm, .5)}, {"warm_p99_us", pct(warm, .99)},
                        {"tight_p50_us", pct(tight, .5)}, {"tight_p99_us", pct(tight, .99)}});
    }
    std::printf("\nall schemas, per token: warm median %.1f us, p99 %.1f us; cold median %.1f us, p99 %.1f us; "
                "tight median %.1f us, p99 %.1f us\n",
                pct(all_warm, .5), pct(all_warm, .99), pct(all_cold, .5), pct(all_cold, .99), pct(all_tight, .5),
                pct(all_tight, .99));
    if (!json_out.empty()) {
      std::ofstream(json_out) << nlohmann::json{{"vocab", vocab->size()}, {"cases", report},
                                                {"warm_p50_us", pct(all_warm, .5)}, {"warm_p99_us", pct(all_warm, .99)},
                                                {"cold_p50_us", pct(all_cold, .5)}, {"cold_p99_us", pct(all_cold, .99)}}
                                     .dump(2)
                              << "\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
