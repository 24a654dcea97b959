// One HTTP request's generations: n choices (x prompts for /v1/completions), each an engine
// request whose tokens go through detokenizer -> stop strings -> (chat) output parser.
// The connection thread owns a Generation; destroying it cancels whatever is still running,
// so a client that disconnects frees its engine state as soon as the response is dropped.
#pragma once
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dil/engine.h"
#include "server/metrics.h"
#include "server/protocol.h"
#include "tokenizer/tokenizer.h"

namespace dil::server {

using Clock = std::chrono::steady_clock;

// What one engine output adds to a choice, after stop strings and parsing.
struct ChoiceDelta {
  int index = 0;
  std::string content;    // chat: content; completions: text
  std::string reasoning;  // chat in thinking mode
  std::vector<tok::ToolCall> tool_calls;  // complete calls, ids filled
  int first_tool_index = 0;               // index of tool_calls[0] within the choice
  std::vector<GenToken> tokens;           // with logprobs when asked for
  std::string finish_reason;              // "" while running
  std::string error;
};

struct ChoiceConfig {
  bool chat = false;
  bool thinking = false;          // the prompt ended with <think>
  bool parse_tools = false;       // tools were offered
  bool skip_special = true;
  std::vector<std::string> stop_strings;
  bool include_stop_str = false;  // a completed stop string stays in the text (vLLM)
  int min_tokens = 0;             // stop strings count only after this many tokens (vLLM)
};

// The text pipeline of one choice (no engine, no threads: unit-testable).
class ChoiceDecoder {
 public:
  ChoiceDecoder(const tok::Tokenizer& t, tok::PromptFormat f, const ChoiceConfig& c);
  // Consumes one engine output. Sets *stop_hit when a stop string completed (the caller then
  // cancels the engine request: its later tokens are dropped).
  ChoiceDelta push(const GenOutput& out, bool* stop_hit);
  int completion_tokens() const { return completion_tokens_; }
  bool finished() const { return finished_; }

 private:
  void emit(std::string text, bool final, ChoiceDelta* d);

  const tok::Tokenizer& tok_;
  ChoiceConfig cfg_;
  tok::IncrementalDetokenizer detok_;
  tok::StopMatcher stops_;
  std::optional<tok::OutputParser> parser_;
  std::set<int32_t> keep_special_;  // markup the parser needs even when skipping specials
  int completion_tokens_ = 0;
  int tool_calls_ = 0;
  bool stopped_ = false;
  bool finished_ = false;
};

// The engine ids of every choice still running, so a shutdown can abort them all.
class LiveRequests {
 public:
  void add(const std::string& id);
  void remove(const std::string& id);
  std::vector<std::string> ids() const;

 private:
  mutable std::mutex mu_;
  std::set<std::string> ids_;
};

struct ChoiceSpec {
  GenRequest request;   // prompt, sampling, stop (id filled by Generation)
  ChoiceConfig config;
  int prompt_index = 0;
};

class Generation {
 public:
  Generation(Engine& e, Metrics& m, const tok::Tokenizer& t, tok::PromptFormat f,
             std::string id, std::vector<ChoiceSpec> choices, LiveRequests* live = nullptr);
  ~Generation();  // cancels unfinished choices
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  // Waits up to `wait` for output of any running choice and returns the new deltas.
  std::vector<ChoiceDelta> poll(std::chrono::milliseconds wait);
  bool done() const;
  const std::string& id() const { return id_; }
  int64_t created() const { return created_; }
  int prompt_tokens() const;      // sum over distinct prompts
  int completion_tokens() const;  // sum over choices

 private:
  struct Choice;
  void finish_choice(Choice& c, const std::string& reason);

  Engine& engine_;
  Metrics& metrics_;
  LiveRequests* live_;
  std::string id_;
  int64_t created_;
  Clock::time_point start_;
  std::vector<std::unique_ptr<Choice>> choices_;
};

std::string random_hex(int n_chars);  // ids for responses and tool calls

}  // namespace dil::server
