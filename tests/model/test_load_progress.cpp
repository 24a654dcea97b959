// Load progress (model/load_meter.h): the predicted totals equal what the models bind (all
// fixtures, layer subsets, expert-parallel ranks), the last report says done with the plan,
// and reports are rate-limited.
#include <gtest/gtest.h>

#include <thread>

#include "backend/backend.h"
#include "core/check.h"
#include "dist/communicator.h"
#include "model/load_meter.h"
#include "model/model.h"

using namespace dil;

namespace {

const std::string kData = std::string(DIL_SOURCE_DIR) + "/tests/data/";

// A communicator that only says which rank this is: loading reads nothing else from it.
class RankOnly : public Communicator {
 public:
  RankOnly(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_gather(const Tensor&, Tensor) override { DIL_CHECK(false, "no collectives while loading"); }
  void reduce_scatter(const Tensor&, Tensor) override { DIL_CHECK(false, "no collectives while loading"); }
  void all_reduce(Tensor) override { DIL_CHECK(false, "no collectives while loading"); }
  std::vector<int64_t> exchange(const std::vector<int64_t>&) override { DIL_CHECK(false, "no exchange while loading"); }
  std::vector<std::vector<char>> gather_bytes(const std::vector<char>&) override { DIL_CHECK(false, "no exchange"); }
  std::vector<char> scatter_bytes(const std::vector<std::vector<char>>&) override { DIL_CHECK(false, "no exchange"); }
  void barrier() override { DIL_CHECK(false, "no barrier while loading"); }

 private:
  int rank_, size_;
};

// Every report of one load.
std::vector<LoadProgress> load_reports(const std::string& dir, ModelOptions opt) {
  auto be = make_backend(BackendKind::CPU);
  std::vector<LoadProgress> reports;
  opt.on_progress = [&](const LoadProgress& p) { reports.push_back(p); };
  opt.progress_interval_s = 0;  // every tensor
  load_model(dir, *be, opt);
  return reports;
}

// The first report's totals (the prediction) are what the binders bound.
void expect_prediction_exact(const std::vector<LoadProgress>& r) {
  ASSERT_GE(r.size(), 2u);
  const LoadProgress &first = r.front(), &last = r.back();
  EXPECT_EQ(first.tensors_done, 0);
  EXPECT_EQ(first.bytes_done, 0);
  EXPECT_FALSE(first.done);
  EXPECT_TRUE(last.done);
  EXPECT_GT(last.tensors_done, 0);
  EXPECT_EQ(last.tensors_done, first.tensors_total);
  EXPECT_EQ(last.bytes_done, first.bytes_total);
  EXPECT_EQ(last.tensors_total, last.tensors_done);
  EXPECT_EQ(last.bytes_total, last.bytes_done);
  // interval 0: one report per tensor between the first and the last, counts rising by one.
  EXPECT_EQ(int64_t(r.size()), last.tensors_done + 2);
  for (size_t i = 1; i + 1 < r.size(); ++i) {
    EXPECT_EQ(r[i].tensors_done, int64_t(i));
    EXPECT_GE(r[i].bytes_done, r[i - 1].bytes_done);
    EXPECT_LE(r[i].bytes_done, first.bytes_total);  // never past the prediction
  }
}

}  // namespace

TEST(LoadProgress, PredictionMatchesTheBindingOfEveryFixture) {
  for (const char* m : {"v4-tiny", "v41-tiny"}) {
    SCOPED_TRACE(m);
    const auto r = load_reports(kData + m, ModelOptions{});
    expect_prediction_exact(r);
    EXPECT_EQ(r.back().plan, "cpu backend, official numerics; kernels: the reference of every op");
  }
  ModelOptions ref;
  ref.numerics = Numerics::Reference;
  EXPECT_EQ(load_reports(kData + "v4-tiny", ref).back().plan,
            "cpu backend, reference numerics; kernels: the reference of every op");
}

TEST(LoadProgress, V41EngramTablesAreNotCounted) {
  // The Engram tables stay memory-mapped: bound bytes are less than the checkpoint's.
  const auto r = load_reports(kData + "v41-tiny", ModelOptions{});
  const SafeTensors st = SafeTensors::open(kData + "v41-tiny");
  EXPECT_LT(r.back().bytes_done, int64_t(st.total_bytes()));
  EXPECT_LT(r.back().tensors_done, int64_t(st.entries().size()));
}

TEST(LoadProgress, PredictionMatchesLayerSubsetsAndExpertRanks) {
  ModelOptions sub;
  sub.layers = {1, 3};
  expect_prediction_exact(load_reports(kData + "v4-tiny", sub));
  const int64_t all = load_reports(kData + "v4-tiny", ModelOptions{}).back().bytes_done;
  const int64_t part = load_reports(kData + "v4-tiny", sub).back().bytes_done;
  EXPECT_LT(part, all);

  // Expert parallelism: each of 2 ranks binds its half of the routed experts; the two ranks
  // together bind the replicated weights twice and every expert once.
  int64_t rank_bytes[2] = {0, 0};
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(rank);
    RankOnly comm(rank, 2);
    ModelOptions ep;
    ep.comm = &comm;
    for (const char* m : {"v41-tiny", "v4-tiny"}) {
      const auto r = load_reports(kData + m, ep);
      expect_prediction_exact(r);
      if (std::string(m) == "v4-tiny") rank_bytes[rank] = r.back().bytes_done;
    }
    ep.load_format = "dummy";
    ep.layers = {1, 3, 4};
    expect_prediction_exact(load_reports(kData + "v4-tiny/config.json", ep));
  }
  EXPECT_LT(rank_bytes[0], all);
  EXPECT_LT(rank_bytes[1], all);
  EXPECT_GT(rank_bytes[0] + rank_bytes[1], all);
}

TEST(LoadProgress, ReportsAreRateLimited) {
  int reports = 0;
  LoadMeter meter([&](const LoadProgress&) { ++reports; }, {100000, 100000}, 0.2);
  EXPECT_EQ(reports, 1);  // the start
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 100000; ++i) meter.bound(1);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LE(reports, 1 + int(s / 0.2) + 1);
  // After the interval the next tensor reports.
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  const int before = reports;
  meter.bound(1);
  EXPECT_EQ(reports, before + 1);
  EXPECT_EQ(meter.progress().tensors_done, 100001);
  // A prediction that fell short never shows more than 100 %.
  EXPECT_EQ(meter.progress().tensors_total, 100001);
  meter.finish("plan");
  EXPECT_EQ(reports, before + 2);
  EXPECT_TRUE(meter.progress().done);
  EXPECT_EQ(meter.progress().plan, "plan");
}
