#include "server/generation.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>

#include "core/check.h"

namespace dil::server {

std::string random_hex(int n) {
  // Per-call generator: ids only need to be unique, not secret; no shared mutable state.
  std::random_device rd;
  std::mt19937_64 g((uint64_t(rd()) << 32) ^ rd());
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s(size_t(n), '0');
  for (auto& ch : s) ch = kHex[g() & 15];
  return s;
}

ChoiceDecoder::ChoiceDecoder(const tok::Tokenizer& t, tok::PromptFormat f, const ChoiceConfig& c)
    : tok_(t), cfg_(c), detok_(t, /*skip_special=*/false), stops_(c.stop_strings) {
  if (c.chat) {
    parser_.emplace(f, c.thinking);
    for (const char* s : {"<think>", "</think>", "<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>", "｜DSML｜"}) {
      int32_t id = t.token_to_id(s);
      if (id >= 0) keep_special_.insert(id);
    }
  }
}

void ChoiceDecoder::emit(std::string text, bool final, ChoiceDelta* d) {
  if (!parser_) {
    d->content += text;
    return;
  }
  auto take = [&](tok::ParserDelta pd) {
    d->content += pd.content;
    d->reasoning += pd.reasoning;
    for (auto& tc : pd.new_tool_calls) {
      if (!cfg_.parse_tools) continue;  // tools not offered: drop calls, never leak markup
      if (tc.id.empty()) tc.id = "call_" + random_hex(24);
      if (d->tool_calls.empty()) d->first_tool_index = tool_calls_;
      d->tool_calls.push_back(std::move(tc));
      ++tool_calls_;
    }
  };
  if (!text.empty()) take(parser_->push(text));
  if (final) take(parser_->finish());
}

ChoiceDelta ChoiceDecoder::push(const GenOutput& out, bool* stop_hit) {
  ChoiceDelta d;
  *stop_hit = false;
  if (finished_) return d;
  std::string text;
  for (const auto& gt : out.tokens) {
    if (stopped_) break;
    ++completion_tokens_;
    d.tokens.push_back(gt);
    if (cfg_.skip_special && tok_.is_special(gt.token) && !keep_special_.count(gt.token)) continue;
    text += detok_.push(gt.token);
  }
  // The engine also counts the stop token it swallowed (vLLM does the same in usage).
  completion_tokens_ = std::max(completion_tokens_, out.completion_tokens);
  const bool engine_done = out.finish != FinishReason::None;
  if (engine_done) text += detok_.flush();
  bool hit = false;
  std::string safe;
  if (completion_tokens_ <= cfg_.min_tokens) {
    safe = std::move(text);  // vLLM checks stop strings only past min_tokens
  } else {
    safe = stops_.push(text, &hit);
  }
  if (hit) {
    stopped_ = true;
    *stop_hit = true;
    if (cfg_.include_stop_str) safe += stops_.matched();
  } else if (engine_done) {
    safe += stops_.flush();
  }
  const bool final = hit || engine_done;
  emit(std::move(safe), final, &d);
  if (!final) return d;
  finished_ = true;
  if (hit) {
    d.finish_reason = "stop";
  } else {
    switch (out.finish) {
      case FinishReason::Length: d.finish_reason = "length"; break;
      case FinishReason::Stop: d.finish_reason = "stop"; break;
      case FinishReason::Cancelled: d.finish_reason = "abort"; break;
      case FinishReason::Error: d.finish_reason = "error"; d.error = out.error; break;
      case FinishReason::None: break;
    }
  }
  if (d.finish_reason == "stop" && tool_calls_ > 0) d.finish_reason = "tool_calls";
  return d;
}

void LiveRequests::add(const std::string& id) {
  std::lock_guard<std::mutex> l(mu_);
  ids_.insert(id);
}

void LiveRequests::remove(const std::string& id) {
  std::lock_guard<std::mutex> l(mu_);
  ids_.erase(id);
}

std::vector<std::string> LiveRequests::ids() const {
  std::lock_guard<std::mutex> l(mu_);
  return {ids_.begin(), ids_.end()};
}

struct Generation::Choice {
  int index = 0;
  int prompt_index = 0;
  int prompt_tokens = 0;
  std::string engine_id;
  std::shared_ptr<RequestStream> stream;
  ChoiceDecoder decoder;
  bool done = false;
  bool got_first = false;
  Clock::time_point last_token;
  Choice(const tok::Tokenizer& t, tok::PromptFormat f, const ChoiceConfig& c) : decoder(t, f, c) {}
};

Generation::Generation(Engine& e, Metrics& m, const tok::Tokenizer& t, tok::PromptFormat f,
                       std::string id, std::vector<ChoiceSpec> specs, LiveRequests* live)
    : engine_(e), metrics_(m), live_(live), id_(std::move(id)),
      created_(std::chrono::duration_cast<std::chrono::seconds>(
                   std::chrono::system_clock::now().time_since_epoch()).count()),
      start_(Clock::now()) {
  for (size_t i = 0; i < specs.size(); ++i) {
    auto c = std::make_unique<Choice>(t, f, specs[i].config);
    c->index = int(i);
    c->prompt_index = specs[i].prompt_index;
    c->prompt_tokens = int(specs[i].request.prompt.size());
    c->engine_id = id_ + "-" + std::to_string(i);
    specs[i].request.id = c->engine_id;
    metrics_.request_started();
    if (live_) live_->add(c->engine_id);
    c->stream = engine_.submit(std::move(specs[i].request));
    choices_.push_back(std::move(c));
  }
}

Generation::~Generation() {
  for (auto& c : choices_)
    if (!c->done) {
      engine_.cancel(c->engine_id);
      finish_choice(*c, "abort");
    }
}

void Generation::finish_choice(Choice& c, const std::string& reason) {
  c.done = true;
  if (live_) live_->remove(c.engine_id);
  const std::string r = reason == "tool_calls" ? "stop" : reason;
  metrics_.request_finished(r, c.prompt_tokens, c.decoder.completion_tokens(),
                            std::chrono::duration<double>(Clock::now() - start_).count());
  // The last generation out: hand glibc's per-thread arenas back to the OS, so a burst of
  // hundreds of connections does not leave the process at its peak RSS while idle.
  if (metrics_.in_flight() == 0) ::malloc_trim(0);
}

bool Generation::done() const {
  for (const auto& c : choices_)
    if (!c->done) return false;
  return true;
}

int Generation::prompt_tokens() const {
  std::map<int, int> per_prompt;
  for (const auto& c : choices_) per_prompt[c->prompt_index] = c->prompt_tokens;
  int s = 0;
  for (const auto& [_, n] : per_prompt) s += n;
  return s;
}

int Generation::completion_tokens() const {
  int s = 0;
  for (const auto& c : choices_) s += c->decoder.completion_tokens();
  return s;
}

std::vector<ChoiceDelta> Generation::poll(std::chrono::milliseconds wait) {
  std::vector<ChoiceDelta> out;
  int running = 0;
  for (const auto& c : choices_) running += !c->done;
  if (running == 0) return out;
  // One choice: block on it. Several: short waits in turn so none starves.
  const auto each = running == 1 ? wait : std::max(std::chrono::milliseconds(1), wait / (4 * running));
  const auto deadline = Clock::now() + wait;
  do {
    for (auto& c : choices_) {
      if (c->done) continue;
      GenOutput o;
      if (!c->stream->next(&o, each)) continue;
      const auto now = Clock::now();
      if (!o.tokens.empty()) {
        if (!c->got_first) {
          c->got_first = true;
          metrics_.first_token(std::chrono::duration<double>(now - start_).count());
        } else {
          metrics_.inter_token(std::chrono::duration<double>(now - c->last_token).count(), int(o.tokens.size()));
        }
        c->last_token = now;
      }
      bool stop_hit = false;
      ChoiceDelta d = c->decoder.push(o, &stop_hit);
      d.index = c->index;
      if (stop_hit) engine_.cancel(c->engine_id);
      if (!d.finish_reason.empty()) finish_choice(*c, d.finish_reason);
      out.push_back(std::move(d));
    }
  } while (out.empty() && !done() && Clock::now() < deadline);
  return out;
}

}  // namespace dil::server
