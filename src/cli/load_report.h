// What the CLI prints while a model loads (ModelOptions::on_progress) and once it has: on a
// terminal one live line rewritten in place, in logs (stderr not a terminal) a line at the
// start and then every 5 s or 10 % of the bytes; then one final line with the weights' bytes,
// the KV capacity where there is a pool, and the kernel plan's summary. Everything on stderr.
#pragma once
#include <cstdio>
#include <string>

#include "dil/engine.h"
#include "dil/load_progress.h"

namespace dil::cli {

class LoadPrinter {
 public:
  // live: rewrite one line (a terminal); else periodic lines.
  LoadPrinter(std::FILE* out, bool live);
  // For stderr: live when it is a terminal.
  static LoadPrinter for_stderr();
  void report(const LoadProgress& p);
  // A callback for ModelOptions::on_progress / EngineOptions::on_load_progress (this printer
  // must outlive the load).
  LoadProgressFn callback() {
    return [this](const LoadProgress& p) { report(p); };
  }
  const LoadProgress& last() const { return last_; }

 private:
  std::FILE* out_;
  bool live_;
  LoadProgress last_;
  double printed_at_s_ = -1;      // elapsed time of the last periodic line
  double printed_fraction_ = -1;  // its share of the bytes
};

// "loaded: weights 1.23 GB (456 tensors) in 2.1 s (0.59 GB/s); <kv>; plan: <plan>" from the
// final report (`kv` empty: left out).
std::string loaded_line(const LoadProgress& done, const std::string& kv);
// The engine's pool: "KV cache 65536 tokens (512 blocks of 128), 16 sequences of 4096 tokens
// (state slots 64), 256.0 MiB".
std::string kv_capacity(const EngineInfo& info);

// 1234567 -> "1.23 MB" (decimal units, like GB/s).
std::string human_bytes(double bytes);

}  // namespace dil::cli
