// Which request fields of the OpenAI and vLLM shapes this server does not implement. A client
// that sends one with a value that would change the answer gets a 400 naming the field
// (code "unsupported_parameter") instead of an answer that silently ignores it. Fields nobody
// knows are still accepted (OpenAI's API does the same: forward compatibility); fields that
// only label a request (user, metadata, store, service_tier, prompt_cache_key,
// safety_identifier, cache_salt) are accepted because they change no output.
#pragma once

#include "server/protocol.h"

namespace dil::server {

enum class Endpoint { Chat, Completion, Tokenize };

// Throws ApiError 400 for the first unsupported field with an effective value.
void refuse_unsupported_fields(const Json& body, Endpoint e);

}  // namespace dil::server
