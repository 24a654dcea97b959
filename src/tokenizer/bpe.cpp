#include "tokenizer/bpe.h"

#include <algorithm>
#include <queue>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer_json.h"
#include "tokenizer/utf8.h"

namespace dil::tok {
namespace {

using nlohmann::json;

// GPT-2's byte -> printable code point table used by ByteLevel.
void byte_level_table(uint32_t (&cp)[256]) {
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    cp[b] = printable ? b : 256 + n++;
  }
}

// Words longer than this skip the cache (rare, and they would bloat it); shorter than the
// minimum are cheaper to merge than to look up.
constexpr size_t kMaxCachedWord = 256;
constexpr size_t kMinCachedWord = 4;
constexpr size_t kCacheSlots = 1 << 16;

}  // namespace

void MergeTable::reserve(size_t n) {
  size_t cap = 16;
  while (cap < 2 * n) cap <<= 1;
  keys_.assign(cap, kNone);
  values_.assign(cap, 0);
  mask_ = cap - 1;
  shift_ = 64 - __builtin_ctzll(cap);
}

void MergeTable::insert(uint64_t key, uint64_t value) {
  for (size_t i = slot(key);; i = (i + 1) & mask_) {
    if (keys_[i] == key) return;
    if (keys_[i] == kNone) {
      keys_[i] = key;
      values_[i] = value;
      return;
    }
  }
}

void AddedTrie::add(const AddedToken* t) {
  int32_t n = 0;
  for (unsigned char c : t->content) {
    int32_t child = -1;
    for (auto [b, k] : nodes_[n].next)
      if (b == c) child = k;
    if (child < 0) {
      child = static_cast<int32_t>(nodes_.size());
      nodes_[n].next.emplace_back(c, child);
      nodes_.emplace_back();
    }
    n = child;
  }
  if (!nodes_[n].token) nodes_[n].token = t;  // duplicates: the first one wins
}

const AddedToken* AddedTrie::match(std::string_view text, size_t i, bool parse_special) const {
  const AddedToken* best = nullptr;
  int32_t n = 0;
  for (; i < text.size(); ++i) {
    int32_t child = -1;
    for (auto [b, k] : nodes_[n].next)
      if (b == static_cast<unsigned char>(text[i])) child = k;
    if (child < 0) break;
    n = child;
    const AddedToken* t = nodes_[n].token;
    if (t && (parse_special || !t->special)) best = t;
  }
  return best;
}

BpeModel::~BpeModel() = default;

BpeModel::BpeModel(const std::string& path) {
  TokenizerJson tj = read_tokenizer_json(path);
  const json& j = tj.doc;
  if (!j.contains("model") || !j["model"].is_object()) DIL_FAIL("tokenizer: ", path, ": no model");
  const json& model = j["model"];
  if (model.value("type", "") != "BPE") DIL_FAIL("tokenizer: ", path, ": only BPE models are supported");
  if (!tj.has_vocab) DIL_FAIL("tokenizer: ", path, ": model.vocab missing");
  if (model.contains("byte_fallback") && model["byte_fallback"].is_boolean() && model["byte_fallback"].get<bool>())
    DIL_FAIL("tokenizer: byte_fallback BPE is not supported");
  if (model.value("ignore_merges", false)) DIL_FAIL("tokenizer: ignore_merges BPE is not supported");

  // Normalizer: none or an empty Sequence (DeepSeek); anything else would change the text.
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    const json& n = j["normalizer"];
    if (!(n.value("type", "") == "Sequence" && n.value("normalizers", json::array()).empty()))
      DIL_FAIL("tokenizer: normalizer ", n.dump(), " is not supported");
  }
  // Pre-tokenizer: Split(regex, Isolated) steps followed by ByteLevel without its own regex.
  std::vector<json> steps;
  const json& pt = j.value("pre_tokenizer", json());
  if (pt.is_object() && pt.value("type", "") == "Sequence") {
    for (const auto& s : pt["pretokenizers"]) steps.push_back(s);
  } else if (pt.is_object()) {
    steps.push_back(pt);
  }
  bool byte_level = false;
  for (const auto& s : steps) {
    std::string type = s.value("type", "");
    if (type == "Split") {
      if (byte_level) DIL_FAIL("tokenizer: Split after ByteLevel is not supported");
      if (s.value("behavior", "") != "Isolated" || s.value("invert", false))
        DIL_FAIL("tokenizer: only Split with behavior Isolated, invert false is supported");
      const json& p = s["pattern"];
      std::string re;
      if (p.contains("Regex")) {
        re = p["Regex"].get<std::string>();
      } else if (p.contains("String")) {
        re = "\\Q" + p["String"].get<std::string>() + "\\E";
      } else {
        DIL_FAIL("tokenizer: Split pattern must be Regex or String");
      }
      splits_.push_back(std::make_unique<Regex>(re));
    } else if (type == "ByteLevel") {
      if (s.value("use_regex", true) || s.value("add_prefix_space", false))
        DIL_FAIL("tokenizer: ByteLevel pre-tokenizer with use_regex/add_prefix_space is not supported");
      byte_level = true;
    } else {
      DIL_FAIL("tokenizer: pre-tokenizer ", type, " is not supported");
    }
  }
  if (!byte_level) DIL_FAIL("tokenizer: a ByteLevel pre-tokenizer is required");
  const json& dec = j.value("decoder", json());
  if (!dec.is_object() || dec.value("type", "") != "ByteLevel") DIL_FAIL("tokenizer: only the ByteLevel decoder is supported");

  // Vocabulary.
  int32_t max_id = -1;
  vocab_.reserve(tj.vocab.size() + 2048);
  for (auto& [tok, id] : tj.vocab) {
    if (id < 0) DIL_FAIL("tokenizer: negative id for '", tok, "'");
    vocab_[tok] = id;
    max_id = std::max(max_id, id);
  }
  for (const auto& a : j.value("added_tokens", json::array())) {
    if (a.value("lstrip", false) || a.value("rstrip", false) || a.value("single_word", false))
      DIL_FAIL("tokenizer: added token ", a.dump(), ": lstrip/rstrip/single_word are not supported");
    AddedToken t{a["content"].get<std::string>(), a["id"].get<int32_t>(), a.value("special", false),
                 a.value("normalized", false)};
    if (t.content.empty()) DIL_FAIL("tokenizer: empty added token");
    vocab_[t.content] = t.id;
    max_id = std::max(max_id, t.id);
    added_.push_back(std::move(t));
  }
  tokens_.assign(max_id + 1, "");
  bytes_.assign(max_id + 1, "");
  special_.assign(max_id + 1, 0);
  added_flag_.assign(max_id + 1, 0);
  for (const auto& [tok, id] : vocab_) tokens_[id] = tok;
  for (const auto& a : added_) {
    tokens_[a.id] = a.content;
    special_[a.id] = a.special;
    added_flag_[a.id] = 1;
  }

  // ByteLevel decoding of every token; tokens with a char outside the table keep their UTF-8
  // bytes (HF's ByteLevel decoder does the same).
  uint32_t cp_of[256];
  byte_level_table(cp_of);
  std::unordered_map<uint32_t, uint8_t> byte_of;
  for (int b = 0; b < 256; ++b) byte_of[cp_of[b]] = static_cast<uint8_t>(b);
  for (size_t id = 0; id < tokens_.size(); ++id) {
    const std::string& t = tokens_[id];
    std::string out;
    bool ok = true;
    for (size_t i = 0; i < t.size() && ok;) {
      auto it = byte_of.find(utf8_next(t, i));
      if (it == byte_of.end()) ok = false;
      else out += static_cast<char>(it->second);
    }
    bytes_[id] = ok ? out : t;
  }
  for (int b = 0; b < 256; ++b) {
    std::string s;
    utf8_append(s, cp_of[b]);
    auto it = vocab_.find(s);
    if (it == vocab_.end()) DIL_FAIL("tokenizer: vocabulary lacks the byte token for byte ", b);
    byte_id_[b] = it->second;
  }

  // Merges: "a b" strings (older files) or ["a", "b"] pairs (newer files); rank = position.
  merges_.reserve(tj.merges.size());
  uint64_t rank = 0;
  std::string ab;
  for (const auto& [a, b] : tj.merges) {
    ab.assign(a).append(b);
    auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(ab);
    if (ia == vocab_.end() || ib == vocab_.end() || iab == vocab_.end())
      DIL_FAIL("tokenizer: merge '", a, " ", b, "' uses tokens missing from the vocabulary");
    uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) | static_cast<uint32_t>(ib->second);
    merges_.insert(key, (rank << 32) | static_cast<uint32_t>(iab->second));  // first wins
    ++rank;
  }

  cache_.resize(kCacheSlots);
  for (const auto& a : added_) {
    (a.normalized ? added_norm_ : added_raw_).add(&a);
    added_first_byte_[static_cast<uint8_t>(a.content[0])] = true;
  }
}

int32_t BpeModel::token_to_id(std::string_view tok) const {
  auto it = vocab_.find(std::string(tok));
  return it == vocab_.end() ? -1 : it->second;
}

const std::string& BpeModel::id_to_token(int32_t id) const {
  static const std::string kEmpty;  // immutable
  return id >= 0 && id < (int32_t)tokens_.size() ? tokens_[id] : kEmpty;
}

const std::string& BpeModel::token_bytes(int32_t id) const {
  static const std::string kEmpty;  // immutable
  return id >= 0 && id < (int32_t)bytes_.size() ? bytes_[id] : kEmpty;
}

void BpeModel::split_added(std::string_view text, const AddedTrie& trie, bool parse_special,
                           std::vector<Piece>& pieces) const {
  // Leftmost-longest match, like HF's aho-corasick (MatchKind::LeftmostLongest).
  size_t start = 0, i = 0;
  while (i < text.size()) {
    if (!added_first_byte_[static_cast<uint8_t>(text[i])]) {
      ++i;
      continue;
    }
    const AddedToken* hit = trie.match(text, i, parse_special);
    if (!hit) {
      ++i;
      continue;
    }
    if (i > start) pieces.push_back({start, i, -1});
    pieces.push_back({i, i + hit->content.size(), hit->id});
    i += hit->content.size();
    start = i;
  }
  if (start < text.size()) pieces.push_back({start, text.size(), -1});
}

void BpeModel::pretokenize(std::string_view text, std::vector<std::string_view>& words) const {
  std::vector<std::string_view> cur{text}, next;
  std::vector<std::pair<size_t, size_t>> m;
  for (const auto& re : splits_) {
    next.clear();
    for (std::string_view s : cur) {
      m.clear();
      re->find_all(s, m);
      size_t last = 0;
      for (auto [b, e] : m) {
        if (b > last) next.push_back(s.substr(last, b - last));
        next.push_back(s.substr(b, e - b));
        last = e;
      }
      if (last < s.size()) next.push_back(s.substr(last));
    }
    cur.swap(next);
  }
  words.insert(words.end(), cur.begin(), cur.end());
}

void BpeModel::bpe_word(std::string_view word, std::vector<int32_t>& out) const {
  // [n_symbols] ids of the current segmentation; merged symbols are removed in place.
  std::vector<int32_t> sym(word.size());
  for (size_t i = 0; i < word.size(); ++i) sym[i] = byte_id_[static_cast<uint8_t>(word[i])];
  auto lookup = [&](int32_t a, int32_t b) -> uint64_t {
    return merges_.find((static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b));
  };
  if (sym.size() <= 64) {
    // Short words: repeatedly merge the lowest-rank pair, leftmost first (HF's order).
    while (sym.size() > 1) {
      uint64_t best = UINT64_MAX;
      size_t at = 0;
      for (size_t i = 0; i + 1 < sym.size(); ++i) {
        uint64_t r = lookup(sym[i], sym[i + 1]);
        if ((r >> 32) < (best >> 32)) {
          best = r;
          at = i;
        }
      }
      if (best == UINT64_MAX) break;
      sym[at] = static_cast<int32_t>(best & 0xFFFFFFFFu);
      sym.erase(sym.begin() + at + 1);
    }
    out.insert(out.end(), sym.begin(), sym.end());
    return;
  }
  // Long words: linked list + min-heap of (rank, position), stale entries skipped.
  size_t n = sym.size();
  std::vector<int64_t> prev(n), nxt(n);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int64_t>(i) - 1;
    nxt[i] = i + 1 < n ? static_cast<int64_t>(i + 1) : -1;
  }
  struct Cand {
    uint32_t rank;
    size_t pos;
    int32_t left, right;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](size_t i) {
    if (nxt[i] < 0) return;
    uint64_t r = lookup(sym[i], sym[nxt[i]]);
    if (r != UINT64_MAX) heap.push({static_cast<uint32_t>(r >> 32), i, sym[i], sym[nxt[i]]});
  };
  std::vector<uint8_t> alive(n, 1);
  for (size_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    size_t i = c.pos;
    if (!alive[i] || nxt[i] < 0 || sym[i] != c.left || sym[nxt[i]] != c.right) continue;
    size_t j = static_cast<size_t>(nxt[i]);
    sym[i] = static_cast<int32_t>(lookup(c.left, c.right) & 0xFFFFFFFFu);
    alive[j] = 0;
    nxt[i] = nxt[j];
    if (nxt[j] >= 0) prev[nxt[j]] = static_cast<int64_t>(i);
    if (prev[i] >= 0) push(static_cast<size_t>(prev[i]));
    push(i);
  }
  for (int64_t i = 0; i >= 0; i = nxt[i]) out.push_back(sym[i]);
}

void BpeModel::encode(std::string_view text, bool parse_special, std::vector<int32_t>& out) const {
  // Pass 1: added tokens that are not normalized, on the raw text; pass 2: normalized ones on
  // what is left (the normalizer is empty, so the text is unchanged). HF runs the same passes.
  std::vector<Piece> p1, p2;
  split_added(text, added_raw_, parse_special, p1);
  for (const Piece& p : p1) {
    if (p.added_id >= 0) {
      p2.push_back(p);
      continue;
    }
    std::vector<Piece> sub;
    split_added(text.substr(p.begin, p.end - p.begin), added_norm_, parse_special, sub);
    for (Piece s : sub) p2.push_back({s.begin + p.begin, s.end + p.begin, s.added_id});
  }
  std::vector<std::string_view> words;
  for (const Piece& p : p2) {
    if (p.added_id >= 0) {
      out.push_back(p.added_id);
      continue;
    }
    words.clear();
    pretokenize(text.substr(p.begin, p.end - p.begin), words);
    for (std::string_view w : words) {
      if (w.size() > kMaxCachedWord || w.size() < kMinCachedWord) {
        bpe_word(w, out);
        continue;
      }
      const size_t slot = std::hash<std::string_view>{}(w) & (kCacheSlots - 1);
      {
        std::lock_guard<std::mutex> lk(cache_mu_);
        const CacheSlot& c = cache_[slot];
        if (c.word == w) {
          out.insert(out.end(), c.ids.begin(), c.ids.end());
          continue;
        }
      }
      size_t before = out.size();
      bpe_word(w, out);
      std::lock_guard<std::mutex> lk(cache_mu_);
      CacheSlot& c = cache_[slot];
      c.word.assign(w);
      c.ids.assign(out.begin() + before, out.end());
    }
  }
}

}  // namespace dil::tok
