#include "cli/serve_options.h"

#include <filesystem>

#include "cli/app.h"
#include "cli/ids.h"
#include "cli/shared_options.h"
#include "core/check.h"

namespace dil::cli {

namespace fs = std::filesystem;

std::string default_model_dir() {
  std::vector<fs::path> roots;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) roots = {exe.parent_path(), exe.parent_path().parent_path()};
  roots.push_back(fs::current_path());
  for (const auto& r : roots)
    if (fs::exists(r / "models" / "tiny-v4" / "config.json")) return (r / "models" / "tiny-v4").string();
  DIL_FAIL("no --model given and the bundled models/tiny-v4 was not found next to the binary or in the current directory");
}

CLI::App* declare_serve(CLI::App& top, ServeOptions& o, const std::string& description) {
  CLI::App* c = top.add_subcommand("serve", description);
  EngineOptions& e = o.engine;
  server::ServerOptions& s = o.server;
  c->add_option("--model", o.model, "model folder (config.json, safetensors, tokenizer.json)")
      ->default_str("the bundled models/tiny-v4");
  c->add_option("--host", s.host, "address to listen on");
  c->add_option("--port", s.port, "port to listen on (0: any free port)")->check(CLI::Range(0, 65535).description("0-65535"));
  c->add_option("--api-key", s.api_key, "require 'Authorization: Bearer KEY' on /v1/* and /tokenize")
      ->default_str("none, no authentication");
  c->add_option("--served-model-name", s.model_name, "the model id clients send and /v1/models lists")
      ->default_str("the model folder's name");
  add_device_option(c, e.device);
  add_numerics_option(c, e.numerics, e.device);
  c->add_option("--max-model-len", e.max_model_len, "longest prompt + completion (tokens)")->check(CLI::PositiveNumber);
  c->add_option("--max-num-seqs", e.max_num_seqs, "sequences running at once (each holds a state slot)")
      ->check(CLI::PositiveNumber);
  c->add_option("--max-num-batched-tokens", e.max_num_batched_tokens, "tokens per engine step (prefill chunks + decodes)")
      ->check(CLI::PositiveNumber);
  c->add_option_function<int64_t>(
       "--kv-memory-mb", [&e](const int64_t& mb) { e.kv_memory_bytes = mb << 20; },
       "KV cache memory in MiB: state slots (max-num-seqs) and paged blocks; overrides --gpu-memory-utilization")
      ->default_str("auto, from --gpu-memory-utilization")
      ->check(CLI::PositiveNumber);
  c->add_option("--gpu-memory-utilization", e.gpu_memory_utilization,
                "fraction of the device's memory this server may use; after the weights and a profiling step at "
                "--max-num-batched-tokens the rest becomes KV blocks and state slots (cpu: of MemAvailable, at most "
                "what --max-num-seqs sequences of --max-model-len use)")
      ->check(CLI::Range(0.0, 1.0).description("(0, 1]"))
      ->check(CLI::PositiveNumber);
  c->add_option("--block-tokens", e.block_tokens, "tokens per paged KV block (a multiple of 128)")
      ->check(CLI::PositiveNumber);
  c->add_flag_callback("--no-prefix-cache", [&e] { e.enable_prefix_cache = false; },
                       "do not reuse the KV blocks and state of cached prompt prefixes")
      ->default_str(e.enable_prefix_cache ? "off" : "on");
  c->add_option("--prefix-cache-slots", e.prefix_cache_slots,
                "state slots beyond max-num-seqs for prefix-cache snapshots (idle slots hold them too)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--speculative", e.speculative,
                "speculative decoding: off, ngram (prompt lookup), mtp (V4's MTP layer mtp.0), dspark (V4.1's DSpark "
                "drafter mtp.0..2, at most dspark_block_size = 5 tokens)")
      ->check(CLI::IsMember({"off", "ngram", "mtp", "dspark"}));
  c->add_option("--dspark-min-survival", e.dspark_min_survival,
                "dspark: cut a draft where the product of the confidence head's sigmoids falls below this "
                "(uncalibrated; 0: never)")
      ->check(CLI::Range(0.0, 1.0));
  c->add_option("--num-speculative-tokens", e.num_speculative_tokens,
                "most draft tokens per sequence and step (they count in --max-num-batched-tokens)")
      ->check(CLI::PositiveNumber);
  c->add_option("--seed", e.seed, "seed of requests that bring none (0: a random one at start)");
  c->add_option("--max-logprobs", e.max_logprobs, "largest logprobs / top_logprobs a request may ask for")
      ->check(CLI::NonNegativeNumber);
  c->add_option_function<std::string>(
       "--logprobs-mode",
       [&e](const std::string& m) { e.logprobs_mode = m == "raw_logprobs" ? LogprobsMode::Raw : LogprobsMode::Processed; },
       "logprobs of the model's logits (raw) or of the distribution drawn from (processed)")
      ->default_str(e.logprobs_mode == LogprobsMode::Raw ? "raw_logprobs" : "processed_logprobs")
      ->check(CLI::IsMember({"raw_logprobs", "processed_logprobs"}));
  c->add_option("--threads", s.threads, "connection threads (>= concurrent streams + idle keep-alives)")
      ->check(CLI::PositiveNumber);
  c->add_option("--max-body-bytes", s.max_body_bytes, "largest request body (larger: 413)")->check(CLI::PositiveNumber);
  c->add_option("--max-concurrent", s.max_concurrent, "generations held at once (0: no limit)")
      ->check(CLI::NonNegativeNumber);
  c->add_option_function<std::string>(
       "--overload", [&s](const std::string& v) { s.reject_overload = v == "reject"; },
       "over --max-concurrent: reject with 429, or queue in the engine")
      ->default_str(s.reject_overload ? "reject" : "queue")
      ->check(CLI::IsMember({"reject", "queue"}));
  add_switch(c, "--thinking", s.defaults.thinking, "thinking mode for chat requests that do not choose");
  c->add_option("--health-stall-s", s.health_stall_s, "/health says 503 when queued work sees no step this long")
      ->check(CLI::PositiveNumber);
  c->add_option("--shutdown-timeout", s.shutdown_timeout_s,
                "on SIGTERM/SIGINT, seconds running requests get to finish before they are aborted")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--keep-alive-timeout", s.keep_alive_timeout_s,
                "idle keep-alive connections close after this long (announced in Keep-Alive: timeout=)")
      ->check(CLI::Range(1.0, 86400.0));
  c->add_option("--request-timeout", s.request_timeout_s, "a request must arrive completely within this long")
      ->check(CLI::Range(1.0, 86400.0));
  add_switch(c, "--access-log", s.access_log, "one line per response on stderr");
  c->add_option("--load-format", e.load_format,
                "weights: safetensors (the model folder's checkpoint) or dummy (random weights in the official formats "
                "from its config.json: timing at real dimensions; the outputs are not the model's)")
      ->check(CLI::IsMember({"safetensors", "dummy"}));
  c->add_option("--layers", o.layers,
                "backbone layers to build and run, LIST or all (a subset times a model that does not fit, as bench "
                "does; the outputs are not the model's)")
      ->default_str("all");
  c->add_option("--dp", o.dp, "data-parallel ranks, one process per GPU (rank i on GPU i of its machine)")
      ->check(CLI::PositiveNumber);
  c->add_option("--ep", o.ep, "expert-parallel ranks (must equal --dp)")->default_str("= --dp")->check(CLI::PositiveNumber);
  add_launch_options(c, o.launch, false);
  return c;
}

void finish_serve_options(ServeOptions& o) {
  if (o.model.empty()) o.model = default_model_dir();
  if (o.server.model_name.empty()) {
    fs::path p(o.model);
    if (p.filename().empty()) p = p.parent_path();  // "DIR/"
    o.server.model_name = p.filename().string();
  }
  o.server.model_dir = o.model;
  o.engine.model_dir = o.model;
  if (!o.layers.empty() && o.layers != "all") {
    try {
      o.engine.layers = parse_int_list(o.layers);
    } catch (const Error& e) {
      DIL_FAIL("--layers '", o.layers, "': ", e.what());
    }
  }
  if (o.ep == 0) o.ep = o.dp;
  if (o.ep != o.dp)
    DIL_FAIL("--ep ", o.ep, " with --dp ", o.dp, ": only ep == dp is supported (attention data-parallel and MoE "
             "expert-parallel over the same ranks, DeepSeek's DEP)");
  if (o.dp % o.launch.nnodes != 0) DIL_FAIL("--dp ", o.dp, " does not split evenly over --nnodes ", o.launch.nnodes);
  o.launch.nproc = o.dp / o.launch.nnodes;
}

}  // namespace dil::cli
