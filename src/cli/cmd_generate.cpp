// deepinfer-lab generate --model DIR (--prompt-ids LIST|FILE[;LIST...] | --prompt TEXT [--chat [--thinking]])
//                        [--max-tokens N] [--print-ids] [--numerics reference|official] [--device cpu|cuda]
//                        [--nproc N [--nnodes M --node-rank K --master-addr H --master-port P]]
// Greedy generation straight on the model (no engine). The prompt is token ids, or TEXT
// tokenized with the model folder's tokenizer.json (BOS first, like /v1/completions), or with
// --chat TEXT as one user message rendered by the model's prompt encoder (like
// /v1/chat/completions; --thinking: thinking mode, whose default is serve's).
// One JSON line per prompt: {"ids": [...], "text": "..."}; "text" (special tokens skipped) when
// the folder has a tokenizer, "ids" always for --prompt-ids and with --print-ids for text
// prompts. Several prompts (';'-separated) or several ranks (expert-parallel MoE, each rank
// running prompts i with i % ranks == rank, data parallel) add "prompt": i, "rank": r, printed
// by the rank that ran it.
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/check.h"
#include "cli/dist_run.h"
#include "cli/shared_options.h"
#include "server/protocol.h"
#include "tokenizer/tokenizer.h"

namespace dil::cli {
namespace {

struct GenerateOptions {
  std::string model;
  std::string prompt_ids;  // LIST|FILE[;LIST...]
  std::string prompt;      // TEXT
  bool chat = false;       // render --prompt as one user message
  bool thinking = server::ServerDefaults{}.thinking;  // serve's default
  int max_tokens = 16;
  bool print_ids = false;
  Numerics numerics = ModelOptions{}.numerics;
  std::string device = "cpu";
  LaunchRequest launch;
};

// The prompt ids of --prompt TEXT (and --chat).
std::vector<int32_t> text_prompt(const GenerateOptions& o, const tok::Tokenizer& tok, int32_t bos) {
  if (!o.chat) {
    std::vector<int32_t> ids = tok.encode(o.prompt);
    if (bos >= 0 && (ids.empty() || ids[0] != bos)) ids.insert(ids.begin(), bos);
    return ids;
  }
  tok::ChatOptions co;
  co.thinking_mode = o.thinking ? "thinking" : "chat";
  const tok::Json messages = tok::Json::array({{{"role", "user"}, {"content", o.prompt}}});
  const auto format = tok::prompt_format_from_config(o.model + "/config.json");
  return tok.encode(tok::render_chat(format, messages, co));
}

int run_generate(const GenerateOptions& o, const ProgramArgs& prog) {
  const std::string tok_path = o.model + "/tokenizer.json";
  const bool text = !o.prompt.empty();
  if (text && !std::filesystem::exists(tok_path))
    DIL_FAIL("--prompt needs the model folder's tokenizer.json (", tok_path, " does not exist); use --prompt-ids");
  std::vector<std::vector<int32_t>> prompts;
  if (!text) prompts = parse_id_lists(o.prompt_ids);
  int launcher_status = 0;
  auto run = start_dist(o.launch, o.device, prog, &launcher_status);
  if (!run) return launcher_status;
  auto model = load_dist_model(o.model, o.numerics, *run);
  const auto& cfg = model->config();
  std::unique_ptr<tok::Tokenizer> tok;
  if (std::filesystem::exists(tok_path)) tok = tok::Tokenizer::load(tok_path);
  if (text) prompts = {text_prompt(o, *tok, cfg.bos_id)};
  check_token_ids(prompts, cfg.vocab_size);
  const bool plain = prompts.size() == 1 && run->size() == 1;
  const bool print_ids = o.print_ids || !text;

  // This rank's prompts, one after another; every step is taken in lockstep with the others.
  std::vector<size_t> mine;
  for (size_t i = size_t(run->rank()); i < prompts.size(); i += size_t(run->size())) mine.push_back(i);
  size_t cur = 0;
  std::unique_ptr<SingleSequence> seq;
  std::vector<int32_t> out;
  std::vector<float> lg;
  for (;;) {
    std::vector<int32_t> feed;
    if (cur < mine.size()) {
      if (!seq) {
        seq = std::make_unique<SingleSequence>(*model, int(prompts[mine[cur]].size() + size_t(o.max_tokens)));
        feed = prompts[mine[cur]];
      } else {
        feed = {out.back()};
      }
    }
    if (!lockstep(*model, run->comm.get(), seq.get(), feed, false, &lg)) break;
    if (feed.empty()) continue;
    int32_t best = 0;
    for (int64_t v = 1; v < cfg.vocab_size; ++v)
      if (lg[size_t(v)] > lg[size_t(best)]) best = int32_t(v);  // ties -> lowest id
    out.push_back(best);
    if (best != cfg.eos_id && long(out.size()) < o.max_tokens) continue;
    nlohmann::ordered_json line;
    if (!plain) {
      line["prompt"] = mine[cur];
      line["rank"] = run->rank();
    }
    if (print_ids) line["ids"] = out;
    if (tok) line["text"] = tok->decode(out, /*skip_special=*/true);
    std::printf("%s\n", line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    std::fflush(stdout);
    out.clear();
    seq.reset();
    ++cur;
  }
  return 0;
}

}  // namespace

void add_generate(CLI::App& top, std::vector<Declared>* out) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* c = top.add_subcommand("generate", "greedy generation from token ids or text");
  c->add_option("--model", o->model, "checkpoint folder (with tokenizer.json for text prompts)");
  auto* ids = c->add_option("--prompt-ids", o->prompt_ids, "prompt token ids: LIST or FILE, ';' between prompts")
                  ->check(parsed_by([](const std::string& s) { parse_id_lists(s); }));
  auto* prompt = c->add_option("--prompt", o->prompt, "prompt text, tokenized with the model's tokenizer.json (BOS first)")
                     ->check(CLI::Validator([](std::string& s) { return s.empty() ? std::string("empty prompt") : ""; }, ""));
  prompt->excludes(ids);
  auto* chat = add_switch(c, "--chat", o->chat, "--prompt is one user message, rendered by the model's prompt encoder");
  chat->needs(prompt);
  add_switch(c, "--thinking", o->thinking, "--chat in thinking mode (serve's default)")->needs(chat);
  c->add_option("--max-tokens", o->max_tokens, "tokens to generate (fewer when EOS comes)")->check(CLI::PositiveNumber);
  add_switch(c, "--print-ids", o->print_ids, "print the generated ids of a text prompt too (--prompt-ids always does)");
  add_numerics_option(c, o->numerics);
  add_device_option(c, o->device);
  add_launch_options(c, o->launch, true);
  require(c, {"--model"});
  require(c, {"--prompt-ids", "--prompt"});
  out->push_back({c, [o](const ProgramArgs& prog) { return run_generate(*o, prog); }});
}

}  // namespace dil::cli
