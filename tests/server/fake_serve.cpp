// `fake_serve serve [--model DIR] [--port P] ...`: the real server over FakeEngine, for
// developing the HTTP layer without a model (same flags as `deepinfer-lab serve`).
#include <csignal>
#include <cstdio>

#include "cli/args.h"
#include "fake_engine.h"
#include "server/server.h"

int main(int argc, char** argv) {
  using namespace dil;
  std::signal(SIGPIPE, SIG_IGN);
  try {
    cli::Args a(argc - 1, argv + 1, {"thinking"});
    const std::string dir = a.get("model", "models/tiny-v4");
    auto tok = tok::Tokenizer::load(dir + "/tokenizer.json");
    server::testing::FakeEngine engine(int(tok->vocab_size()), int(a.get_int("max-model-len", 4096)));
    server::ServerOptions o;
    o.host = a.get("host", "127.0.0.1");
    o.port = int(a.get_int("port", 8000));
    o.api_key = a.get("api-key");
    o.model_name = a.get("served-model-name", "tiny-v4");
    o.model_dir = dir;
    o.max_concurrent = a.get_int("max-concurrent", 0);
    o.reject_overload = a.get("overload", "reject") == "reject";
    o.defaults.thinking = a.has("thinking");
    server::Server s(engine, *tok, tok::prompt_format_from_config(dir + "/config.json"), o);
    const int port = s.bind();
    std::fprintf(stderr, "listening on http://%s:%d\n", o.host.c_str(), port);
    s.run();
  } catch (const dil::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
