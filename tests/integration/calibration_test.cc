// Online calibration end to end (docs/cost-model.md, "Calibration"): a
// real planner daemon plans with a deliberately wrong cost model (a
// measured profile with every time thirty times too long: whatever the
// load on the machine, far from what runs; four ranks on two cores run 2-7
// times slower than the profile's one process, so a tenfold profile could
// be as little as 40% off), four real executors (pp = 2,
// dp = 2) train and report, and the daemon's calibration brings the
// predicted time of iterations 8-15 within 20% of the measured one. The state lives in
// the store: a daemon started afterwards on the same Redis continues with
// it. It asserts on measured wall time, so it runs alone (SERIAL in
// tests/CMakeLists.txt): other tests' load changing mid-run is what no
// calibration can follow.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/median.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/testing/command.h"
#include "tests/testing/executor_ranks.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/status_matchers.h"
#include "varipipe/v1/cost_model.pb.h"

namespace varipipe {
namespace {

using ::testing::HasSubstr;
using ::varipipe::testing::Bin;
using ::varipipe::testing::CommandResult;
using ::varipipe::testing::FreshDirectory;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::LaunchRanks;
using ::varipipe::testing::ReadFile;
using ::varipipe::testing::RedisServer;
using ::varipipe::testing::RunCommand;
using ::varipipe::testing::StartPlannerDaemon;

constexpr int kIterations = 16;

std::string JobJson(int port, const std::string& cost_model) {
  return absl::StrCat(
      R"({
    "job_id": "calibration-test",
    "model": {"kind": "gpt", "num_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
              "ffn_hidden_size": 128, "vocab_size": 64, "dtype": "float32"},
    "parallelism": {"pipeline": 2, "data": 2},
    "cluster": {"devices_per_node": 4, "device_memory_limit_mib": 16},
    "data": {"format": "synthetic", "tokens_per_global_batch": 2048,
             "max_sequence_length": 128, "seed": 3, "synthetic_num_samples": 5000},
    "planner": {"tmax_interval_ms": 0.01, "threads": 1, "plan_ahead": 1,
                "schedules": ["one_f_one_b"])",
      cost_model.empty() ? "" : absl::StrCat(R"(, "cost_model_path": ")", cost_model, R"(")"),
      R"(},
    "store": {"password_env": "VARIPIPE_TEST_REDIS_PASSWORD",
              "redis_address": "127.0.0.1:)",
      port, R"("},
    "training": {"iterations": )",
      kIterations, R"(, "learning_rate": 0.003, "watchdog_timeout_s": 120}
  })");
}

constexpr double kWrongBy = 30;

// The profile with every forward, backward and optimizer time times
// kWrongBy.
void ScaleTimes(const std::filesystem::path& in, const std::filesystem::path& out) {
  v1::CostModelFile file;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(ReadFile(in), &file).ok());
  for (v1::CostGrid& g : *file.mutable_grids()) {
    for (double& v : *g.mutable_forward_ms()) v *= kWrongBy;
    for (double& v : *g.mutable_backward_ms()) v *= kWrongBy;
  }
  file.mutable_optimizer()->set_fixed_ms(kWrongBy * file.optimizer().fixed_ms());
  file.mutable_optimizer()->set_ms_per_million_parameters(
      kWrongBy * file.optimizer().ms_per_million_parameters());
  std::string json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(file, &json).ok());
  std::ofstream(out) << json;
}

struct Iteration {
  double measured_ms = 0;
  double predicted_ms = 0;
  double error() const { return std::abs(predicted_ms - measured_ms) / measured_ms; }
};

std::vector<Iteration> ReadMetrics(const std::filesystem::path& path) {
  std::vector<Iteration> out;
  std::istringstream lines(ReadFile(path));
  for (std::string line; std::getline(lines, line);) {
    google::protobuf::Struct record;
    if (!google::protobuf::util::JsonStringToMessage(line, &record).ok()) continue;
    out.push_back({record.fields().at("step_ms").number_value(),
                   record.fields().at("predicted_ms").number_value()});
  }
  return out;
}

TEST(OnlineCalibration, BringsAThirtyfoldCostModelWithinTwentyPercent) {
  absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
  ASSERT_THAT(redis, IsOk());
  const std::filesystem::path dir = FreshDirectory("calibration");
  std::ofstream(dir / "profile-job.json") << JobJson((*redis)->port(), "");
  const CommandResult profiled =
      RunCommand(absl::StrCat("cd '", dir.string(), "' && ", Bin("varipipe-profile"),
                              " --config profile-job.json --out profile.json --quick 2>&1"));
  ASSERT_EQ(profiled.exit_code, 0) << profiled.output;
  ScaleTimes(dir / "profile.json", dir / "wrong.json");
  std::ofstream(dir / "job.json") << JobJson((*redis)->port(), "wrong.json");

  const std::string password = (*redis)->password();
  const std::string planner = StartPlannerDaemon(
      dir, "planner", password,
      "--config job.json --progress_interval_s 0 --store_file store --keep_serving");
  ASSERT_FALSE(planner.empty()) << ReadFile(dir / "planner.log");
  const CommandResult run = LaunchRanks(
      dir, 4, password,
      absl::StrCat("--planner ", planner, " --token_file store.token --run_id calibration",
                   " --metrics_jsonl metrics.jsonl"));
  ASSERT_EQ(run.exit_code, 0) << run.output << ReadFile(dir / "planner.log");
  const CommandResult status =
      RunCommand(absl::StrCat("cd '", dir.string(), "' && ", Bin("varipipe-ctl"), " --planner ",
                              planner, " --token_file store.token status 2>&1"));
  varipipe::testing::Signal(dir, "planner", SIGTERM);

  const std::vector<Iteration> iterations = ReadMetrics(dir / "metrics.jsonl");
  ASSERT_EQ(iterations.size(), static_cast<size_t>(kIterations)) << run.output;
  std::vector<std::string> table;
  for (size_t i = 0; i < iterations.size(); ++i) {
    table.push_back(absl::StrFormat("%d: measured %.1f ms, predicted %.1f ms (%.0f%%)", i,
                                    iterations[i].measured_ms, iterations[i].predicted_ms,
                                    100 * iterations[i].error()));
  }
  std::printf("%s\n", absl::StrJoin(table, "\n").c_str());
  // Iterations 0 and 1 were planned before any report (plan_ahead 1):
  // thirty times too slow.
  // From iteration 8 on every plan used the reports of at least 5
  // iterations.
  //
  // Calibration corrects the model's bias (here, thirtyfold); it cannot
  // predict the machine's noise from one iteration to the next, which on
  // a shared 2-core CI machine moved identical-sized iterations by +-30%.
  // So the 20% bound is on the total over iterations 8-15 (the bias), and
  // the per-iteration median must be within 50% and a quarter of the
  // uncalibrated error (the thirtyfold model was 600-1,100% off on an idle
  // machine, and stays several hundred percent off under load).
  std::vector<double> late;
  double late_measured = 0, late_predicted = 0;
  for (size_t i = 8; i < iterations.size(); ++i) {
    late.push_back(iterations[i].error());
    late_measured += iterations[i].measured_ms;
    late_predicted += iterations[i].predicted_ms;
  }
  const double early = std::max(iterations[0].error(), iterations[1].error());
  const double total_error = std::abs(late_predicted - late_measured) / late_measured;
  std::printf("iterations 8-15: total error %.1f%%, median error %.1f%%\n", 100 * total_error,
              100 * Median(late));
  EXPECT_LE(total_error, 0.20) << absl::StrJoin(table, "\n");
  EXPECT_LE(Median(late), 0.50) << absl::StrJoin(table, "\n");
  EXPECT_LT(Median(late), early / 4) << absl::StrJoin(table, "\n");
  // The status shows the error and the calibration (scales below 1: the
  // model's times were thirty times too long).
  EXPECT_THAT(status.output, HasSubstr("prediction error p50 ")) << status.output;
  EXPECT_THAT(status.output, HasSubstr("calibration version ")) << status.output;
  EXPECT_THAT(ReadFile(dir / "planner.log"), HasSubstr("calibration version "));

  // A daemon started later on the same store continues with the state.
  const std::string second = StartPlannerDaemon(
      dir, "second", password,
      "--config job.json --progress_interval_s 0 --store_file store2 --keep_serving");
  ASSERT_FALSE(second.empty()) << ReadFile(dir / "second.log");
  const CommandResult again =
      RunCommand(absl::StrCat("cd '", dir.string(), "' && ", Bin("varipipe-ctl"), " --planner ",
                              second, " --token_file store.token status 2>&1"));
  varipipe::testing::Signal(dir, "second", SIGTERM);
  const auto version_line = [](const std::string& text) {
    const size_t at = text.find("calibration version ");
    return at == std::string::npos ? std::string() : text.substr(at, text.find('\n', at) - at);
  };
  EXPECT_FALSE(version_line(status.output).empty());
  EXPECT_EQ(version_line(again.output), version_line(status.output)) << again.output;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace varipipe
