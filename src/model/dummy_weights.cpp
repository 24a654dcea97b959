#include "model/dummy_weights.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <thread>

#include "model/schema.h"

namespace dil {

namespace {

constexpr int kDistinctExperts = 8;

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// 65536 standard normal deviates (Box-Muller), the source of every lookup table below.
std::vector<float> normal_table(uint64_t seed) {
  std::vector<float> t(65536);
  for (size_t i = 0; i < t.size(); i += 2) {
    double u1 = (double(splitmix(seed) >> 11) + 0.5) / 9007199254740992.0;
    double u2 = double(splitmix(seed) >> 11) / 9007199254740992.0;
    double r = std::sqrt(-2 * std::log(u1));
    t[i] = float(r * std::cos(2 * M_PI * u2));
    t[i + 1] = float(r * std::sin(2 * M_PI * u2));
  }
  return t;
}

// Fills `n` elements with `make(rand16)` using every hardware thread.
template <typename T>
void parallel_fill(T* dst, size_t n, uint64_t seed, const std::function<T(uint32_t)>& make) {
  const size_t threads = std::max<size_t>(1, std::min<size_t>(std::thread::hardware_concurrency(), n / (1 << 20) + 1));
  std::vector<std::thread> pool;
  for (size_t k = 0; k < threads; ++k) {
    pool.emplace_back([=, &make] {
      uint64_t s = seed ^ (0x51ed270b27d4a5c3ull * (k + 1));
      size_t lo = n * k / threads, hi = n * (k + 1) / threads;
      for (size_t i = lo; i < hi;) {
        uint64_t r = splitmix(s);
        for (int j = 0; j < 4 && i < hi; ++j, ++i) dst[i] = make(uint32_t((r >> (16 * j)) & 0xffff));
      }
    });
  }
  for (auto& t : pool) t.join();
}

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

bool wanted(const std::string& name, const std::vector<int>& layers) {
  if (name.rfind("mtp.", 0) == 0) return true;  // listed only when asked for (with_mtp)
  if (name.rfind("layers.", 0) != 0 || layers.empty()) return true;
  int L = std::stoi(name.substr(7));
  return std::find(layers.begin(), layers.end(), L) != layers.end();
}

// "layers.L.ffn.experts.E.*" or "mtp.M.ffn.experts.E.*": E, else -1.
int expert_of(const std::string& name) {
  const std::string key = ".ffn.experts.";
  size_t p = name.find(key);
  if ((name.rfind("layers.", 0) != 0 && name.rfind("mtp.", 0) != 0) || p == std::string::npos) return -1;
  return std::stoi(name.substr(p + key.size()));
}

}  // namespace

SafeTensors make_dummy_checkpoint(const ModelConfig& cfg, const std::vector<int>& layers, uint64_t seed, int expert_lo,
                                  int expert_hi, bool with_mtp) {
  // The drafter blocks come after the backbone: the backbone's values do not depend on them.
  std::vector<TensorSpec> specs = expected_tensors(cfg, with_mtp);
  std::map<std::string, const TensorSpec*> by_name;
  for (const auto& s : specs) by_name[s.name] = &s;
  const std::vector<float> normal = normal_table(seed);
  // Code tables: FP8 e4m3 of N(0,1); FP4 e2m1 nibble pairs of N(0,1.5).
  std::vector<uint8_t> fp8(65536), fp4(65536);
  for (size_t i = 0; i < 65536; ++i) {
    fp8[i] = f32_to_e4m3(normal[i]);
    uint8_t lo = f32_to_e2m1(std::clamp(1.5f * normal[i], -6.f, 6.f));
    uint8_t hi = f32_to_e2m1(std::clamp(1.5f * normal[(i * 7919 + 1) & 0xffff], -6.f, 6.f));
    fp4[i] = uint8_t(lo | (hi << 4));
  }
  SafeTensors st;
  uint64_t tseed = seed;
  for (const TensorSpec& s : specs) {
    if (!wanted(s.name, layers)) continue;
    const uint64_t ts = splitmix(tseed);  // drawn for every tensor: values do not depend on the filters below
    const int e = expert_of(s.name);
    if (e >= 0 && (e < expert_lo || (expert_hi >= 0 && e >= expert_hi))) continue;
    // Routed experts beyond the first kDistinctExperts of this rank's shard share the host
    // bytes of expert lo + (e - lo) % kDistinctExperts: a full V4-Flash shard is ~70 GB of
    // experts that would otherwise be generated and held on the host. The backend still
    // gets one copy per expert (adopt_weight), so the GPU reads as many distinct bytes.
    if (e >= expert_lo + kDistinctExperts) {
      const int src_e = expert_lo + (e - expert_lo) % kDistinctExperts;
      const std::string key = ".ffn.experts." + std::to_string(e) + ".";
      std::string src = s.name;
      src.replace(src.find(key), key.size(), ".ffn.experts." + std::to_string(src_e) + ".");
      const StEntry* se = st.find(src);
      DIL_CHECK(se != nullptr, "dummy weights: ", src, " not generated before ", s.name);
      st.add_owned(s.name, s.dtype, s.shape,
                   Buffer(const_cast<uint8_t*>(se->data), s.nbytes(), Device::CPU, [](void*) {}));
      continue;
    }
    const size_t n = size_t(std::max<int64_t>(1, [&] { int64_t k = 1; for (auto d : s.shape) k *= d; return k; }()));
    Buffer buf = host_alloc(s.nbytes());
    const int64_t in = s.shape.size() == 2 ? s.shape[1] : 1;
    switch (s.dtype) {
      case DType::F8E4M3:
        parallel_fill<uint8_t>(static_cast<uint8_t*>(buf.data()), n, ts, [&](uint32_t r) { return fp8[r]; });
        break;
      case DType::I8:
        parallel_fill<uint8_t>(static_cast<uint8_t*>(buf.data()), n, ts, [&](uint32_t r) { return fp4[r]; });
        break;
      case DType::E8M0: {
        // Scale so that dequantized weights have std ~ 1/sqrt(in) of the matrix they scale.
        std::string wname = s.name.substr(0, s.name.size() - 6) + ".weight";
        auto it = by_name.find(wname);
        int64_t win = it != by_name.end() ? it->second->shape[1] * (it->second->dtype == DType::I8 ? 2 : 1) : 1;
        double code_std = it != by_name.end() && it->second->dtype == DType::I8 ? 1.7 : 1.0;
        int e = int(std::lround(std::log2(1.0 / (std::sqrt(double(win)) * code_std))));
        uint8_t b = uint8_t(std::clamp(127 + e, 1, 254));
        // +-1 jitter keeps blocks distinct without changing magnitudes much.
        parallel_fill<uint8_t>(static_cast<uint8_t*>(buf.data()), n, ts,
                               [b](uint32_t r) { return uint8_t(b + int(r % 3) - 1); });
        break;
      }
      case DType::BF16: {
        float mean = 0, std = float(1.0 / std::sqrt(double(in)));
        if (s.shape.size() == 1) { mean = 1.0f; std = 0.05f; }   // norm weights
        if (s.name == "embed.weight") std = 1.0f;
        std::vector<uint16_t> t(65536);
        for (size_t i = 0; i < t.size(); ++i) t[i] = f32_to_bf16(mean + std * normal[i]);
        parallel_fill<uint16_t>(static_cast<uint16_t*>(buf.data()), n, ts, [&](uint32_t r) { return t[r]; });
        break;
      }
      case DType::F32: {
        float mean = 0, std = 0.1f;
        if (ends_with(s.name, "_fn")) std = float(1.0 / std::sqrt(double(in)));
        if (ends_with(s.name, "_scale")) { mean = 0.1f; std = 0.01f; }
        if (ends_with(s.name, "attn_sink")) std = 1.0f;
        if (ends_with(s.name, "bias") || ends_with(s.name, "bias_vl")) std = 0.01f;
        std::vector<float> t(65536);
        for (size_t i = 0; i < t.size(); ++i) t[i] = mean + std * normal[i];
        parallel_fill<float>(static_cast<float*>(buf.data()), n, ts, [&](uint32_t r) { return t[r]; });
        break;
      }
      case DType::I64: {  // tid2eid: k distinct experts per token
        int64_t* p = static_cast<int64_t*>(buf.data());
        const int64_t rows = s.shape[0], k = s.shape[1];
        uint64_t r = ts;
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < k; ++j) {
            int64_t e;
            bool dup;
            do {
              e = int64_t(splitmix(r) % uint64_t(cfg.n_routed));
              dup = false;
              for (int64_t q = 0; q < j; ++q) dup |= p[i * k + q] == e;
            } while (dup);
            p[i * k + j] = e;
          }
        break;
      }
      default:
        DIL_FAIL("dummy weights: no generator for dtype ", dtype_name(s.dtype), " (", s.name, ")");
    }
    st.add_owned(s.name, s.dtype, s.shape, std::move(buf));
  }
  return st;
}

}  // namespace dil
