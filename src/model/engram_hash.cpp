#include "model/engram_hash.h"

#include <utf8proc.h>

#include <array>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/check.h"
#include "model/numpy_rng.h"

namespace dil {

namespace {

// GPT-2 byte <-> unicode table: printable Latin-1 bytes map to themselves, the other 68
// bytes to U+0100.. in byte order.
std::unordered_map<int32_t, uint8_t> char_to_byte() {
  std::unordered_map<int32_t, uint8_t> m;
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    m[keep ? b : next++] = uint8_t(b);
  }
  return m;
}

// Decodes UTF-8 strictly (no overlongs, no surrogates, <= U+10FFFF), as Rust's from_utf8
// does. Returns false on any invalid sequence.
bool decode_utf8(const std::string& s, std::vector<int32_t>* cps) {
  cps->clear();
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const uint8_t c = p[i];
    int len;
    int32_t cp, min;
    if (c < 0x80) { cps->push_back(c); ++i; continue; }
    if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; min = 0x800; }
    else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; min = 0x10000; }
    else return false;
    if (i + len > n) return false;
    for (int k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    cps->push_back(cp);
    i += len;
  }
  return true;
}

void append_utf8(std::string* out, int32_t cp) {
  uint8_t buf[4];
  const utf8proc_ssize_t k = utf8proc_encode_char(cp, buf);
  out->append(reinterpret_cast<char*>(buf), size_t(k));
}

std::string unicode_normalize(const std::string& s, utf8proc_option_t opts) {
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t r = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                          utf8proc_ssize_t(s.size()), &out, utf8proc_option_t(opts));
  DIL_CHECK(r >= 0, "utf8proc_map failed: ", utf8proc_errmsg(r));
  std::string res(reinterpret_cast<char*>(out), size_t(r));
  std::free(out);
  return res;
}

// Rust's char::is_whitespace (Unicode White_Space), what the Strip normalizer trims.
bool is_white_space(int32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

bool is_prime(int64_t v) {
  if (v < 2) return false;
  if (v % 2 == 0) return v == 2;
  for (int64_t d = 3; d * d <= v; d += 2)
    if (v % d == 0) return false;
  return true;
}

}  // namespace

std::string engram_normalize(const std::string& text) {
  // NFKC then NFD (as two passes: the tokenizers normalizers run in sequence).
  const std::string nfkc = unicode_normalize(text, utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT));
  const std::string nfd = unicode_normalize(nfkc, utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE));
  std::vector<int32_t> cps;
  DIL_CHECK(decode_utf8(nfd, &cps), "normalizer produced invalid UTF-8");
  // StripAccents drops every mark (Mn, Mc, Me); Lowercase; then runs of [ \t\r\n] -> " ".
  std::vector<int32_t> v;
  v.reserve(cps.size());
  for (int32_t c : cps) {
    const utf8proc_category_t cat = utf8proc_category(c);
    if (cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC || cat == UTF8PROC_CATEGORY_ME) continue;
    c = utf8proc_tolower(c);
    const bool ws = c == ' ' || c == '\t' || c == '\r' || c == '\n';
    v.push_back(ws ? -1 : c);  // -1 marks a collapsible whitespace char
  }
  std::vector<int32_t> w;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] == -1) {
      if (i > 0 && v[i - 1] == -1) continue;
      w.push_back(' ');
    } else {
      w.push_back(v[i]);
    }
  }
  // A string that is exactly one space is kept as is (the sentinel trick); else strip.
  if (w.size() == 1 && w[0] == ' ') return " ";
  size_t b = 0, e = w.size();
  while (b < e && is_white_space(w[b])) ++b;
  while (e > b && is_white_space(w[e - 1])) --e;
  std::string out;
  for (size_t i = b; i < e; ++i) append_utf8(&out, w[i]);
  return out;
}

CompressedTokenMap build_compressed_token_map(const std::string& path) {
  std::ifstream in(path);
  if (!in) DIL_FAIL("cannot read ", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& ex) {
    DIL_FAIL(path, ": invalid JSON: ", ex.what());
  }
  if (!j.contains("decoder") || !j["decoder"].is_object() || j["decoder"].value("type", "") != "ByteLevel")
    DIL_FAIL(path, ": Engram's token map needs a ByteLevel decoder");
  // id -> token string; added tokens take precedence (as in tokenizers' decode).
  std::unordered_map<int64_t, std::string> id_tok;
  std::unordered_map<std::string, int64_t> distinct;  // the tokenizer's size counts distinct strings
  for (auto& [tok, id] : j.at("model").at("vocab").items()) {
    id_tok.emplace(id.get<int64_t>(), tok);
    distinct.emplace(tok, id.get<int64_t>());
  }
  for (const auto& a : j.value("added_tokens", nlohmann::json::array())) {
    const int64_t id = a.at("id").get<int64_t>();
    id_tok[id] = a.at("content").get<std::string>();
    distinct[a.at("content").get<std::string>()] = id;
  }
  const auto c2b = char_to_byte();
  CompressedTokenMap m;
  const int64_t n = int64_t(distinct.size());
  m.cls.resize(size_t(n));
  std::unordered_map<std::string, int32_t> key_to_cls;
  std::vector<int32_t> cps;
  for (int64_t id = 0; id < n; ++id) {
    auto it = id_tok.find(id);
    const std::string tok = it == id_tok.end() ? std::string() : it->second;
    // ByteLevel decoder: every char through the byte table, or the raw UTF-8 when any char
    // is outside it (special tokens); then lossy UTF-8.
    std::string bytes;
    bool mapped = decode_utf8(tok, &cps);
    if (mapped) {
      for (int32_t c : cps) {
        auto b = c2b.find(c);
        if (b == c2b.end()) { mapped = false; break; }
        bytes.push_back(char(b->second));
      }
    }
    if (!mapped) bytes = tok;
    std::string key;
    bool has_fffd = !decode_utf8(bytes, &cps);
    for (int32_t c : cps) has_fffd |= c == 0xFFFD;
    if (has_fffd) {
      key = tok;
    } else {
      key = engram_normalize(bytes);
      if (key.empty()) key = bytes;
    }
    auto [kit, added] = key_to_cls.emplace(key, int32_t(key_to_cls.size()));
    m.cls[size_t(id)] = kit->second;
  }
  m.n_classes = int32_t(key_to_cls.size());
  return m;
}

std::vector<std::vector<int64_t>> engram_primes(const ModelConfig& cfg) {
  std::vector<std::vector<int64_t>> out;
  std::vector<int64_t> seen;
  auto used = [&](int64_t v) {
    for (int64_t s : seen)
      if (s == v) return true;
    return false;
  };
  for (size_t l = 0; l < cfg.engram_layers.size(); ++l) {
    std::vector<int64_t> row;
    for (int ng = 0; ng < cfg.engram_max_ngram - 1; ++ng) {
      int64_t cur = cfg.engram_vocab_size - 1;
      for (int h = 0; h < cfg.engram_heads; ++h) {
        int64_t c = cur + 1;
        while (!is_prime(c) || used(c)) ++c;
        cur = c;
        seen.push_back(c);
        row.push_back(c);
      }
    }
    out.push_back(std::move(row));
  }
  return out;
}

std::vector<int64_t> engram_multipliers(int layer_id, int max_ngram, int64_t n_classes) {
  const int64_t bound = std::max<int64_t>(1, (INT64_MAX / n_classes) / 2);
  NumpyPcg64 rng(uint64_t(10007) * uint64_t(layer_id));
  std::vector<int64_t> v = rng.integers(bound, max_ngram);
  for (int64_t& x : v) x = 2 * x + 1;
  return v;
}

EngramHash make_engram_hash(const ModelConfig& cfg, const CompressedTokenMap& map) {
  if (map.n_classes != cfg.engram_compressed_vocab)
    DIL_FAIL("Engram: the tokenizer gives ", map.n_classes, " compressed token classes but the config's "
             "engram_compressed_vocab_size is ", cfg.engram_compressed_vocab, "; the hashes would not match training");
  if (cfg.engram_pad_id < 0 || cfg.engram_pad_id >= int32_t(map.cls.size()))
    DIL_FAIL("Engram: engram_pad_token_id ", cfg.engram_pad_id, " is outside the tokenizer");
  EngramHash e;
  e.max_ngram = cfg.engram_max_ngram;
  e.n_heads = cfg.engram_heads;
  e.token_class = map.cls;
  e.pad_class = map.cls[size_t(cfg.engram_pad_id)];
  e.primes = engram_primes(cfg);
  for (size_t l = 0; l < cfg.engram_layers.size(); ++l) {
    std::vector<int64_t> off;
    int64_t total = 0;
    for (int64_t p : e.primes[l]) {
      off.push_back(total);
      total += p;
    }
    if (total != cfg.engram_num_embeddings[l])
      DIL_FAIL("Engram layer ", cfg.engram_layers[l], ": the primes sum to ", total,
               " but engram_num_embeddings says ", cfg.engram_num_embeddings[l]);
    e.offsets.push_back(std::move(off));
    e.multipliers.push_back(engram_multipliers(cfg.engram_layers[l], e.max_ngram, map.n_classes));
  }
  return e;
}

void engram_rows(const EngramHash& e, int li, const int32_t* ids, const uint8_t* dead, int64_t p0, int64_t n,
                 int64_t* rows) {
  const int64_t h = std::min<int64_t>(p0, e.max_ngram - 1);
  const std::vector<int64_t>& mult = e.multipliers[size_t(li)];
  const std::vector<int64_t>& primes = e.primes[size_t(li)];
  const std::vector<int64_t>& off = e.offsets[size_t(li)];
  const int cols = e.cols();
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = p0 + t, idx = h + t;  // idx: index into ids
    // Look-back i uses token pos-i unless the sequence start or a dead token was reached at
    // any shift <= i (so an n-gram never spans one): then the pad class.
    bool blocked = false;
    uint64_t rolling = 0;
    for (int i = 0; i < e.max_ngram; ++i) {
      blocked = blocked || pos < i || (dead && dead[idx - i]);
      int64_t c = e.pad_class;
      if (!blocked) {
        const int32_t id = ids[idx - i];
        DIL_CHECK(id >= 0 && id < int32_t(e.token_class.size()), "token id ", id, " outside the tokenizer");
        c = e.token_class[size_t(id)];
      }
      const uint64_t prod = uint64_t(c) * uint64_t(mult[size_t(i)]);  // < 2^63 by the bound
      rolling = i == 0 ? prod : (rolling ^ prod);
      if (i == 0) continue;
      for (int k = 0; k < e.n_heads; ++k) {
        const int j = (i - 1) * e.n_heads + k;
        rows[t * cols + j] = int64_t(rolling % uint64_t(primes[size_t(j)])) + off[size_t(j)];
      }
    }
  }
}

}  // namespace dil
