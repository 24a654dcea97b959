// deepinfer-lab kv-report --config FILE [--config2 FILE] [--block-tokens N]
// KV cache bytes for a model config (model/kv_layout.h): per token of context (compressed rows
// + indexer keys, paged), per sequence slot (SWA rings, compressor state, Engram history), and
// per sequence at a few context lengths, in the official packed format and in the f32 layout
// of the CPU reference, and which numerics modes store which (model/kv_layout.h kv_format).
#include <cstdio>
#include <cstdlib>

#include "cli/commands.h"
#include "core/check.h"
#include "model/kv_layout.h"
#include "model/model.h"

namespace dil::cli {
namespace {

struct KvReportOptions {
  std::string config;
  std::string config2;  // a second config, reported after the first
  int block_tokens = CacheSpec{}.block_tokens;
};

// The official V4.1-Flash figure (DeepSeek-V4.1 paper abstract, model-spec §4.9).
constexpr double kV41OfficialBytesPerToken = 890.0;

void report(const std::string& path, int block_tokens) {
  const ModelConfig cfg = load_config(path);
  std::printf("%s  (%s, %d layers + %d MTP/DSpark, block %d tokens)\n", path.c_str(), cfg.model_type.c_str(),
              cfg.n_layers, cfg.n_mtp, block_tokens);
  for (KvFormat f : {KvFormat::Official, KvFormat::F32}) {
    const KvLayout k = kv_layout(cfg, block_tokens, f);
    std::printf("  %-8s KV bytes/token %10.2f   bytes/block %10zu   bytes/slot %10zu"
                " (SWA %zu over %d layers, compressor %zu, history %zu)\n",
                f == KvFormat::Official ? "official" : "f32", k.global_bytes_per_token, k.spec.bytes_per_block,
                k.spec.bytes_per_slot, k.swa_bytes_per_slot, k.swa_layers, k.compressor_bytes_per_slot,
                k.history_bytes_per_slot);
    for (int64_t len : {int64_t(4096), int64_t(131072), int64_t(1) << 20}) {
      const int64_t blocks = (len + block_tokens - 1) / block_tokens;
      const double bytes = double(k.spec.bytes_per_slot) + double(blocks) * double(k.spec.bytes_per_block);
      std::printf("           one sequence at %7lld tokens: %10.3f MiB\n", (long long)len, bytes / (1 << 20));
    }
    std::printf("           stored by numerics:");
    for (Numerics n : {Numerics::Reference, Numerics::Official, Numerics::Fast})
      if (kv_format(n) == f) std::printf(" %s", numerics_name(n));
    std::printf("%s\n", f == KvFormat::Official ? " (on the CPU; CUDA keeps bf16 rows until its kernels read packed ones)" : "");
    if (f == KvFormat::Official && cfg.arch == Arch::V41)
      std::printf("           official V4.1 figure %.0f B/token: %s (ours %.2f)\n", kV41OfficialBytesPerToken,
                  k.global_bytes_per_token == kV41OfficialBytesPerToken ? "equal" : "DIFFERENT",
                  k.global_bytes_per_token);
  }
}

}  // namespace

void add_kv_report(CLI::App& top, std::vector<Declared>* out) {
  auto o = std::make_shared<KvReportOptions>();
  CLI::App* c = top.add_subcommand("kv-report", "KV cache bytes per token / per sequence slot of a model config");
  c->add_option("--config", o->config, "model config.json");
  c->add_option("--config2", o->config2, "a second config.json to report after the first");
  c->add_option("--block-tokens", o->block_tokens, "tokens per paged KV block (a positive multiple of 128)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            const int b = std::atoi(v.c_str());
            return b > 0 && b % 128 == 0 ? "" : "must be a positive multiple of 128";
          },
          ""));
  require(c, {"--config"});
  out->push_back({c, [o](const ProgramArgs&) {
                    report(o->config, o->block_tokens);
                    if (!o->config2.empty()) report(o->config2, o->block_tokens);
                    return 0;
                  }});
}

}  // namespace dil::cli
