// `fake_serve serve [--model DIR] [--port P] ...`: the real server over FakeEngine, for
// developing the HTTP layer without a model. It declares the options of `deepinfer-lab serve`
// (src/cli/serve_options.h); of the engine's it reads --max-model-len only.
#include <csignal>
#include <cstdio>

#include "cli/app.h"
#include "cli/serve_options.h"
#include "fake_engine.h"
#include "server/server.h"

int main(int argc, char** argv) {
  using namespace dil;
  std::signal(SIGPIPE, SIG_IGN);
  auto top = cli::make_top_app("the OpenAI server over a fake engine");
  cli::ServeOptions o;
  CLI::App* serve = cli::declare_serve(*top, o, "serve the fake engine (the flags of deepinfer-lab serve)");
  return cli::parse_and_run(*top, {{serve, [&o](const cli::ProgramArgs&) {
                                      cli::finish_serve_options(o);
                                      auto tok = tok::Tokenizer::load(o.model + "/tokenizer.json");
                                      server::testing::FakeEngine engine(int(tok->vocab_size()), o.engine.max_model_len);
                                      server::Server s(engine, *tok, tok::prompt_format_from_config(o.model + "/config.json"),
                                                       o.server);
                                      const int port = s.bind();
                                      std::fprintf(stderr, "listening on http://%s:%d\n", o.server.host.c_str(), port);
                                      s.run();
                                      return 0;
                                    }}},
                            cli::ProgramArgs{argc, argv});
}
