// /tokenize and /detokenize, shaped like vLLM's, plus the rendered prompt string so users
// can see exactly what the model saw (issue 11).
#include "server/request_fields.h"
#include "server/server_core.h"

namespace dil::server {

void Server::Core::tokenize(const http::Request& req, http::Response& res) {
  const Json body = parse_body(req.body);
  refuse_unsupported_fields(body, Endpoint::Tokenize);
  std::string model;
  read_string(body, "model", &model);
  check_model(model);
  bool token_strs = false;
  read_bool(body, "return_token_strs", &token_strs);
  std::string prompt;
  if (body.contains("messages") && !body["messages"].is_null()) {
    if (body.contains("prompt") && !body["prompt"].is_null())
      throw ApiError(400, "send either 'prompt' or 'messages', not both", "prompt");
    const Json messages = normalize_messages(body["messages"]);
    tok::ChatOptions o;
    parse_chat_options(body, opts.defaults, &o);
    bool add_special = false;  // the rendered prompt has its BOS
    read_bool(body, "add_special_tokens", &add_special);
    try {
      prompt = tok::render_chat(format, messages, o);
    } catch (const dil::Error& e) {
      throw ApiError(400, e.what(), "messages");
    }
    const int32_t bos = engine.info().bos_token_id;
    if (add_special && bos >= 0) prompt = tok.decode({bos}) + prompt;
  } else {
    if (!read_string(body, "prompt", &prompt)) throw ApiError(400, "'prompt' (a string) or 'messages' is required", "prompt");
    bool add_special = true;
    read_bool(body, "add_special_tokens", &add_special);
    const int32_t bos = engine.info().bos_token_id;
    if (add_special && bos >= 0) prompt = tok.decode({bos}) + prompt;
  }
  const std::vector<int32_t> ids = encode(prompt, "prompt");
  Json out{{"tokens", ids}, {"count", ids.size()}, {"max_model_len", engine.info().max_model_len}, {"prompt", prompt}};
  if (token_strs) {
    Json strs = Json::array();
    for (int32_t id : ids) strs.push_back(tok.id_to_token(id));
    out["token_strs"] = strs;
  }
  send_json(res, 200, out);
}

void Server::Core::detokenize(const http::Request& req, http::Response& res) {
  const Json body = parse_body(req.body);
  std::string model;
  read_string(body, "model", &model);
  check_model(model);
  if (!body.contains("tokens")) throw ApiError(400, "'tokens' is required", "tokens");
  const std::vector<int32_t> ids = read_token_ids(body["tokens"], "tokens", vocab);
  send_json(res, 200, Json{{"prompt", tok.decode(ids, /*skip_special=*/false)}});
}

}  // namespace dil::server
