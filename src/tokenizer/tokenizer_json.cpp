#include "tokenizer/tokenizer_json.h"

#include <fstream>
#include <sstream>

#include "core/check.h"

namespace dil::tok {
namespace {

using json = nlohmann::json;

// SAX handler: forwards every event to nlohmann's DOM builder except those inside
// model.vocab / model.merges, which it collects itself.
class Reader : public nlohmann::json_sax<json> {
 public:
  explicit Reader(TokenizerJson& out) : out_(out), dom_(out.doc) {}

  bool null() override { return capturing() ? fail("null") : dom_.null(); }
  bool boolean(bool v) override { return capturing() ? fail("boolean") : dom_.boolean(v); }
  bool number_integer(number_integer_t v) override { return capturing() ? id(v) : dom_.number_integer(v); }
  bool number_unsigned(number_unsigned_t v) override {
    return capturing() ? id(static_cast<int64_t>(v)) : dom_.number_unsigned(v);
  }
  bool number_float(number_float_t v, const string_t& s) override { return capturing() ? fail("float") : dom_.number_float(v, s); }
  bool binary(binary_t& b) override { return capturing() ? fail("binary") : dom_.binary(b); }
  bool string(string_t& s) override {
    if (cap_ == kVocab) return fail("string value");
    if (cap_ == kMerges) {
      if (depth_ == cap_depth_) {  // "a b"
        size_t sp = s.find(' ');
        if (sp == std::string::npos) DIL_FAIL("tokenizer: bad merge '", s, "'");
        out_.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else {  // ["a", "b"]
        pair_[n_pair_ < 2 ? n_pair_ : 1] = std::move(s);
        ++n_pair_;
      }
      return true;
    }
    return dom_.string(s);
  }
  bool start_object(std::size_t n) override {
    ++depth_;
    if (pending_ == kVocab) return begin(kVocab);
    if (capturing()) return fail("object");
    return dom_.start_object(n);
  }
  bool end_object() override {
    --depth_;
    if (cap_ == kVocab && depth_ < cap_depth_) return end();
    return dom_.end_object();
  }
  bool start_array(std::size_t n) override {
    ++depth_;
    if (pending_ == kMerges) return begin(kMerges);
    if (cap_ == kMerges) {
      if (depth_ != cap_depth_ + 1) return fail("nested array");
      n_pair_ = 0;
      return true;
    }
    if (capturing()) return fail("array");
    return dom_.start_array(n);
  }
  bool end_array() override {
    --depth_;
    if (cap_ == kMerges) {
      if (depth_ < cap_depth_) return end();
      if (n_pair_ != 2) DIL_FAIL("tokenizer: a merge must be a pair of strings");
      out_.merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      return true;
    }
    return dom_.end_array();
  }
  bool key(string_t& k) override {
    if (cap_ == kVocab) {
      vocab_key_ = std::move(k);
      return true;
    }
    if (depth_ == 1) top_key_ = k;
    if (depth_ == 2 && top_key_ == "model" && (k == "vocab" || k == "merges")) {
      pending_ = k == "vocab" ? kVocab : kMerges;
      return true;  // the value's events are captured, the key is not forwarded
    }
    return dom_.key(k);
  }
  bool parse_error(std::size_t pos, const std::string& tok, const nlohmann::detail::exception& e) override {
    DIL_FAIL("tokenizer: invalid JSON at byte ", pos, ": ", e.what());
  }

 private:
  enum Cap { kNone, kVocab, kMerges };
  bool capturing() const { return cap_ != kNone || pending_ != kNone; }
  bool begin(Cap c) {
    cap_ = c;
    cap_depth_ = depth_;
    pending_ = kNone;
    if (c == kVocab) out_.has_vocab = true;
    return true;
  }
  bool end() {
    cap_ = kNone;
    return true;
  }
  bool id(int64_t v) {
    if (cap_ != kVocab) return fail("number");
    out_.vocab.emplace_back(std::move(vocab_key_), static_cast<int32_t>(v));
    return true;
  }
  bool fail(const char* what) { DIL_FAIL("tokenizer: unexpected ", what, " in model.vocab / model.merges"); }

  TokenizerJson& out_;
  nlohmann::detail::json_sax_dom_parser<json> dom_;
  int depth_ = 0, cap_depth_ = 0;
  Cap cap_ = kNone, pending_ = kNone;
  std::string top_key_, vocab_key_, pair_[2];
  int n_pair_ = 0;
};

}  // namespace

TokenizerJson read_tokenizer_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) DIL_FAIL("tokenizer: cannot open ", path);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  TokenizerJson out;
  Reader r(out);
  try {
    json::sax_parse(text, &r);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    DIL_FAIL("tokenizer: ", path, " is not valid JSON: ", e.what());
  }
  if (!out.doc.is_object()) DIL_FAIL("tokenizer: ", path, " is not a JSON object");
  return out;
}

}  // namespace dil::tok
