// `deepinfer-lab trace`: one model forward on two backends or two numerics modes (A and B),
// compared op by op with teacher forcing (docs/architecture.md "The trace tool").
//
// Two model builds run the same steps: A's on a recording backend (every op's inputs and
// outputs copied to the host), then B's on a replaying backend that, before each op, overwrites
// the op's inputs and the state it reads or updates with A's values (converted to B's dtypes),
// runs it and compares its outputs with A's. B therefore never continues from its own results:
// every figure is one op's own error, and the first op over its tolerance is where B breaks.
// Nothing in the model changes; it runs as it always does, on a backend that interposes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "dil/load_progress.h"

namespace dil::trace {

// One side of a trace: "cpu:official", "cuda:fast", "cpu" (official numerics).
struct Side {
  BackendKind kind = BackendKind::CPU;
  Numerics numerics = Numerics::Official;
};
Side parse_side(const std::string& s);  // throws dil::Error naming the problem
std::string side_name(const Side& s);   // "cpu:official"
// A and B must call the same ops: reference numerics (no quantization points) pairs only
// with itself. Throws dil::Error otherwise.
void check_pair(Numerics a, Numerics b);

struct TraceOptions {
  std::string model;                        // a checkpoint folder, or (dummy) a config.json
  std::string load_format = "safetensors";  // or "dummy": random weights in the official formats
  std::vector<int> layers;                  // backbone layers to build and run (empty: all)
  std::vector<int32_t> ids;                 // the sequence; empty: tokens + decode_steps random ids
  int tokens = 16;                          // the prompt, one prefill step (with ids: ids - decode_steps)
  int decode_steps = 1;                     // one-token steps after the prompt
  int start_pos = 0;                        // > 0: the prompt follows a synthesized context (random cache)
  uint64_t seed = 1;                        // dummy weights, random ids, synthesized context
  LoadProgressFn on_progress;               // load progress of both models (optional)
};

// One output of one op: B's value against A's.
struct Check {
  int index = 0;  // the op's number in the trace (1-based; the outputs of one call share it)
  int step = 0;
  int layer = -1;          // layer id (-1: embedding / head)
  std::string kind;        // the layer's kind ("CSA", "Reuse-r2"; "" outside a layer)
  std::string module;      // the model's scope ("projections", "attention core", ...)
  std::string op, output;  // "linear", "out"
  std::string shape;       // "[16, 4096]"
  std::string dtype;       // "f32", "bf16", "f32->bf16" (A's -> B's)
  bool bf16 = false;       // compared as bf16 (either side bf16)
  std::string impl_a, impl_b;
  Tolerance tol;           // the bound applied (gate "kernel"), exact for "exact"
  // "kernel": within the two implementations' tolerances; "exact": state and indices;
  // "mode": the numerics modes compute differently here (inputs rounded to B's dtypes, or
  // different arithmetic): the mode difference, reported and not gated.
  std::string gate;
  bool indices = false;    // an i32 output (differ = indices that differ)
  double rel_l2 = 0, max_abs = 0, max_ref = 0;
  double ratio = 0;        // the error as a fraction of the bound (worst of L2 and elements); inf: not exact
  int64_t n = 0, differ = 0, bad = 0;
  bool ok = true;          // within the bound ("mode": always)
  bool exact = false;      // bit-identical
};

struct TraceReport {
  Side a, b;
  std::string model;
  std::vector<int> layers;         // as run (sorted)
  std::vector<std::string> steps;  // "prefill 16 tokens at position 0", "decode at position 16"
  std::vector<Check> checks;
  double load_a_s = 0, load_b_s = 0, run_a_s = 0, run_b_s = 0;
  bool mode_pair() const { return a.numerics != b.numerics; }
  int64_t over() const;
  const Check* first_over() const;
};

// A's and B's backends are given (the CLI makes them from Sides; tests wrap one); the numerics
// of each side is the model's. Throws dil::Error for user errors (model, layers, ids).
TraceReport run_trace(const TraceOptions& o, Backend& a, Numerics na, Backend& b, Numerics nb);

}  // namespace dil::trace
