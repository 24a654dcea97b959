// The tokenizer (bundled tiny-v4 tokenizer.json: the DeepSeek pre-tokenizer regexes and
// byte-level BPE with a 1024-id vocabulary): encode must take any valid UTF-8 and decode back
// to the same text (byte-level BPE is lossless), reject invalid UTF-8 with dil::Error, and
// decode / the incremental detokenizer must take any ids.
#include <cstdint>
#include <memory>
#include <string>

#include "core/check.h"
#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {
const dil::tok::Tokenizer& tokenizer() {
  static const std::unique_ptr<dil::tok::Tokenizer> t =
      dil::tok::Tokenizer::load(dil::fuzz::source_dir() + "/models/tiny-v4/tokenizer.json");
  return *t;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dil;
  const tok::Tokenizer& t = tokenizer();
  fuzz::Choices ch(data, size);
  const uint8_t mode = ch.byte();
  const std::string_view in = ch.rest();
  if (mode & 1) {
    // Arbitrary ids (two bytes each, wrapped into the vocabulary, a few out of range).
    std::vector<int32_t> ids;
    for (size_t i = 0; i + 1 < in.size(); i += 2) ids.push_back(int32_t(uint8_t(in[i]) | uint8_t(in[i + 1]) << 8) % 1100);
    std::vector<int32_t> valid;
    for (int32_t id : ids)
      if (id < t.vocab_size()) valid.push_back(id);
    const std::string whole = t.decode(valid, mode & 2);
    DIL_CHECK(tok::utf8_invalid_at(whole) == std::string::npos, "decode produced invalid UTF-8");
    tok::IncrementalDetokenizer d(t, mode & 2);
    std::string inc;
    for (int32_t id : valid) inc += d.push(id);
    inc += d.flush();
    DIL_CHECK(tok::utf8_invalid_at(inc) == std::string::npos, "the detokenizer produced invalid UTF-8");
    return 0;
  }
  const bool valid = tok::utf8_invalid_at(in) == std::string::npos;
  try {
    const std::vector<int32_t> ids = t.encode(in, mode & 2);
    DIL_CHECK(valid, "encode accepted invalid UTF-8");
    for (int32_t id : ids) DIL_CHECK(id >= 0 && id < t.vocab_size(), "id ", id, " out of range");
    DIL_CHECK(t.decode(ids) == in, "decode(encode(x)) != x for ", in.size(), " bytes");
  } catch (const dil::Error&) {
    DIL_CHECK(!valid, "encode rejected valid UTF-8");
  }
  return 0;
}
