// Tokenizer facade, streaming detokenizer and stop-string matcher.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>

#include "core/check.h"
#include "tokenizer/bpe.h"
#include "tokenizer/utf8.h"

namespace dil::tok {

Tokenizer::Tokenizer(std::unique_ptr<BpeModel> m) : m_(std::move(m)) {}
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& tokenizer_json) {
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::make_unique<BpeModel>(tokenizer_json)));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  size_t bad = utf8_invalid_at(text);
  if (bad != std::string_view::npos) DIL_FAIL("tokenizer: input is not valid UTF-8 (byte offset ", bad, ")");
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  m_->encode(text, parse_special, ids);
  return ids;
}

std::string Tokenizer::token_bytes(int32_t id) const { return m_->token_bytes(id); }

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0) DIL_FAIL("tokenizer: token id ", id, " is negative");
    // Ids past the tokenizer's vocabulary have no text (a checkpoint's embedding and head are
    // padded past it: V4's 129,280 rows for the tokenizer's 128,815 ids), as HF's decode skips them.
    if (id >= vocab_size()) continue;
    if (skip_special && m_->is_special(id)) continue;
    bytes += m_->token_bytes(id);
  }
  return utf8_lossy(bytes);
}

int32_t Tokenizer::token_to_id(std::string_view tok) const { return m_->token_to_id(tok); }
std::string Tokenizer::id_to_token(int32_t id) const { return m_->id_to_token(id); }
int64_t Tokenizer::vocab_size() const { return m_->vocab_size(); }
bool Tokenizer::is_special(int32_t id) const { return m_->is_special(id); }
bool Tokenizer::is_added(int32_t id) const { return m_->is_added(id); }

// ---------------------------------------------------------------------------------------------

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& t, bool skip_special)
    : t_(t), skip_special_(skip_special) {}

std::string IncrementalDetokenizer::push(int32_t id) {
  // A generated id the tokenizer does not have (the model's padded vocabulary rows) adds no text;
  // never an error mid-stream.
  if (id < 0 || id >= t_.vocab_size()) return "";
  if (skip_special_ && t_.is_special(id)) return "";
  pending_ += t_.model().token_bytes(id);
  // Hold back an unfinished multi-byte sequence; everything before it is final (invalid bytes
  // become U+FFFD exactly as a full decode() would make them).
  size_t tail = utf8_incomplete_tail(pending_);
  std::string out = utf8_lossy(std::string_view(pending_).substr(0, pending_.size() - tail));
  pending_.erase(0, pending_.size() - tail);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out = utf8_lossy(pending_);
  pending_.clear();
  return out;
}

// ---------------------------------------------------------------------------------------------

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopMatcher::push(std::string_view text, bool* stopped) {
  *stopped = false;
  if (done_) {
    *stopped = true;
    return "";
  }
  held_.append(text);
  // Earliest complete stop string wins (OpenAI semantics: output ends before it).
  size_t first = std::string::npos;
  for (const auto& s : stops_) {
    const size_t at = held_.find(s);
    if (at < first) {
      first = at;
      matched_ = s;
    }
  }
  if (first != std::string::npos) {
    std::string out = held_.substr(0, first);
    held_.clear();
    done_ = true;
    *stopped = true;
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const auto& s : stops_) {
    for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  // Never split a UTF-8 sequence: held-back bytes start at a character boundary.
  size_t cut = held_.size() - keep;
  while (cut > 0 && cut < held_.size() && (static_cast<uint8_t>(held_[cut]) & 0xC0) == 0x80) --cut;
  std::string out = held_.substr(0, cut);
  held_.erase(0, cut);
  return out;
}

std::string StopMatcher::flush() {
  std::string out;
  if (!done_) out.swap(held_);
  held_.clear();
  return out;
}

// ---------------------------------------------------------------------------------------------

PromptFormat prompt_format_from_config(const std::string& config_json_path) {
  std::ifstream f(config_json_path);
  if (!f) DIL_FAIL("cannot open model config ", config_json_path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    DIL_FAIL(config_json_path, " is not valid JSON: ", e.what());
  }
  std::string mt = j.value("model_type", "");
  if (mt == "deepseek_v41" || j.contains("text_config")) return PromptFormat::V41;
  for (const auto& a : j.value("architectures", nlohmann::json::array()))
    if (a.is_string() && a.get<std::string>().find("V41") != std::string::npos) return PromptFormat::V41;
  if (mt.rfind("deepseek_v4", 0) == 0 || mt.empty()) return PromptFormat::V4;
  DIL_FAIL(config_json_path, ": model_type '", mt, "' has no DeepSeek V4/V4.1 prompt format");
}

}  // namespace dil::tok
