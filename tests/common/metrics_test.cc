// The metrics registry's exposition format and the /metrics endpoint over
// real loopback HTTP: rendered values, cumulative histogram buckets, label
// escaping, names Prometheus would reject, ports that are taken.
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/metrics/metric_registry.h"
#include "common/metrics/metrics_http_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::varipipe::testing::IsOk;

TEST(MetricRegistry, RendersCountersGaugesAndCumulativeHistograms) {
  Registry r;
  r.GetCounter("x_requests_total", "Requests.", {{"job", "a"}}).Increment(2);
  r.GetCounter("x_requests_total", "Requests.", {{"job", "a"}}).Increment();
  r.GetCounter("x_requests_total", "Requests.", {{"job", "a"}}).Increment(-5);  // ignored
  r.GetGauge("x_depth", "Depth.", {}).Set(-1.5);
  Histogram& h = r.GetHistogram("x_seconds", "Time.", {0.1, 1}, {{"job", "a"}});
  for (double v : {0.05, 0.1, 0.5, 7.0}) h.Observe(v);
  const std::string text = r.Render();
  EXPECT_THAT(text, HasSubstr("# HELP x_requests_total Requests.\n# TYPE x_requests_total counter\n"
                              "x_requests_total{job=\"a\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE x_depth gauge\nx_depth -1.5\n"));
  // Buckets are cumulative; a value on a bound falls into that bucket.
  EXPECT_THAT(text, HasSubstr("x_seconds_bucket{job=\"a\",le=\"0.10000000000000001\"} 2\n"
                              "x_seconds_bucket{job=\"a\",le=\"1\"} 3\n"
                              "x_seconds_bucket{job=\"a\",le=\"+Inf\"} 4\n"
                              "x_seconds_sum{job=\"a\"} 7.6500000000000004\n"
                              "x_seconds_count{job=\"a\"} 4\n"));
}

TEST(MetricRegistry, EscapesLabelValuesAndRendersSpecialValues) {
  Registry r;
  r.GetGauge("x_loss", "Loss \\ of\nthe job.", {{"job", "a\"b\\c\nd"}})
      .Set(std::numeric_limits<double>::quiet_NaN());
  r.GetGauge("x_inf", "Inf.", {}).Set(std::numeric_limits<double>::infinity());
  const std::string text = r.Render();
  EXPECT_THAT(text, HasSubstr("# HELP x_loss Loss \\\\ of\\nthe job.\n"));
  EXPECT_THAT(text, HasSubstr("x_loss{job=\"a\\\"b\\\\c\\nd\"} NaN\n"));
  EXPECT_THAT(text, HasSubstr("x_inf +Inf\n"));
}

TEST(MetricRegistry, RejectsInvalidNamesAndTypeClashes) {
  Registry r;
  r.GetCounter("1bad", "", {}).Increment();
  r.GetCounter("good_total", "", {{"bad-label", "x"}}).Increment();
  r.GetCounter("good_total", "", {{"le", "x"}}).Increment();
  r.GetGauge("clash", "", {}).Set(1);
  r.GetCounter("clash", "", {}).Increment(5);
  const std::string text = r.Render();
  EXPECT_THAT(text, Not(HasSubstr("1bad")));
  EXPECT_THAT(text, Not(HasSubstr("good_total")));
  EXPECT_THAT(text, HasSubstr("clash 1\n"));
  EXPECT_TRUE(Registry::ValidName("a_b:c"));
  EXPECT_FALSE(Registry::ValidName("a:b", /*label=*/true));
  EXPECT_FALSE(Registry::ValidName("__reserved", /*label=*/true));
}

TEST(MetricRegistry, CollectorsRunBeforeEveryRenderUntilRemoved) {
  Registry r;
  int calls = 0;
  const int id = r.AddCollector([&] { r.GetGauge("x_calls", "Calls.", {}).Set(++calls); });
  EXPECT_THAT(r.Render(), HasSubstr("x_calls 1\n"));
  EXPECT_THAT(r.Render(), HasSubstr("x_calls 2\n"));
  r.RemoveCollector(id);
  EXPECT_THAT(r.Render(), HasSubstr("x_calls 2\n"));
}

TEST(MetricRegistry, ConcurrentIncrementsAreAllCounted) {
  Registry r;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&r, t] {
      for (int k = 0; k < 10000; ++k) {
        r.GetCounter("x_total", "", {{"t", std::to_string(t % 2)}}).Increment();
        r.GetHistogram("x_seconds", "", {1}, {}).Observe(0.5);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const std::string text = r.Render();
  EXPECT_THAT(text, HasSubstr("x_total{t=\"0\"} 20000\n"));
  EXPECT_THAT(text, HasSubstr("x_total{t=\"1\"} 20000\n"));
  EXPECT_THAT(text, HasSubstr("x_seconds_count 40000\n"));
}

TEST(MetricsHttpServer, ServesTheRegistryOnLoopbackAndNothingElse) {
  Registry r;
  Counter& c = r.GetCounter("x_scrapes_total", "Scrapes.", {});
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1:0", &r);
  ASSERT_THAT(server, IsOk());
  ASSERT_GT((*server)->port(), 0);
  httplib::Client client("127.0.0.1", (*server)->port());
  for (int k = 1; k <= 2; ++k) {
    c.Increment();
    httplib::Result got = client.Get("/metrics");
    ASSERT_TRUE(got) << httplib::to_string(got.error());
    EXPECT_EQ(got->status, 200);
    EXPECT_THAT(got->get_header_value("Content-Type"), HasSubstr("text/plain; version=0.0.4"));
    EXPECT_THAT(got->body, HasSubstr(absl::StrCat("x_scrapes_total ", k, "\n")));
  }
  httplib::Result other = client.Get("/");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
  // The port is this server's alone.
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> second =
      MetricsHttpServer::Start(absl::StrCat("127.0.0.1:", (*server)->port()), &r);
  EXPECT_FALSE(second.ok());
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("--metrics_listen"));
}

TEST(MetricsHttpServer, ABarePortListensOnLoopbackAndBadAddressesAreNamed) {
  Registry r;
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server = MetricsHttpServer::Start("0", &r);
  ASSERT_THAT(server, IsOk());
  EXPECT_EQ((*server)->host(), "127.0.0.1");
  for (const char* bad : {"127.0.0.1:x", ":80", "127.0.0.1:70000", "host:-1"}) {
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> s = MetricsHttpServer::Start(bad, &r);
    EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << bad;
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(bad));
  }
}

TEST(MetricsHttpServer, StopsRightAfterStarting) {
  Registry r;
  for (int k = 0; k < 20; ++k) {
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
        MetricsHttpServer::Start("127.0.0.1:0", &r);
    ASSERT_THAT(server, IsOk());
  }
}

}  // namespace
}  // namespace varipipe::metrics
