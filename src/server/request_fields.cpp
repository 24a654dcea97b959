#include "server/request_fields.h"

#include <cmath>

namespace dil::server {
namespace {

// The value under which a field changes nothing (null always counts as absent).
enum class Noop { Never, False, Empty, One, Zero, TextOnly };

struct Unsupported {
  const char* field;
  Noop noop;
  const char* why;
  bool chat, completion, tokenize;
};

// Structured output (structured_protocol.cpp) reads response_format, guided_json,
// guided_regex, guided_choice and structured_outputs, and refuses guided_grammar and
// guided_whitespace_pattern itself (naming what it does support). What is left here is
// structured output this server's grammar engine does not offer.
constexpr Unsupported kTable[] = {
    {"guided_decoding_backend", Noop::Never,
     "structured output always runs on this server's own grammar engine; leave the field out", true, true, false},
    {"structural_tag", Noop::Never,
     "structural tags are not implemented (structured output takes json, regex, choice or json_object)", true, true,
     false},
    {"prompt_logprobs", Noop::Never, "prompt logprobs are not computed (the engine samples the last position only)",
     true, true, false},
    {"use_beam_search", Noop::False, "beam search is not implemented", true, true, false},
    {"length_penalty", Noop::One, "length_penalty only applies to beam search, which is not implemented", true, true,
     false},
    {"bad_words", Noop::Empty, "bad_words is not implemented", true, true, false},
    {"logits_processors", Noop::Empty, "custom logits processors are not supported", true, true, false},
    {"return_tokens_as_token_ids", Noop::False, "return_tokens_as_token_ids is not implemented", true, true, false},
    {"return_token_ids", Noop::False, "return_token_ids is not implemented", true, true, false},
    {"prompt_embeds", Noop::Never, "prompt embeddings are not accepted", false, true, false},
    {"kv_transfer_params", Noop::Never, "disaggregated prefill is not implemented", true, true, false},
    {"vllm_xargs", Noop::Empty, "vllm_xargs is not supported", true, true, false},
    {"priority", Noop::Zero, "priority scheduling is not implemented (requests are served first come, first served)",
     true, true, false},
    {"continue_final_message", Noop::False, "continue_final_message is not implemented", true, false, true},
    {"chat_template", Noop::Never, "the prompt is always rendered by the model's own encoder", true, false, true},
    {"documents", Noop::Empty, "documents (RAG) are not rendered by the DeepSeek encoders", true, false, true},
    {"mm_processor_kwargs", Noop::Empty, "this model takes text only", true, false, true},
    {"echo", Noop::False, "echo is not implemented for chat completions (it is for /v1/completions)", true, false,
     false},
    {"audio", Noop::Never, "audio output is not supported (text only)", true, false, false},
    {"modalities", Noop::TextOnly, "only the text modality is supported", true, false, false},
    {"prediction", Noop::Never, "predicted outputs are not implemented", true, false, false},
    {"web_search_options", Noop::Never, "web search is not available", true, false, false},
    {"functions", Noop::Empty, "the deprecated 'functions' field is not supported; send 'tools'", true, false, false},
    {"function_call", Noop::Never, "the deprecated 'function_call' field is not supported; send 'tool_choice'", true,
     false, false},
    {"verbosity", Noop::Never, "verbosity is not supported", true, false, false},
};

bool is_noop(const Json& v, Noop n) {
  switch (n) {
    case Noop::Never: return false;
    case Noop::False: return v.is_boolean() && !v.get<bool>();
    case Noop::Empty: return (v.is_array() || v.is_object()) && v.empty();
    case Noop::One: return v.is_number() && v.get<double>() == 1.0;
    case Noop::Zero: return v.is_number() && v.get<double>() == 0.0;
    case Noop::TextOnly:
      return v.is_array() && (v.empty() || (v.size() == 1 && v[0].is_string() && v[0].get<std::string>() == "text"));
  }
  return false;
}

}  // namespace

void refuse_unsupported_fields(const Json& body, Endpoint e) {
  for (const Unsupported& u : kTable) {
    const bool here = e == Endpoint::Chat ? u.chat : e == Endpoint::Completion ? u.completion : u.tokenize;
    if (!here) continue;
    auto it = body.find(u.field);
    if (it == body.end() || it->is_null()) continue;
    if (is_noop(*it, u.noop)) continue;
    throw ApiError(400, std::string("'") + u.field + "' is not supported by this server: " + u.why, u.field,
                   "unsupported_parameter");
  }
  if (auto it = body.find("stream_options"); it != body.end() && it->is_object()) {
    for (const char* k : {"continuous_usage_stats", "include_obfuscation"}) {
      auto s = it->find(k);
      if (s != it->end() && !s->is_null() && !(s->is_boolean() && !s->get<bool>()))
        throw ApiError(400, std::string("'stream_options.") + k + "' is not supported by this server",
                       std::string("stream_options.") + k, "unsupported_parameter");
    }
  }
}

}  // namespace dil::server
