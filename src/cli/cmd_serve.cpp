// `deepinfer-lab serve`: the OpenAI-compatible server. With no arguments it serves the bundled
// tiny-v4 model (models/tiny-v4, found next to the binary or the repo root) on the CPU at
// 127.0.0.1:8000.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>

#include "cli/args.h"
#include "cli/commands.h"
#include "dil/engine.h"
#include "server/server.h"

namespace dil::cli {
namespace {

namespace fs = std::filesystem;

// The bundled model: models/tiny-v4 beside the binary, one level up (build/ in the repo),
// or under the current directory.
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

int usage() {
  std::fprintf(stderr,
               "usage: deepinfer-lab serve [--model DIR] [--host H] [--port P] [--api-key KEY]\n"
               "  [--served-model-name NAME] [--device cpu|cuda] [--max-model-len N] [--max-num-seqs N]\n"
               "  [--threads N] [--max-body-bytes N] [--max-concurrent N] [--overload reject|queue]\n"
               "  [--thinking] (thinking mode by default) [--health-stall-s S]\n");
  return 2;
}

}  // namespace

int cmd_serve(int argc, char** argv) {
  Args a(argc, argv, {"thinking", "help"});
  if (a.has("help")) return usage();
  // A client that disconnects mid-write must not kill the process (cpp-httplib sends
  // without MSG_NOSIGNAL).
  std::signal(SIGPIPE, SIG_IGN);
  const std::string dir = a.has("model") ? a.get("model") : default_model_dir();

  EngineOptions eo;
  eo.model_dir = dir;
  eo.device = a.get("device", "cpu");
  eo.max_model_len = int(a.get_int("max-model-len", eo.max_model_len));
  eo.max_num_seqs = int(a.get_int("max-num-seqs", 256));
  eo.max_num_batched_tokens = int(a.get_int("max-num-batched-tokens", eo.max_num_batched_tokens));
  eo.kv_memory_bytes = a.get_int("kv-memory-mb", eo.kv_memory_bytes >> 20) << 20;

  server::ServerOptions so;
  so.host = a.get("host", "127.0.0.1");
  so.port = int(a.get_int("port", 8000));
  so.api_key = a.get("api-key");
  so.model_name = a.get("served-model-name", fs::path(dir).filename().string());
  so.model_dir = dir;
  so.threads = int(a.get_int("threads", so.threads));
  so.max_body_bytes = size_t(a.get_int("max-body-bytes", long(so.max_body_bytes)));
  so.max_concurrent = a.get_int("max-concurrent", 0);
  const std::string overload = a.get("overload", "reject");
  if (overload != "reject" && overload != "queue") DIL_FAIL("--overload must be reject or queue");
  so.reject_overload = overload == "reject";
  so.defaults.thinking = a.has("thinking");
  so.health_stall_s = double(a.get_int("health-stall-s", 60));

  auto tok = tok::Tokenizer::load(dir + "/tokenizer.json");
  const auto format = tok::prompt_format_from_config(dir + "/config.json");
  std::fprintf(stderr, "loading %s on %s ...\n", dir.c_str(), eo.device.c_str());
  auto engine = make_engine(eo);
  server::Server srv(*engine, *tok, format, so);
  const int port = srv.bind();
  std::fprintf(stderr, "serving '%s' on http://%s:%d (OpenAI API under /v1)\n", so.model_name.c_str(),
               so.host.c_str(), port);
  srv.run();
  engine->shutdown();
  return 0;
}

}  // namespace dil::cli
