// Engram hashing (model-spec §4.5) against data produced by HF41's own functions and numpy
// (tests/data/v41-engram/README.md says how): the compressed-token maps of two tokenizers, the
// numpy Generator draws behind the multipliers, the primes' self-check, and the hash rows.
#include <gtest/gtest.h>

#include <cstring>

#include "core/check.h"
#include "core/safetensors.h"
#include "model/config.h"
#include "model/engram_hash.h"
#include "model/numpy_rng.h"

using namespace dil;

namespace {

const char* kRef = "tests/data/v41-engram/engram_reference.safetensors";

template <typename T>
std::vector<T> read(const SafeTensors& st, const std::string& name) {
  const StEntry& e = st.at(name);
  std::vector<T> v(e.nbytes / sizeof(T));
  std::memcpy(v.data(), e.data, e.nbytes);
  return v;
}

void expect_map_equal(const CompressedTokenMap& m, const std::vector<int32_t>& want, const char* what) {
  ASSERT_EQ(m.cls.size(), want.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (m.cls[i] != want[i] && bad++ < 5) ADD_FAILURE() << what << ": id " << i << " class " << m.cls[i] << " != " << want[i];
  EXPECT_EQ(bad, 0u) << what;
}

}  // namespace

TEST(EngramMap, FixtureTokenizerEqualsHf) {
  ModelConfig cfg = load_config("tests/data/v41-tiny/config.json");
  SafeTensors st = SafeTensors::open(kRef);
  CompressedTokenMap m = build_compressed_token_map("tests/data/v41-tiny/tokenizer.json");
  EXPECT_EQ(m.n_classes, cfg.engram_compressed_vocab);  // 898
  expect_map_equal(m, read<int32_t>(st, "token_map.v41_tiny"), "v41-tiny");
}

TEST(EngramMap, DeepSeekV3TokenizerEqualsHf) {
  SafeTensors st = SafeTensors::open(kRef);
  CompressedTokenMap m = build_compressed_token_map("tests/data/deepseek-v3-tokenizer/tokenizer.json");
  std::vector<int32_t> want = read<int32_t>(st, "token_map.deepseek_v3");
  int32_t n = 0;
  for (int32_t c : want) n = std::max(n, c + 1);
  EXPECT_EQ(m.n_classes, n);  // 98627 classes over 128815 ids
  expect_map_equal(m, want, "deepseek-v3");
}

TEST(EngramMap, Normalizer) {
  // The rules one by one (HF41's normalizer sequence).
  EXPECT_EQ(engram_normalize("\xC4\xA0The"), "gthe");               // U+0120: NFD G + dot above, mark stripped
  EXPECT_EQ(engram_normalize(" The"), "the");                        // strip
  EXPECT_EQ(engram_normalize(" "), " ");                             // a lone space survives
  EXPECT_EQ(engram_normalize("\t\n"), " ");                          // collapses to one space, kept
  EXPECT_EQ(engram_normalize("a \t\r\nb"), "a b");
  EXPECT_EQ(engram_normalize("Caf\xC3\xA9"), "cafe");                // accent stripped
  EXPECT_EQ(engram_normalize("\xEF\xBC\xA1"), "a");                  // fullwidth A: NFKC
  EXPECT_EQ(engram_normalize("\xEF\xAC\x81"), "fi");                 // ligature: NFKC
  EXPECT_EQ(engram_normalize("\xE0\xA4\x95\xE0\xA4\xBE"), "\xE0\xA4\x95");  // Devanagari vowel sign (Mc) dropped
  EXPECT_EQ(engram_normalize(""), "");
}

TEST(EngramRng, PcgRawMatchesNumpy) {
  SafeTensors st = SafeTensors::open(kRef);
  std::vector<int64_t> seeds = read<int64_t>(st, "pcg64_raw.seeds");
  std::vector<int64_t> raw = read<int64_t>(st, "pcg64_raw");
  const size_t per = raw.size() / seeds.size();
  for (size_t s = 0; s < seeds.size(); ++s) {
    NumpyPcg64 g(uint64_t(seeds[s]));
    for (size_t i = 0; i < per; ++i) EXPECT_EQ(int64_t(g.next64()), raw[s * per + i]) << "seed " << seeds[s] << " draw " << i;
  }
}

TEST(EngramRng, MultipliersMatchNumpy) {
  SafeTensors st = SafeTensors::open(kRef);
  std::vector<int64_t> m = read<int64_t>(st, "multipliers");  // rows: layer, n_classes, mult[4]
  ASSERT_EQ(m.size() % 6, 0u);
  for (size_t r = 0; r < m.size() / 6; ++r) {
    const int64_t* row = &m[r * 6];
    std::vector<int64_t> got = engram_multipliers(int(row[0]), 4, row[1]);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got[size_t(i)], row[2 + i]) << "layer " << row[0] << " classes " << row[1];
  }
}

TEST(EngramPrimes, SumsEqualNumEmbeddings) {
  // Fixture: 4328 / 4554; released V4.1-Flash: 384,006,168 / 384,016,682.
  for (const char* path : {"tests/data/v41-tiny/config.json", "configs/deepseek-v4.1-flash.json"}) {
    ModelConfig cfg = load_config(path);
    auto primes = engram_primes(cfg);
    ASSERT_EQ(primes.size(), cfg.engram_layers.size()) << path;
    std::vector<int64_t> all;
    for (size_t l = 0; l < primes.size(); ++l) {
      ASSERT_EQ(primes[l].size(), size_t((cfg.engram_max_ngram - 1) * cfg.engram_heads));
      int64_t sum = 0;
      for (int64_t p : primes[l]) {
        EXPECT_GT(p, cfg.engram_vocab_size - 1);
        for (int64_t q : all) EXPECT_NE(p, q) << "prime reused";
        all.push_back(p);
        sum += p;
      }
      EXPECT_EQ(sum, cfg.engram_num_embeddings[l]) << path << " layer " << cfg.engram_layers[l];
    }
  }
  SafeTensors st = SafeTensors::open(kRef);
  std::vector<int64_t> want = read<int64_t>(st, "hash.primes");
  auto got = engram_primes(load_config("tests/data/v41-tiny/config.json"));
  std::vector<int64_t> flat;
  for (auto& r : got) flat.insert(flat.end(), r.begin(), r.end());
  EXPECT_EQ(flat, want);
}

TEST(EngramHashRows, MatchHfAtEveryPositionAndAcrossChunks) {
  ModelConfig cfg = load_config("tests/data/v41-tiny/config.json");
  EngramHash e = make_engram_hash(cfg, build_compressed_token_map("tests/data/v41-tiny/tokenizer.json"));
  SafeTensors st = SafeTensors::open(kRef);
  std::vector<int32_t> ids = read<int32_t>(st, "hash.input_ids");
  std::vector<uint8_t> dead = read<uint8_t>(st, "hash.dead");
  const int64_t S = int64_t(ids.size()), L = int64_t(cfg.engram_layers.size()), C = e.cols();
  for (const char* which : {"hash.rows", "hash.rows_dead"}) {
    const bool with_dead = std::strcmp(which, "hash.rows_dead") == 0;
    std::vector<int64_t> want = read<int64_t>(st, which);  // [S, L, C]
    ASSERT_EQ(int64_t(want.size()), S * L * C);
    for (int li = 0; li < L; ++li) {
      // One call over the whole prompt, then chunks of 1, 2 and 57 tokens with their history.
      for (int64_t chunk : {S, int64_t(1), int64_t(2), int64_t(57)}) {
        std::vector<int64_t> got(size_t(S * C));
        for (int64_t p0 = 0; p0 < S; p0 += chunk) {
          const int64_t n = std::min(chunk, S - p0), h = std::min<int64_t>(p0, e.max_ngram - 1);
          engram_rows(e, li, ids.data() + p0 - h, with_dead ? dead.data() + p0 - h : nullptr, p0, n,
                      got.data() + p0 * C);
        }
        for (int64_t t = 0; t < S; ++t)
          for (int64_t j = 0; j < C; ++j)
            ASSERT_EQ(got[size_t(t * C + j)], want[size_t((t * L + li) * C + j)])
                << which << " layer " << li << " chunk " << chunk << " pos " << t << " col " << j;
      }
    }
  }
}

TEST(EngramHash, ConfigMismatchIsAnError) {
  ModelConfig cfg = load_config("tests/data/v41-tiny/config.json");
  CompressedTokenMap m = build_compressed_token_map("tests/data/v41-tiny/tokenizer.json");
  ModelConfig bad = cfg;
  bad.engram_compressed_vocab += 1;
  EXPECT_THROW(make_engram_hash(bad, m), Error);
  bad = cfg;
  bad.engram_num_embeddings[1] += 2;
  EXPECT_THROW(make_engram_hash(bad, m), Error);
}
