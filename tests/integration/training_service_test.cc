// The whole system as users run it, with real processes: a redis-server,
// planner daemons serving plans over gRPC, and four executors (pp=2, dp=2)
// training over Gloo on loopback.
// - two daemons, 20 iterations: the loss falls, every plan is acknowledged
//   and none is left in Redis, and the planner received per-micro-batch
//   timings;
// - a daemon SIGKILLed mid-run: training goes on through the other one, no
//   iteration lost;
// - an executor SIGKILLed at iteration 10: the others exit well within the
//   watchdog timeout naming it; the same command (a new run id) resumes from
//   the checkpoint and ends with parameters equal to an uninterrupted run's;
// - a rank stopped (SIGSTOP): its peer's status endpoint shows the wait it is
//   stuck in, and the peer ends once the stopped rank's heartbeat lapsed,
//   naming it;
// - executors find the job's token each documented way (beside
//   --store_file, --token_file, in the shared store);
// - an AUTO stage layout: chosen once, recorded, followed by every daemon
//   and executor.
#include <signal.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/redis/redis_client.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/testing/command.h"
#include "tests/testing/executor_ranks.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/saved_parameters.h"
#include "tests/testing/status_matchers.h"
#include "varipipe/v1/config.pb.h"

namespace varipipe {
namespace {

using ::testing::HasSubstr;
using ::varipipe::testing::Bin;
using ::varipipe::testing::CommandResult;
using ::varipipe::testing::FreshDirectory;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::LaunchRanks;
using ::varipipe::testing::ExpectSameSavedParameters;
using ::varipipe::testing::RankExit;
using ::varipipe::testing::RankLogs;
using ::varipipe::testing::ReadFile;
using ::varipipe::testing::RunCommand;
using ::varipipe::testing::Signal;
using ::varipipe::testing::StartPlannerDaemon;
using ::varipipe::testing::StartRanks;
using ::varipipe::testing::WaitForRanks;

using Clock = std::chrono::steady_clock;

// A small GPT (pp x dp) on the learnable synthetic data, its Redis external.
std::string JobConfig(const std::string& job_id, int redis_port, int pipeline, int data,
                      int iterations, const std::string& training_extra,
                      const std::string& planner_extra = "") {
  return absl::StrCat(R"({
    "job_id": ")",
                      job_id, R"(",
    "model": {"kind": "gpt", "num_layers": 4, "hidden_size": 32, "num_attention_heads": 4,
              "ffn_hidden_size": 64, "vocab_size": 64, "dtype": "float32"},
    "parallelism": {"pipeline": )",
                      pipeline, R"(, "data": )", data, R"(},
    "cluster": {"devices_per_node": 4, "device_memory_limit_mib": 6},
    "data": {"format": "synthetic", "tokens_per_global_batch": 2048,
             "max_sequence_length": 96, "seed": 3, "synthetic_num_samples": 5000},
    "planner": {"tmax_interval_ms": 0.01, "threads": 1, "plan_ahead": 4)",
                      planner_extra, R"(},
    "store": {"password_env": "VARIPIPE_TEST_REDIS_PASSWORD",
              "redis_address": "127.0.0.1:)",
                      redis_port, R"("},
    "training": {"iterations": )",
                      iterations, R"(, "learning_rate": 0.01,
                 "warmup_iterations": 2)",
                      training_extra, R"(}
  })");
}

// Iteration -> loss from rank 0's --metrics_jsonl.
std::map<int, double> Losses(const std::filesystem::path& file) {
  std::map<int, double> losses;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    google::protobuf::Struct record;
    if (!google::protobuf::util::JsonStringToMessage(line, &record).ok()) continue;
    losses[static_cast<int>(record.fields().at("iteration").number_value())] =
        record.fields().at("loss").number_value();
  }
  return losses;
}

int MetricLines(const std::filesystem::path& file) {
  std::ifstream in(file);
  int lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  return lines;
}

// Waits until rank 0 logged `lines` metric lines (at most `timeout`).
bool WaitForMetricLines(const std::filesystem::path& file, int lines,
                        std::chrono::seconds timeout = std::chrono::seconds(120)) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (MetricLines(file) >= lines) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// Plans of the job still in Redis.
size_t PlansLeft(const RedisServer& redis, const std::string& job_id) {
  absl::StatusOr<std::unique_ptr<RedisClient>> client = RedisClient::Connect(
      {.host = "127.0.0.1", .port = redis.port(), .password = redis.password()});
  if (!client.ok()) return 1000000;
  absl::StatusOr<RedisReply> keys =
      (*client)->Command({"KEYS", absl::StrCat("varipipe:", job_id, ":plan:*")});
  return keys.ok() ? keys->size() : 1000000;
}

std::string DaemonLog(const std::filesystem::path& dir, const std::string& name) {
  return absl::StrCat("--- ", name, "\n", ReadFile(dir / (name + ".log")));
}

class TrainingService : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
    ASSERT_THAT(redis, IsOk());
    redis_ = *std::move(redis);
  }
  void TearDown() override {
    // Nothing outlives a test: daemons and ranks still running are killed.
    for (const char* name : {"planner-a", "planner-b", "planner"}) {
      varipipe::testing::Signal(dir_, name, SIGKILL);
    }
    for (int r = 0; r < 4; ++r) {
      varipipe::testing::Signal(dir_, absl::StrCat("rank", r), SIGCONT);
      varipipe::testing::Signal(dir_, absl::StrCat("rank", r), SIGKILL);
    }
    std::error_code ignored;  // a killed rank may still be writing
    if (!HasFailure()) std::filesystem::remove_all(dir_, ignored);
  }
  std::string Daemon(const std::string& name, const std::string& extra = "") {
    return StartPlannerDaemon(
        dir_, name, redis_->password(),
        "--config job.json --progress_interval_s 0 --lease_ms 1000" + TokenFlag() + extra);
  }
  std::string TokenFlag() { return varipipe::testing::TokenFileFlag(dir_); }

  std::unique_ptr<RedisServer> redis_;
  std::filesystem::path dir_;
};

TEST_F(TrainingService, TwoPlannerDaemonsAndFourExecutorsTrainTwentyIterations) {
  dir_ = FreshDirectory("e2e");
  std::ofstream(dir_ / "job.json")
      << JobConfig("e2e", redis_->port(), 2, 2, 20, R"(, "watchdog_timeout_s": 60)");
  const std::string a = Daemon("planner-a");
  const std::string b = Daemon("planner-b");
  ASSERT_FALSE(a.empty()) << DaemonLog(dir_, "planner-a");
  ASSERT_FALSE(b.empty()) << DaemonLog(dir_, "planner-b");
  const auto start = Clock::now();
  const CommandResult run = LaunchRanks(
      dir_, 4, redis_->password(),
      absl::StrCat("--planner ", a, ",", b, TokenFlag(), " --run_id e2e --metrics_jsonl m.jsonl"));
  std::printf("20 iterations in %.1f s\n",
              std::chrono::duration<double>(Clock::now() - start).count());
  ASSERT_EQ(run.exit_code, 0) << run.output << DaemonLog(dir_, "planner-a")
                              << DaemonLog(dir_, "planner-b");
  const std::map<int, double> losses = Losses(dir_ / "m.jsonl");
  ASSERT_EQ(losses.size(), 20u) << run.output;
  std::printf("loss %.4f -> %.4f\n", losses.begin()->second, losses.rbegin()->second);
  EXPECT_LT(losses.rbegin()->second, 0.85 * losses.begin()->second) << run.output;
  // Every plan acknowledged by all four ranks and deleted.
  EXPECT_EQ(PlansLeft(*redis_, "e2e"), 0u);
  // The planners got each rank's measurements, per-micro-batch times included.
  absl::StatusOr<std::unique_ptr<RedisClient>> client = RedisClient::Connect(
      {.host = "127.0.0.1", .port = redis_->port(), .password = redis_->password()});
  ASSERT_THAT(client, IsOk());
  for (int r = 0; r < 4; ++r) {
    absl::StatusOr<RedisReply> report =
        (*client)->Command({"HGET", "varipipe:e2e:reports", std::to_string(r)});
    ASSERT_THAT(report, IsOk());
    EXPECT_THAT(report->str(), HasSubstr("\"iteration\":\"19\"")) << "rank " << r;
    EXPECT_THAT(report->str(), HasSubstr("\"forwardMs\"")) << "rank " << r;
    EXPECT_THAT(report->str(), HasSubstr("\"backwardMs\"")) << "rank " << r;
  }
}

// parallelism.stage_layout AUTO (docs/configuration.md, "Stage layout"): the
// first daemon chooses the layout and records it in the store, the second
// reads it, the executors build their stages with it (from GetJob, with the
// config's own file too), and every plan they run records it.
TEST_F(TrainingService, DaemonsAgreeOnAnAutoStageLayoutAndExecutorsTrainWithIt) {
  dir_ = FreshDirectory("auto-layout");
  const std::string config =
      JobConfig("auto-layout", redis_->port(), 2, 2, 6, R"(, "watchdog_timeout_s": 60)");
  const std::string even = R"("parallelism": {"pipeline": 2, "data": 2})";
  ASSERT_NE(config.find(even), std::string::npos);
  std::string with_auto = config;
  with_auto.replace(
      with_auto.find(even), even.size(),
      R"("parallelism": {"pipeline": 2, "data": 2, "stage_layout": {"mode": "AUTO"}})");
  std::ofstream(dir_ / "job.json") << with_auto;
  const std::string a = Daemon("planner-a");
  ASSERT_FALSE(a.empty()) << DaemonLog(dir_, "planner-a");
  const std::string b = Daemon("planner-b");
  ASSERT_FALSE(b.empty()) << DaemonLog(dir_, "planner-b");
  // The choice, in the store.
  absl::StatusOr<std::unique_ptr<RedisClient>> client = RedisClient::Connect(
      {.host = "127.0.0.1", .port = redis_->port(), .password = redis_->password()});
  ASSERT_THAT(client, IsOk());
  absl::StatusOr<RedisReply> stored =
      (*client)->Command({"GET", "varipipe:auto-layout:stage_layout"});
  ASSERT_THAT(stored, IsOk());
  ASSERT_TRUE(stored->is_string());
  v1::StageLayoutConfig layout;
  ASSERT_TRUE(layout.ParseFromString(stored->str()));
  EXPECT_EQ(layout.mode(), v1::LISTED);
  ASSERT_EQ(layout.layers_size(), 2);
  EXPECT_EQ(layout.layers(0) + layout.layers(1), 4u);
  const std::string chosen = absl::StrCat(layout.layers(0), "+", layout.layers(1));
  EXPECT_THAT(ReadFile(dir_ / "planner-a.log"), HasSubstr("mean predicted iteration"));
  EXPECT_THAT(ReadFile(dir_ / "planner-b.log"),
              HasSubstr(absl::StrCat("stage layout (AUTO): ", chosen,
                                     ", as the instruction store records it")));
  const CommandResult run = LaunchRanks(
      dir_, 4, redis_->password(),
      absl::StrCat("--planner ", a, ",", b, TokenFlag(), " --config job.json --run_id auto"));
  ASSERT_EQ(run.exit_code, 0) << run.output << DaemonLog(dir_, "planner-a")
                              << DaemonLog(dir_, "planner-b");
  EXPECT_THAT(run.output, HasSubstr(absl::StrCat("stage layout (AUTO): ", chosen,
                                                 ", from the planner daemons")));
  EXPECT_THAT(run.output, HasSubstr(absl::StrCat("stage layout ", chosen, " (2 stages)")));
}

// docs/security.md, "Where clients find the token": a daemon without
// --token_file generates the job's token and keeps it in the store; executors
// find it beside --store_file, in --token_file, or, holding the shared
// Redis's password, in the store itself.
TEST_F(TrainingService, ExecutorsFindTheJobTokenEachDocumentedWay) {
  dir_ = FreshDirectory("token");
  std::ofstream(dir_ / "job.json")
      << JobConfig("token", redis_->port(), 2, 1, 6, R"(, "watchdog_timeout_s": 60)");
  const std::string planner =
      StartPlannerDaemon(dir_, "planner", redis_->password(),
                         "--config job.json --progress_interval_s 0 --lease_ms 1000 "
                         "--store_file store");
  ASSERT_FALSE(planner.empty()) << DaemonLog(dir_, "planner");
  // Each way runs two iterations of its own.
  const std::vector<std::pair<std::string, std::string>> ways = {
      {"store_file", "--store_file store"},
      {"token_file", "--config job.json --token_file store.token"},
      {"shared_store", "--config job.json"},
  };
  int first = 0;
  for (const auto& [name, flags] : ways) {
    SCOPED_TRACE(name);
    const CommandResult run =
        LaunchRanks(dir_, 2, redis_->password(),
                    absl::StrCat("--planner ", planner, " ", flags, " --run_id ", name,
                                 " --first_iteration ", first, " --iterations 2"));
    ASSERT_EQ(run.exit_code, 0) << run.output << DaemonLog(dir_, "planner");
    if (name == "shared_store") {
      EXPECT_THAT(run.output, HasSubstr("job token read from the store at 127.0.0.1:"));
    }
    first += 2;
  }
  // A shared store that holds no token for the job: a clear start-up error.
  std::ofstream(dir_ / "other.json")
      << JobConfig("no-daemon", redis_->port(), 2, 1, 6, R"(, "watchdog_timeout_s": 60)");
  const CommandResult refused = RunCommand(absl::StrCat(
      "cd '", dir_.string(), "' && VARIPIPE_TEST_REDIS_PASSWORD='", redis_->password(), "' ",
      Bin("varipipe-executor"), " --config other.json --planner ", planner, " 2>&1"));
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_THAT(refused.output, HasSubstr("holds no token for job 'no-daemon' (key "
                                        "varipipe:no-daemon:token)"));
}

TEST_F(TrainingService, TrainingContinuesWhenAPlannerDaemonDies) {
  dir_ = FreshDirectory("daemon-dies");
  std::ofstream(dir_ / "job.json")
      << JobConfig("daemon-dies", redis_->port(), 2, 2, 20, R"(, "watchdog_timeout_s": 60)");
  const std::string a = Daemon("planner-a");
  const std::string b = Daemon("planner-b");
  ASSERT_FALSE(a.empty()) << DaemonLog(dir_, "planner-a");
  ASSERT_FALSE(b.empty()) << DaemonLog(dir_, "planner-b");
  // The executors talk to daemon a first.
  StartRanks(
      dir_, 4, redis_->password(),
      absl::StrCat("--planner ", a, ",", b, TokenFlag(), " --run_id dies --metrics_jsonl m.jsonl"));
  ASSERT_TRUE(WaitForMetricLines(dir_ / "m.jsonl", 6)) << RankLogs(dir_, 4);
  Signal(dir_, "planner-a", SIGKILL);
  const int rc = WaitForRanks(dir_, 4);
  const std::string logs = RankLogs(dir_, 4);
  ASSERT_EQ(rc, 0) << logs << DaemonLog(dir_, "planner-a") << DaemonLog(dir_, "planner-b");
  const std::map<int, double> losses = Losses(dir_ / "m.jsonl");
  EXPECT_EQ(MetricLines(dir_ / "m.jsonl"), 20) << "an iteration ran twice or not at all";
  ASSERT_EQ(losses.size(), 20u) << logs;
  EXPECT_EQ(losses.begin()->first, 0);
  EXPECT_EQ(losses.rbegin()->first, 19);
  EXPECT_EQ(PlansLeft(*redis_, "daemon-dies"), 0u);
  EXPECT_THAT(logs, HasSubstr(absl::StrCat("now using ", b)));
}

TEST_F(TrainingService, AKilledExecutorIsNamedAndTheRerunResumesFromTheCheckpoint) {
  dir_ = FreshDirectory("kill");
  constexpr int kWatchdogSeconds = 60;
  std::ofstream(dir_ / "job.json")
      << JobConfig("kill", redis_->port(), 2, 2, 16,
                   absl::StrCat(R"(, "watchdog_timeout_s": )", kWatchdogSeconds,
                                R"(, "checkpoint_dir": "ckpt", "checkpoint_interval": 4)"),
                   // Calibrated plans depend on measured times; the reference
                   // run below is planned without them.
                   R"(, "online_calibration": false)");
  const std::string planner = Daemon("planner");
  ASSERT_FALSE(planner.empty()) << DaemonLog(dir_, "planner");
  // The command of the job; each launch gets its own run id, as torchrun
  // --standalone or a new mpirun would give it.
  const auto flags = [&](const std::string& run) {
    return absl::StrCat("--planner ", planner, TokenFlag(), " --run_id ", run,
                        " --metrics_jsonl m.jsonl --save_parameters params");
  };
  StartRanks(dir_, 4, redis_->password(), flags("first"));
  ASSERT_TRUE(WaitForMetricLines(dir_ / "m.jsonl", 10)) << RankLogs(dir_, 4);
  Signal(dir_, "rank3", SIGKILL);
  const auto killed = Clock::now();
  ASSERT_EQ(WaitForRanks(dir_, 4, std::chrono::seconds(2 * kWatchdogSeconds)), 1);
  const double seconds = std::chrono::duration<double>(Clock::now() - killed).count();
  const std::string first_logs = RankLogs(dir_, 4);
  std::printf("the other ranks exited %.1f s after the kill (watchdog %d s)\n", seconds,
              kWatchdogSeconds);
  EXPECT_LT(seconds, kWatchdogSeconds);
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(RankExit(dir_, r), 0) << first_logs;
    EXPECT_THAT(ReadFile(dir_ / absl::StrCat("rank", r, ".log")),
                HasSubstr("rank 3 stopped without reporting an error"))
        << "rank " << r << "\n"
        << first_logs;
  }
  // The same command again: resumes after the last complete checkpoint (8).
  const CommandResult rerun = LaunchRanks(dir_, 4, redis_->password(), flags("second"));
  ASSERT_EQ(rerun.exit_code, 0) << rerun.output << DaemonLog(dir_, "planner");
  EXPECT_THAT(ReadFile(dir_ / "rank0.log"),
              ::testing::AllOf(HasSubstr("resumed from checkpoint"),
                               HasSubstr("(8 iterations done)"), HasSubstr("iteration 15: loss")));
  EXPECT_EQ(PlansLeft(*redis_, "kill"), 0u);

  // An uninterrupted run of the same job, from plan files.
  const std::filesystem::path reference = dir_ / "reference";
  std::filesystem::create_directories(reference);
  std::filesystem::copy_file(dir_ / "job.json", reference / "job.json");
  const CommandResult plan =
      RunCommand(absl::StrCat("cd '", reference.string(), "' && ", Bin("varipipe-plan"),
                              " --config job.json --iterations 16 --emit-plans plans"));
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  const CommandResult uninterrupted =
      LaunchRanks(reference, 4, redis_->password(),
                  "--config job.json --plans plans --run_id reference --save_parameters params");
  ASSERT_EQ(uninterrupted.exit_code, 0) << uninterrupted.output;
  EXPECT_GT(ExpectSameSavedParameters(dir_, reference, 4), 8);
}

TEST_F(TrainingService, AStoppedRankShowsInThePeersStatusAndItsPeerEndsNamingIt) {
  dir_ = FreshDirectory("stuck");
  // Rank 0's status shows the stuck wait from the moment it blocks until its
  // watch finds rank 1 silent (its heartbeat lapsed: about 4 s) or, at the
  // latest, its watchdog fires (10 s).
  constexpr int kWatchdogSeconds = 10;
  std::ofstream(dir_ / "job.json")
      << JobConfig("stuck", redis_->port(), 2, 1, 40,
                   absl::StrCat(R"(, "watchdog_timeout_s": )", kWatchdogSeconds));
  const CommandResult plan =
      RunCommand(absl::StrCat("cd '", dir_.string(), "' && ", Bin("varipipe-plan"),
                              " --config job.json --iterations 40 --emit-plans plans"));
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  StartRanks(dir_, 2, redis_->password(),
             "--config job.json --plans plans --run_id stuck --metrics_jsonl m.jsonl");
  ASSERT_TRUE(WaitForMetricLines(dir_ / "m.jsonl", 3)) << RankLogs(dir_, 2);
  Signal(dir_, "rank1", SIGSTOP);
  // Rank 0's status endpoint: the port it logged.
  const std::string log0 = ReadFile(dir_ / "rank0.log");
  const std::string marker = "status endpoint (StatusService, health) on 127.0.0.1:";
  const size_t at = log0.find(marker);
  ASSERT_NE(at, std::string::npos) << log0;
  const int port = std::stoi(log0.substr(at + marker.size()));
  // Polled until rank 0 has run into the wait on its stopped peer (it may
  // still be computing when the signal lands).
  CommandResult status;
  const auto poll_until = Clock::now() + std::chrono::seconds(2 * kWatchdogSeconds);
  do {
    status = RunCommand(absl::StrCat(Bin("varipipe-ctl"), " executor --address 127.0.0.1:", port));
    if (absl::StrContains(status.output, "in instruction #") &&
        absl::StrContains(status.output, "wait")) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  } while (Clock::now() < poll_until && !RankExit(dir_, 0).has_value());
  std::printf("%s", status.output.c_str());
  EXPECT_EQ(status.exit_code, 0) << status.output;
  EXPECT_THAT(
      status.output,
      ::testing::AllOf(HasSubstr("executor rank 0 (dp 0, pp 0) of job stuck"), HasSubstr("SERVING"),
                       HasSubstr("in instruction #"), ::testing::ContainsRegex("wait")));
  // The watch (or the watchdog) ends rank 0, naming the stopped rank.
  const auto deadline = Clock::now() + std::chrono::seconds(6 * kWatchdogSeconds);
  while (!RankExit(dir_, 0).has_value() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(RankExit(dir_, 0).has_value()) << RankLogs(dir_, 2);
  EXPECT_NE(RankExit(dir_, 0), 0);
  EXPECT_THAT(ReadFile(dir_ / "rank0.log"),
              HasSubstr("rank 1 stopped without reporting an error (killed, crashed, hung or "
                        "unreachable: no heartbeat for"))
      << RankLogs(dir_, 2);
}

}  // namespace
}  // namespace varipipe
