// DeepSeek tokenizer (byte-level BPE from tokenizer.json), V4/V4.1 prompt encoders and the
// completion parser (reasoning / content / DSML tool calls). See model-spec.md §5.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace dil::tok {

class BpeModel;  // tokenizer internals (bpe.h)

class Tokenizer {
 public:
  // Loads a HF `tokenizer.json` (ByteLevel BPE + Split pre-tokenizers). Throws dil::Error.
  static std::unique_ptr<Tokenizer> load(const std::string& tokenizer_json);
  ~Tokenizer();
  // Invalid UTF-8 in `text` throws dil::Error (HF tokenizers cannot take it either).
  // parse_special: added tokens written in the text become their ids (HF's default).
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;
  // Bytes of the tokens joined; invalid UTF-8 sequences become U+FFFD (like HF's decoder).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;
  // Raw bytes of one token (no UTF-8 repair): what the incremental detokenizer assembles.
  std::string token_bytes(int32_t id) const;
  int32_t token_to_id(std::string_view tok) const;  // -1 if absent
  std::string id_to_token(int32_t id) const;        // the vocab string ("" if out of range)
  int64_t vocab_size() const;                       // incl. added tokens: max id + 1
  bool is_special(int32_t id) const;
  // An added token (special or not: chat markup such as <｜User｜>), not a BPE merge result.
  bool is_added(int32_t id) const;
  const BpeModel& model() const { return *m_; }

 private:
  explicit Tokenizer(std::unique_ptr<BpeModel> m);
  std::unique_ptr<BpeModel> m_;
};

// Streaming: push ids, get text that is safe to emit (never a broken UTF-8 sequence).
class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(const Tokenizer& t, bool skip_special);
  std::string push(int32_t id);
  std::string flush();  // end of stream: an unfinished sequence becomes U+FFFD

 private:
  const Tokenizer& t_;
  bool skip_special_;
  std::string pending_;  // bytes of an incomplete UTF-8 sequence
};

// Stop strings that may span tokens: holds back text that could be the start of a stop string.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  // Returns text safe to emit; sets *stopped when a stop string completes (the text before
  // it is returned, the stop string and everything after are dropped).
  std::string push(std::string_view text, bool* stopped);
  std::string flush();
  const std::string& matched() const { return matched_; }  // the stop string that completed

 private:
  std::vector<std::string> stops_;
  std::string held_;
  std::string matched_;
  bool done_ = false;
};

enum class PromptFormat { V4, V41 };
// V4.1 configs are composite (`text_config`, model_type deepseek_v41...); everything else is V4.
PromptFormat prompt_format_from_config(const std::string& config_json_path);

// JSON with insertion-ordered keys: tool schemas and arguments are rendered in the order the
// client sent them (Python dict order), so parse requests with nlohmann::ordered_json::parse.
using Json = nlohmann::ordered_json;

struct ChatOptions {
  std::string thinking_mode = "chat";  // "chat" | "thinking"
  Json reasoning_effort;               // null | "low"|"high"|"max" | int 1..100 (V4.1)
  Json tools;                          // OpenAI tools array or null (attached to the system message)
  Json response_format;                // or null (attached to the system message)
  bool add_generation_prompt = true;   // false: drop the trailing <｜Assistant｜> header
};
// Renders OpenAI-format messages exactly like the official encoders. dil::Error on bad messages.
std::string render_chat(PromptFormat f, const Json& messages, const ChatOptions& o);

struct ToolCall {
  std::string id, name, arguments_json;
};
struct ParsedMessage {
  std::string content, reasoning_content;
  std::vector<ToolCall> tool_calls;
};
struct ParserDelta {  // streaming deltas
  std::string content, reasoning;
  std::vector<ToolCall> new_tool_calls;
};

// Incremental completion parser: never emits partial markup as content.
class OutputParser {
 public:
  OutputParser(PromptFormat f, bool thinking);  // thinking: the prompt ended with <think>
  ~OutputParser();
  OutputParser(OutputParser&&) noexcept;
  OutputParser& operator=(OutputParser&&) noexcept;
  // Text is expected in whole UTF-8 characters (what IncrementalDetokenizer emits). A
  // completion cut off without EOS is finished by finish(); a malformed tool block is returned
  // as content at finish() unless some of its calls were already emitted.
  ParserDelta push(std::string_view text);
  ParserDelta finish();           // end of generation
  ParsedMessage message() const;  // everything so far

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Whole-completion parse; dil::Error if malformed like the official parser.
ParsedMessage parse_completion(PromptFormat f, std::string_view text, bool thinking);

}  // namespace dil::tok
