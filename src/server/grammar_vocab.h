// The grammar's view of a tokenizer (src/grammar takes token byte strings, not a Tokenizer).
#pragma once
#include <cstdint>
#include <memory>

#include "grammar/vocab.h"
#include "tokenizer/tokenizer.h"

namespace dil::server {

// Ids [0, n_ids): every BPE token's bytes, plus (with_markup: chat, whose text pipeline keeps
// them, see ChoiceDecoder) the added tokens the output parser reads as markup: <think>,
// </think>, the DSML tokens. Other added tokens (BOS/EOS, <｜User｜>, ...) get no bytes: a
// grammar never allows them (EOS is the engine's, once the grammar accepts). Nor do ids the
// tokenizer lacks.
std::shared_ptr<const grammar::Vocabulary> grammar_vocabulary(const tok::Tokenizer& t, int64_t n_ids, bool with_markup);

}  // namespace dil::server
