// A TokenConstraint for engine tests: a tiny "grammar" whose every decision is checkable.
#pragma once
#include <gtest/gtest.h>

#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "dil/engine.h"

namespace dil::testing {

// Tokens must alternate: an even id, then an odd id >= 3, ... `length` of them; then the output
// is complete and nothing more may follow. Records what the engine asked.
template <int kVocab>
class AlternatingConstraint final : public TokenConstraint {
 public:
  explicit AlternatingConstraint(int length, bool stuck_at_end = false) : length_(length), stuck_(stuck_at_end) {}
  void fill_mask(std::span<uint64_t> mask, int remaining) override {
    std::lock_guard<std::mutex> lk(mu_);
    threads_.insert(std::this_thread::get_id());
    remaining_.push_back(remaining);
    EXPECT_EQ(mask.size(), size_t((kVocab + 63) / 64));
    for (uint64_t w : mask) EXPECT_EQ(w, 0u);  // zeroed
    if (int(seen_.size()) >= length_) return;
    for (int t = (seen_.size() % 2 ? 3 : 2); t < kVocab; t += 2) mask[size_t(t) / 64] |= uint64_t(1) << (t % 64);
  }
  void advance(int32_t token) override {
    std::lock_guard<std::mutex> lk(mu_);
    seen_.push_back(token);
  }
  bool accepting() const override { return !stuck_ && int(seen_.size()) >= length_; }

  std::mutex mu_;
  std::set<std::thread::id> threads_;
  std::vector<int> remaining_;
  std::vector<int32_t> seen_;

 private:
  int length_;
  bool stuck_;
};

// Every token alternates even / odd (>= 2), as AlternatingConstraint demands.
inline void expect_alternating(const std::vector<int32_t>& tokens) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    EXPECT_EQ(tokens[i] % 2, int(i % 2)) << "token " << i;
    EXPECT_GE(tokens[i], 2);
  }
}

}  // namespace dil::testing
