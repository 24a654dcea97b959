// OpenAI request validation: JSON bodies -> typed requests, or an ApiError that becomes an
// OpenAI error body. Everything a client can send goes through here, so no later stage sees
// a wrong type, a non-finite number or an out-of-range count.
#pragma once
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dil/engine.h"
#include "server/output_format.h"
#include "tokenizer/tokenizer.h"

namespace dil::server {

// Insertion-ordered JSON: responses keep OpenAI's field order and tool schemas keep the
// client's key order when rendered into the prompt.
using Json = nlohmann::ordered_json;

struct ApiError : std::exception {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message, param, code;
  ApiError(int st, std::string msg, std::string prm = "", std::string cd = "",
           std::string tp = "invalid_request_error")
      : status(st), type(std::move(tp)), message(std::move(msg)), param(std::move(prm)),
        code(std::move(cd)) {}
  const char* what() const noexcept override { return message.c_str(); }
};
Json error_body(const ApiError& e);  // {"error": {message, type, param, code}}

// Parses a request body; malformed JSON / invalid UTF-8 / not an object -> ApiError 400.
Json parse_body(const std::string& body);

// Fields shared by /v1/chat/completions and /v1/completions.
struct GenParams {
  std::string model;            // "" when the client sent none
  SamplingParams sampling;
  StopParams stop;              // stop.max_tokens < 0: not given (fill from the context left)
  std::vector<std::string> stop_strings;
  int n = 1;
  bool stream = false;
  bool include_usage = false;   // stream_options.include_usage
  bool skip_special_tokens = true;
  bool include_stop_str = false;  // include_stop_str_in_output (vLLM)
  int truncate_prompt_tokens = 0; // vLLM: keep the last k prompt tokens; -1: max_model_len; 0: off
  std::optional<bool> add_special_tokens;  // BOS before the prompt (default: chat no, completions yes)
  std::string request_id;         // vLLM's request_id: the response id becomes <prefix>-<request_id>
};

struct ServerDefaults {
  bool thinking = false;  // thinking mode when the request does not say
  tok::PromptFormat format = tok::PromptFormat::V4;  // what reasoning_effort values the encoder takes
};

struct ChatRequest {
  GenParams gen;
  Json messages;               // normalised: content parts joined, `reasoning` -> reasoning_content
  tok::ChatOptions chat;
  std::string tool_choice = "auto";  // none | auto | required | function (named)
  std::string tool_choice_name;      // the named function
  bool tools_withheld = false;       // tool_choice none: tools were sent but are not offered
  bool parallel_tool_calls = true;
  bool logprobs = false;             // chat's bool; top count is gen.sampling.logprobs
  OutputFormat format;               // structured output (structured.h)
};

struct CompletionPrompt {
  bool is_text = true;
  std::string text;
  std::vector<int32_t> ids;
};
struct CompletionRequest {
  GenParams gen;
  std::vector<CompletionPrompt> prompts;
  bool echo = false;
  OutputFormat format;  // structured output (structured.h)
};

ChatRequest parse_chat_request(const Json& body, const ServerDefaults& d, int64_t vocab_size);
CompletionRequest parse_completion_request(const Json& body, int64_t vocab_size);

// Shared by /v1/chat/completions and /tokenize: messages and the thinking/effort/tools fields.
Json normalize_messages(const Json& messages);
// response_format goes into ChatOptions (the encoders render it into the system prompt);
// parse_output_format checks it.
void parse_chat_options(const Json& body, const ServerDefaults& d, tok::ChatOptions* o);

// Field readers: absent or null -> false (value untouched); wrong type/range -> ApiError 400.
bool read_int(const Json& j, const char* key, int64_t lo, int64_t hi, int64_t* out);
bool read_number(const Json& j, const char* key, double lo, double hi, double* out);
bool read_bool(const Json& j, const char* key, bool* out);
bool read_string(const Json& j, const char* key, std::string* out);
std::vector<int32_t> read_token_ids(const Json& v, const std::string& param, int64_t vocab_size);

}  // namespace dil::server
