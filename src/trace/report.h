// What `deepinfer-lab trace` prints and writes: the table of every check (or only those over
// their bound), one line per layer of every step, the verdict naming the first op over its
// tolerance, and the whole report as JSON.
#pragma once
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "trace/trace.h"

namespace dil::trace {

// The header: both sides, the steps, how the comparison works for this pair.
void print_header(std::FILE* f, const TraceReport& r);
// One row per check; only_over: the checks over their bound.
void print_table(std::FILE* f, const TraceReport& r, bool only_over);
// Per step and layer: checks, exact, within, mode, over, the worst check (fraction of its bound).
void print_layers(std::FILE* f, const TraceReport& r);
// The totals and "every op within its tolerance" or "first op over its tolerance: ...".
void print_verdict(std::FILE* f, const TraceReport& r);
// "step 0 layer 3 (HCA) attention core: sparse_attention out [16, 64, 512]"
std::string describe(const Check& c);
nlohmann::json to_json(const TraceReport& r);

}  // namespace dil::trace
