#include "cli/load_report.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace dil::cli {
namespace {

constexpr double kLogEveryS = 5.0;
constexpr double kLogEveryFraction = 0.10;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string rate(const LoadProgress& p) {
  return p.elapsed_s > 0 ? fmt("%.2f GB/s", double(p.bytes_done) / p.elapsed_s / 1e9) : "- GB/s";
}

std::string progress_line(const LoadProgress& p) {
  const double frac = p.bytes_total > 0 ? double(p.bytes_done) / double(p.bytes_total) : 1.0;
  std::string eta = "?";
  if (p.bytes_done > 0 && p.elapsed_s > 0) {
    const double left = double(p.bytes_total - p.bytes_done) / (double(p.bytes_done) / p.elapsed_s);
    eta = fmt("%.0f s", std::ceil(left));
  }
  return str_cat("loading: ", p.tensors_done, "/", p.tensors_total, " tensors, ", human_bytes(double(p.bytes_done)),
                 " / ", human_bytes(double(p.bytes_total)), " (", fmt("%.0f", 100 * frac), "%), ", rate(p), ", ETA ",
                 eta);
}

}  // namespace

std::string human_bytes(double b) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000 && u < 4) {
    b /= 1000;
    ++u;
  }
  return u == 0 ? fmt("%.0f B", b) : fmt("%.2f ", b) + units[u];
}

LoadPrinter::LoadPrinter(std::FILE* out, bool live) : out_(out), live_(live) {}

LoadPrinter LoadPrinter::for_stderr() { return LoadPrinter(stderr, ::isatty(STDERR_FILENO) == 1); }

void LoadPrinter::report(const LoadProgress& p) {
  last_ = p;
  if (live_) {
    // The final line replaces the live one.
    if (p.done) std::fprintf(out_, "\r\033[K");
    else std::fprintf(out_, "\r%s\033[K", progress_line(p).c_str());
    std::fflush(out_);
    return;
  }
  if (p.done) return;
  const double frac = p.bytes_total > 0 ? double(p.bytes_done) / double(p.bytes_total) : 0.0;
  if (printed_at_s_ >= 0 && p.elapsed_s - printed_at_s_ < kLogEveryS && frac - printed_fraction_ < kLogEveryFraction)
    return;
  printed_at_s_ = p.elapsed_s;
  printed_fraction_ = frac;
  if (p.tensors_done == 0)
    std::fprintf(out_, "loading: %lld tensors, %s\n", (long long)p.tensors_total, human_bytes(double(p.bytes_total)).c_str());
  else
    std::fprintf(out_, "%s\n", progress_line(p).c_str());
  std::fflush(out_);
}

std::string loaded_line(const LoadProgress& p, const std::string& kv) {
  std::string s = str_cat("loaded: weights ", human_bytes(double(p.bytes_done)), " (", p.tensors_done, " tensors) in ",
                          fmt("%.1f s", p.elapsed_s), " (", rate(p), ")");
  if (!kv.empty()) s += "; " + kv;
  return s + "; plan: " + (p.plan.empty() ? std::string("?") : p.plan);
}

std::string kv_capacity(const EngineInfo& i) {
  const int64_t per_seq = (int64_t(i.max_model_len) + i.block_tokens - 1) / std::max(1, i.block_tokens);
  const int64_t seqs = std::min<int64_t>(i.kv_slots, per_seq > 0 ? i.kv_blocks / per_seq : 0);
  const double bytes = double(i.kv_blocks) * double(i.kv_bytes_per_block) +
                       double(i.kv_slots + i.prefix_cache_slots) * double(i.kv_bytes_per_slot);
  return str_cat("KV cache ", i.kv_blocks * i.block_tokens, " tokens (", i.kv_blocks, " blocks of ", i.block_tokens,
                 "), ", seqs, " sequences of ", i.max_model_len, " tokens (", i.kv_slots, " state slots), ",
                 fmt("%.1f MiB", bytes / double(1 << 20)), i.kv_sizing.empty() ? "" : " [" + i.kv_sizing + "]",
                 "; prefix cache: ",
                 i.prefix_cache ? str_cat(i.prefix_cache_slots, " more slots for snapshots") : std::string("off"));
}

}  // namespace dil::cli
