#include "server/grammar_vocab.h"

#include <string>
#include <vector>

namespace dil::server {

std::shared_ptr<const grammar::Vocabulary> grammar_vocabulary(const tok::Tokenizer& t, int64_t n_ids, bool with_markup) {
  std::vector<std::string> bytes(static_cast<size_t>(n_ids));
  for (int64_t id = 0; id < n_ids && id < t.vocab_size(); ++id) {
    const int32_t i = int32_t(id);
    if (!t.is_added(i)) bytes[size_t(id)] = t.token_bytes(i);
  }
  if (with_markup)
    for (const char* markup : {"<think>", "</think>", "<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>", "｜DSML｜"}) {
      const int32_t id = t.token_to_id(markup);
      if (id >= 0 && id < n_ids && t.is_added(id)) bytes[size_t(id)] = markup;
    }
  return std::make_shared<grammar::Vocabulary>(std::move(bytes));
}

}  // namespace dil::server
