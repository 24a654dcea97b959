// Nesting limit for JSON that comes from outside the process (HTTP bodies, tool-call argument
// strings inside them). nlohmann's parser itself is iterative, but what consumes a parsed
// document (copies, dump(), comparisons, our validators) recurses once per level, so a 200 KB
// body of 10^5 '[' overflowed the stack of a connection thread and killed the server. Every
// such document is scanned before anything is parsed, so no deep DOM is ever built.
#pragma once
#include <string_view>

namespace dil {

// Deepest array/object nesting accepted from clients (vLLM/pydantic accept far less in practice;
// real requests stay below 20).
inline constexpr int kMaxJsonDepth = 512;

// True when `text` nests arrays/objects deeper than `limit` levels. A linear scan that counts
// brackets outside string literals (honouring backslash escapes) and stops at the first level
// past the limit. For valid JSON the count is exact; for invalid JSON it is at least the depth
// the parser would reach before it fails, so a document that passes cannot nest deeper.
bool json_too_deep(std::string_view text, int limit = kMaxJsonDepth);

}  // namespace dil
