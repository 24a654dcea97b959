// Regular expressions (and choices) as grammar expressions that match whole strings.
//
// Supported: literals, `.` (any character but \n), classes `[...]` / `[^...]` with ranges and
// the escapes \d \w \s \D \W \S, \n \t \r \f \v \0 \xHH \uHHHH, escaped punctuation, groups
// `(...)` `(?:...)` `(?P<n>...)` `(?<n>...)`, alternation, quantifiers `* + ? {n} {n,} {n,m}`
// (lazy forms are the same language), `^` at the start and `$` at the end (the match is
// always the whole string). Anything else (lookaround, backreferences, \b, \p{..}, flags,
// possessive quantifiers) throws GrammarError naming the feature: it is never ignored.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "grammar/builder.h"
#include "grammar/charset.h"

namespace dil::grammar {

// `allowed` bounds every character the expression may produce (classes and `.` are intersected
// with it; a literal outside it is an error).
Builder::Id regex_expr(Builder& b, std::string_view pattern, CharMode mode, const CharSet& allowed = CharSet::all());

// Exactly one of the strings (written in `mode`).
Builder::Id choice_expr(Builder& b, const std::vector<std::string>& options, CharMode mode);

}  // namespace dil::grammar
