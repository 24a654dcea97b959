// The loader's schema against the real V4-Flash config (model-spec §2.2) and the fixture;
// corrupted checkpoints give clear errors naming the tensor.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "model/model.h"
#include "model/rope.h"
#include "model/schema.h"

using namespace dil;
namespace fs = std::filesystem;

static const std::string kSrc = DIL_SOURCE_DIR;
static const std::string kV4Tiny = kSrc + "/tests/data/v4-tiny";

TEST(Schema, RealV4FlashInventory) {
  ModelConfig c = load_config(kSrc + "/configs/deepseek-v4-flash.json");
  EXPECT_EQ(c.n_layers, 43);
  EXPECT_EQ(c.n_mtp, 1);
  auto specs = expected_tensors(c, true);
  size_t bytes = 0;
  for (const auto& s : specs) bytes += s.nbytes();
  EXPECT_EQ(specs.size(), 69187u);
  EXPECT_EQ(bytes, 159609485896ull);
}

TEST(Schema, YarnRangeOfV4Flash) {
  ModelConfig c = load_config(kSrc + "/configs/deepseek-v4-flash.json");
  YarnRange r = yarn_range(c.rope_dims, c.compress_rope_theta, c.beta_fast, c.beta_slow, double(c.original_seq_len));
  EXPECT_EQ(r.low, 15);
  EXPECT_EQ(r.high, 25);
  // Frequencies below `low` are unchanged, above `high` divided by the factor 16.
  std::vector<float> plain(32), yarn = rope_inv_freq(c, true);
  for (int i = 0; i < 32; ++i) plain[size_t(i)] = 1.0f / std::pow(160000.0f, float(2 * i) / 64.0f);
  for (int i = 0; i <= 15; ++i) EXPECT_FLOAT_EQ(yarn[size_t(i)], plain[size_t(i)]) << i;
  for (int i = 25; i < 32; ++i) EXPECT_FLOAT_EQ(yarn[size_t(i)], plain[size_t(i)] / 16.0f) << i;
  for (int i = 16; i < 25; ++i) {
    EXPECT_LT(yarn[size_t(i)], plain[size_t(i)]);
    EXPECT_GT(yarn[size_t(i)], plain[size_t(i)] / 16.0f);
  }
}

TEST(Schema, FixtureValidates) {
  ModelConfig c = load_config(kV4Tiny + "/config.json");
  SafeTensors st = SafeTensors::open(kV4Tiny);
  ValidationReport r = validate_checkpoint(st, expected_tensors(c, false));
  for (const auto& e : r.errors) ADD_FAILURE() << e;
  EXPECT_EQ(r.n_tensors, 417u);
}

// ---- corrupted checkpoints ---------------------------------------------------------------

namespace {

struct RawSt {
  nlohmann::json header;
  std::string data;
};

RawSt read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n;
  std::memcpy(&n, all.data(), 8);
  return {nlohmann::json::parse(all.substr(8, n)), all.substr(8 + n)};
}

void write_raw(const std::string& path, const RawSt& r, size_t truncate_data_to = std::string::npos) {
  std::string h = r.header.dump();
  uint64_t n = h.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(h.data(), std::streamsize(h.size()));
  std::string d = truncate_data_to == std::string::npos ? r.data : r.data.substr(0, truncate_data_to);
  out.write(d.data(), std::streamsize(d.size()));
}

// A copy of the fixture in a fresh folder, with the checkpoint edited by `edit`.
std::string corrupted_copy(const std::string& tag, const std::function<void(RawSt&, size_t&)>& edit) {
  fs::path dir = fs::temp_directory_path() / ("dil-corrupt-" + tag + "-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(kV4Tiny + "/config.json", dir / "config.json", fs::copy_options::overwrite_existing);
  RawSt r = read_raw(kV4Tiny + "/model.safetensors");
  size_t trunc = std::string::npos;
  edit(r, trunc);
  write_raw((dir / "model.safetensors").string(), r, trunc);
  return dir.string();
}

std::string load_error(const std::string& dir) {
  auto be = make_backend(BackendKind::CPU);
  try {
    load_model(dir, *be, ModelOptions{});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Corrupt, TruncatedFileNamesTheTensor) {
  std::string victim;
  std::string dir = corrupted_copy("trunc", [&](RawSt& r, size_t& trunc) {
    // cut the data section in the middle of the last tensor
    size_t last_end = 0;
    for (auto& [k, v] : r.header.items()) {
      if (k == "__metadata__") continue;
      size_t e = v["data_offsets"][1];
      if (e > last_end) { last_end = e; victim = k; }
    }
    trunc = last_end - 10;
  });
  std::string err = load_error(dir);
  EXPECT_NE(err.find(victim), std::string::npos) << err;
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
}

TEST(Corrupt, WrongDtypeNamesTheTensor) {
  std::string dir = corrupted_copy("dtype", [](RawSt& r, size_t&) {
    // attn_sink is F32 [4]: relabel it I32 (same byte count, wrong type)
    r.header["layers.2.attn.attn_sink"]["dtype"] = "I32";
  });
  std::string err = load_error(dir);
  EXPECT_NE(err.find("layers.2.attn.attn_sink"), std::string::npos) << err;
  EXPECT_NE(err.find("dtype I32, expected F32"), std::string::npos) << err;
}

TEST(Corrupt, MissingTensorIsNamed) {
  std::string dir = corrupted_copy("missing", [](RawSt& r, size_t&) { r.header.erase("layers.3.attn.compressor.ape"); });
  std::string err = load_error(dir);
  EXPECT_NE(err.find("missing tensor layers.3.attn.compressor.ape"), std::string::npos) << err;
}

TEST(Corrupt, ConfigTensorMismatchIsNamed) {
  std::string dir = corrupted_copy("mismatch", [](RawSt&, size_t&) {});
  // Claim more experts than the checkpoint holds: every layer misses experts 8.. and the
  // router shape disagrees.
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
  cfg["n_routed_experts"] = 16;
  std::ofstream(dir + "/config.json") << cfg.dump();
  std::string err = load_error(dir);
  EXPECT_NE(err.find("layers.0.ffn.gate.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("expected [16,256]"), std::string::npos) << err;
  EXPECT_NE(err.find("missing tensor layers.0.ffn.experts.8.w1.weight"), std::string::npos) << err;
}

TEST(Corrupt, UnexpectedTensorIsNamed) {
  std::string dir = corrupted_copy("extra", [](RawSt& r, size_t&) {
    // a well-formed extra tensor with its own 16 bytes at the end of the data section
    size_t end = r.data.size();
    r.data += std::string(16, '\x01');
    r.header["layers.9.attn.bogus"] = {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {end, end + 16}}};
  });
  std::string err = load_error(dir);
  EXPECT_NE(err.find("unexpected tensor layers.9.attn.bogus"), std::string::npos) << err;
}

TEST(Corrupt, HeaderLongerThanFile) {
  fs::path dir = fs::temp_directory_path() / ("dil-corrupt-hdr-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(kV4Tiny + "/config.json", dir / "config.json", fs::copy_options::overwrite_existing);
  std::ofstream out(dir / "model.safetensors", std::ios::binary);
  uint64_t n = 1 << 20;
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << "{}";
  out.close();
  std::string err = load_error(dir.string());
  EXPECT_NE(err.find("header length"), std::string::npos) << err;
}
