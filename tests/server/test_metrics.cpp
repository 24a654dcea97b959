#include <gtest/gtest.h>

#include "server/metrics.h"

namespace dil::server {
namespace {

TEST(Metrics, HistogramIsCumulativeWithSumAndCount) {
  Histogram h({1.0, 2.0});
  for (double v : {0.5, 1.0, 1.5, 3.0}) h.observe(v);
  std::string s;
  h.render(&s, "x", "a=\"b\"");
  EXPECT_NE(s.find("x_bucket{a=\"b\",le=\"1\"} 2\n"), std::string::npos) << s;
  EXPECT_NE(s.find("x_bucket{a=\"b\",le=\"2\"} 3\n"), std::string::npos) << s;
  EXPECT_NE(s.find("x_bucket{a=\"b\",le=\"+Inf\"} 4\n"), std::string::npos) << s;
  EXPECT_NE(s.find("x_sum{a=\"b\"} 6\n"), std::string::npos) << s;
  EXPECT_NE(s.find("x_count{a=\"b\"} 4\n"), std::string::npos) << s;
}

TEST(Metrics, CountersAndEngineGauges) {
  Metrics m("tiny");
  m.request_started();
  m.request_started();
  m.request_finished("stop", 10, 4, 0.5);
  EngineStats e;
  e.running = 3;
  e.waiting = 2;
  e.kv_usage = 0.25;
  const std::string s = m.render(e);
  EXPECT_NE(s.find("vllm:num_requests_running{model_name=\"tiny\"} 3\n"), std::string::npos);
  EXPECT_NE(s.find("vllm:num_requests_waiting{model_name=\"tiny\"} 2\n"), std::string::npos);
  EXPECT_NE(s.find("vllm:kv_cache_usage_perc{model_name=\"tiny\"} 0.25\n"), std::string::npos);
  EXPECT_NE(s.find("vllm:prompt_tokens_total{model_name=\"tiny\"} 10\n"), std::string::npos);
  EXPECT_NE(s.find("vllm:generation_tokens_total{model_name=\"tiny\"} 4\n"), std::string::npos);
  EXPECT_NE(s.find("vllm:request_success_total{model_name=\"tiny\",finished_reason=\"stop\"} 1\n"), std::string::npos);
  EXPECT_NE(s.find("dil:requests_in_flight{model_name=\"tiny\"} 1\n"), std::string::npos);
  EXPECT_EQ(m.in_flight(), 1);
}

TEST(Metrics, DataParallelRankGauges) {
  Metrics m("tiny");
  EngineStats e;
  EXPECT_EQ(m.render(e).find("dp_rank"), std::string::npos);  // one rank: no per-rank series
  e.dp_ranks = {{2, 0}, {0, 5}};
  const std::string s = m.render(e);
  EXPECT_NE(s.find("dil:dp_rank_requests_running{model_name=\"tiny\",dp_rank=\"0\"} 2\n"), std::string::npos) << s;
  EXPECT_NE(s.find("dil:dp_rank_requests_running{model_name=\"tiny\",dp_rank=\"1\"} 0\n"), std::string::npos) << s;
  EXPECT_NE(s.find("dil:dp_rank_requests_waiting{model_name=\"tiny\",dp_rank=\"1\"} 5\n"), std::string::npos) << s;
}

}  // namespace
}  // namespace dil::server
