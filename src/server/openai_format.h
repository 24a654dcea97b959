// OpenAI response and SSE chunk shapes (chat.completion, chat.completion.chunk,
// text_completion), kept apart from the HTTP plumbing so tests can check them directly.
#pragma once
#include <string>
#include <vector>

#include "server/generation.h"
#include "server/protocol.h"

namespace dil::server {

struct ResponseMeta {
  std::string id;      // chatcmpl-... / cmpl-...
  int64_t created = 0;
  std::string model;
};

// prompt_tokens_details.cached_tokens: prompt tokens served from the prefix cache (OpenAI's field).
Json usage_json(int prompt_tokens, int completion_tokens, int cached_tokens = 0);
// Chat logprobs items: {token, logprob, bytes, top_logprobs[]} per token.
Json chat_logprobs(const tok::Tokenizer& t, const std::vector<GenToken>& tokens, int top);
// Completions logprobs: {tokens, token_logprobs, top_logprobs, text_offset}; `offset0` is the
// choice's text length before these tokens.
Json completion_logprobs(const tok::Tokenizer& t, const std::vector<GenToken>& tokens, int top,
                         size_t offset0);
Json tool_calls_json(const std::vector<tok::ToolCall>& calls, int first_index, bool streaming);

std::string sse(const Json& j);  // "data: <json>\n\n"
constexpr const char* kSseDone = "data: [DONE]\n\n";

Json chat_chunk(const ResponseMeta& m, Json choices, bool with_usage_null);
Json completion_chunk(const ResponseMeta& m, Json choices, bool with_usage_null);

}  // namespace dil::server
