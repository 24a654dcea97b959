// UTF-8 helpers shared by the tokenizer, the detokenizer and the chat layer.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dil::tok {

// Byte offset of the first invalid UTF-8 sequence in `s`, or npos when `s` is valid.
size_t utf8_invalid_at(std::string_view s);
// Replaces every maximal invalid subsequence by U+FFFD (what Rust's from_utf8_lossy does,
// which is what HF's ByteLevel decoder uses).
std::string utf8_lossy(std::string_view s);
// Length of a trailing prefix of a UTF-8 sequence that is still incomplete but could become
// valid with more bytes (0..3). Text before it is safe to emit.
size_t utf8_incomplete_tail(std::string_view s);
void utf8_append(std::string& out, uint32_t cp);
// Decodes the code point at s[i] of valid UTF-8 and advances i.
uint32_t utf8_next(std::string_view s, size_t& i);

}  // namespace dil::tok
