// The --metrics_listen endpoints of a real planner daemon and real executors
// (pp = 2, dp = 2, Gloo on loopback, ZeRO stage 1) while a job runs: every scrape passes
// `promtool check metrics`, carries the job and rank labels, and the
// counters move between two scrapes.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/testing/command.h"
#include "tests/testing/executor_ranks.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/status_matchers.h"

namespace varipipe {
namespace {

using ::testing::HasSubstr;
using ::varipipe::testing::FreshDirectory;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::RankLogs;
using ::varipipe::testing::ReadFile;
using ::varipipe::testing::RunCommand;
using ::varipipe::testing::StartPlannerDaemon;
using ::varipipe::testing::StartRanks;

using Clock = std::chrono::steady_clock;

std::string JobConfig(int redis_port) {
  return absl::StrCat(R"({
    "job_id": "metrics",
    "model": {"kind": "gpt", "num_layers": 4, "hidden_size": 32, "num_attention_heads": 4,
              "ffn_hidden_size": 64, "vocab_size": 64, "dtype": "float32"},
    "parallelism": {"pipeline": 2, "data": 2},
    "cluster": {"devices_per_node": 4, "device_memory_limit_mib": 6},
    "data": {"format": "synthetic", "tokens_per_global_batch": 2048,
             "max_sequence_length": 96, "seed": 3, "synthetic_num_samples": 5000},
    "planner": {"tmax_interval_ms": 0.01, "threads": 1, "plan_ahead": 4},
    "store": {"password_env": "VARIPIPE_TEST_REDIS_PASSWORD",
              "redis_address": "127.0.0.1:)",
                      redis_port, R"("},
    "training": {"iterations": 1000, "learning_rate": 0.01, "warmup_iterations": 2,
                 "watchdog_timeout_s": 60, "zero_stage": 1}
  })");
}

// The port a process logged for its metrics endpoint (0: not within 2 minutes).
int MetricsPort(const std::filesystem::path& log) {
  static const std::regex kLine(R"(Prometheus metrics on http://127\.0\.0\.1:(\d+)/metrics)");
  const auto deadline = Clock::now() + std::chrono::minutes(2);
  while (Clock::now() < deadline) {
    std::smatch match;
    const std::string text = ReadFile(log);
    int port = 0;
    if (std::regex_search(text, match, kLine) && absl::SimpleAtoi(match[1].str(), &port)) {
      return port;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return 0;
}

std::string Scrape(int port) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(30, 0);
  httplib::Result got = client.Get("/metrics");
  if (!got || got->status != 200) return "";
  return got->body;
}

// The value of the sample `series` (name with its labels, as rendered);
// nullopt when absent.
std::optional<double> Value(const std::string& text, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, series + " ")) {
      double v = 0;
      if (absl::SimpleAtod(line.substr(series.size() + 1), &v)) return v;
    }
  }
  return std::nullopt;
}

// Scrapes until `series` exceeds `above` (at most 2 minutes); its value.
double WaitAbove(int port, const std::string& series, double above) {
  const auto deadline = Clock::now() + std::chrono::minutes(2);
  double v = -1;
  while (Clock::now() < deadline) {
    v = Value(Scrape(port), series).value_or(-1);
    if (v > above) return v;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return v;
}

// `promtool check metrics` on a scrape: its exit code and output.
::varipipe::testing::CommandResult Promtool(const std::filesystem::path& dir,
                                            const std::string& name, const std::string& text) {
  const std::filesystem::path file = dir / (name + ".prom");
  std::ofstream(file) << text;
  return RunCommand(absl::StrCat("promtool check metrics < '", file.string(), "'"));
}

class MetricsEndpoints : public ::testing::Test {
 protected:
  void SetUp() override {
    if (RunCommand("command -v promtool").exit_code != 0) {
      GTEST_FAIL() << "promtool is missing (Debian's prometheus package; "
                      "deploy/install-deps.sh installs it)";
    }
    absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
    ASSERT_THAT(redis, IsOk());
    redis_ = *std::move(redis);
    dir_ = FreshDirectory("metrics");
  }
  void TearDown() override {
    varipipe::testing::Signal(dir_, "planner", SIGKILL);
    for (int r = 0; r < 4; ++r) varipipe::testing::Signal(dir_, absl::StrCat("rank", r), SIGKILL);
    std::error_code ignored;
    if (!HasFailure()) std::filesystem::remove_all(dir_, ignored);
  }
  std::string TokenFlag() { return varipipe::testing::TokenFileFlag(dir_); }

  std::unique_ptr<RedisServer> redis_;
  std::filesystem::path dir_;
};

TEST_F(MetricsEndpoints, DaemonAndExecutorsServeValidMetricsThatMoveWhileTheJobRuns) {
  std::ofstream(dir_ / "job.json") << JobConfig(redis_->port());
  const std::string address =
      StartPlannerDaemon(dir_, "planner", redis_->password(),
                         "--config job.json --progress_interval_s 0 --metrics_listen "
                         "127.0.0.1:0" +
                             TokenFlag());
  ASSERT_FALSE(address.empty()) << ReadFile(dir_ / "planner.log");
  const int daemon_port = MetricsPort(dir_ / "planner.log");
  ASSERT_GT(daemon_port, 0) << ReadFile(dir_ / "planner.log");
  const std::string job = "{job=\"metrics\"}";
  // Before any executor: plans ahead up to the window, nothing fetched.
  const double published_before =
      WaitAbove(daemon_port, "varipipe_planner_published_iterations_total" + job, 0);
  ASSERT_GT(published_before, 0) << Scrape(daemon_port);

  StartRanks(dir_, 4, redis_->password(),
             absl::StrCat("--planner ", address, TokenFlag(),
                          " --run_id metrics --metrics_listen 127.0.0.1:0"));
  int ports[4] = {};
  for (int r = 0; r < 4; ++r) {
    ports[r] = MetricsPort(dir_ / absl::StrCat("rank", r, ".log"));
    ASSERT_GT(ports[r], 0) << RankLogs(dir_, 4);
  }
  // Executor counters move between two scrapes while training runs.
  const std::string rank3 = R"({job="metrics",rank="3",dp_rank="1",pp_rank="1"})";
  const double first = WaitAbove(ports[3], "varipipe_executor_iterations_total" + rank3, 1);
  ASSERT_GT(first, 1) << RankLogs(dir_, 4);
  const double tokens =
      Value(Scrape(ports[3]), "varipipe_executor_real_tokens_total" + rank3).value_or(0);
  const double later = WaitAbove(ports[3], "varipipe_executor_iterations_total" + rank3, first);
  EXPECT_GT(later, first) << RankLogs(dir_, 4);
  const std::string executor = Scrape(ports[3]);
  EXPECT_GT(Value(executor, "varipipe_executor_real_tokens_total" + rank3).value_or(0), tokens);
  EXPECT_GT(Value(executor, "varipipe_executor_step_duration_seconds_count" + rank3).value_or(0),
            1);
  EXPECT_GT(Value(executor, "varipipe_executor_predicted_iteration_seconds" + rank3).value_or(0),
            0);
  EXPECT_GT(Value(executor, "varipipe_executor_loss" + rank3).value_or(0), 0);
  // ZeRO stage 1 at dp = 2: AdamW's 8 bytes per parameter, halved (plus at
  // most one padding element of the shard), against 4 bytes of parameters.
  const double parameter_bytes =
      Value(executor, "varipipe_executor_parameter_bytes" + rank3).value_or(0);
  const double optimizer_bytes =
      Value(executor, "varipipe_executor_optimizer_state_bytes" + rank3).value_or(0);
  EXPECT_GT(parameter_bytes, 0);
  EXPECT_GE(optimizer_bytes, parameter_bytes);
  EXPECT_LE(optimizer_bytes, parameter_bytes + 4);
  const double efficiency =
      Value(executor, "varipipe_executor_padding_efficiency_ratio" + rank3).value_or(0);
  EXPECT_GT(efficiency, 0);
  EXPECT_LE(efficiency, 1);
  // Each rank labels its own series.
  EXPECT_THAT(Scrape(ports[0]), HasSubstr(R"({job="metrics",rank="0",dp_rank="0",pp_rank="0"})"));
  EXPECT_THAT(Scrape(ports[1]), HasSubstr(R"({job="metrics",rank="1",dp_rank="0",pp_rank="1"})"));

  // The daemon publishes, plans and serves GetPlan as the executors go on.
  const double published = WaitAbove(
      daemon_port, "varipipe_planner_published_iterations_total" + job, published_before + 2);
  EXPECT_GT(published, published_before + 2) << Scrape(daemon_port);
  const std::string daemon = Scrape(daemon_port);
  EXPECT_GT(Value(daemon, "varipipe_planner_planned_iterations_total" + job).value_or(0), 2);
  EXPECT_GT(Value(daemon, "varipipe_planner_claimed_iterations_total" + job).value_or(0), 2);
  EXPECT_GT(Value(daemon, "varipipe_planner_plan_duration_seconds_count" + job).value_or(0), 2);
  EXPECT_GT(Value(daemon, "varipipe_planner_get_plan_duration_seconds_count" + job).value_or(0), 4);
  EXPECT_EQ(Value(daemon, "varipipe_planner_redis_errors_total" + job), 0.0);
  EXPECT_TRUE(Value(daemon, "varipipe_planner_plan_ahead_iterations" + job).has_value());

  // Both scrapes are valid exposition text with conventional names.
  const auto daemon_check = Promtool(dir_, "daemon", daemon);
  EXPECT_EQ(daemon_check.exit_code, 0) << daemon_check.output << "\n" << daemon;
  const auto executor_check = Promtool(dir_, "executor", executor);
  EXPECT_EQ(executor_check.exit_code, 0) << executor_check.output << "\n" << executor;
}

}  // namespace
}  // namespace varipipe
