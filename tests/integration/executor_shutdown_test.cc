// How executors end, with real processes (Gloo on loopback, a real
// redis-server, a planner daemon where plans come from one):
// - SIGTERM ends an executor within 5 s wherever it waits: at the
//   rendezvous (its peer never comes), on a pipeline peer that is stopped
//   (SIGSTOP), in the data-parallel all-reduce with a stopped peer, and on a
//   plan the planners will not make yet; it logs where it stopped and exits
//   with 143 (128 + SIGTERM);
// - a rank that fails at start-up reports its error, and its peers name it
//   with that error instead of blaming it for stopping without a word.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/command.h"
#include "tests/testing/executor_ranks.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/status_matchers.h"

namespace varipipe {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::varipipe::testing::Bin;
using ::varipipe::testing::CommandResult;
using ::varipipe::testing::FreshDirectory;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::RankExit;
using ::varipipe::testing::RankLogs;
using ::varipipe::testing::ReadFile;
using ::varipipe::testing::RunCommand;
using ::varipipe::testing::Signal;
using ::varipipe::testing::StartPlannerDaemon;
using ::varipipe::testing::StartRank;
using ::varipipe::testing::StartRanks;
using ::varipipe::testing::WaitForRanks;

using Clock = std::chrono::steady_clock;

// The bound the issue sets: SIGTERM ends an executor within 5 s.
constexpr double kStopSeconds = 5.0;

// A small GPT (pp x dp) on the synthetic data, its Redis external.
std::string JobConfig(const std::string& job_id, int redis_port, int pipeline, int data,
                      int iterations) {
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
    "planner": {"tmax_interval_ms": 0.01, "threads": 1, "plan_ahead": 4},
    "store": {"password_env": "VARIPIPE_TEST_REDIS_PASSWORD",
              "redis_address": "127.0.0.1:)",
                      redis_port, R"("},
    "training": {"iterations": )",
                      iterations, R"(, "learning_rate": 0.01,
                 "warmup_iterations": 2, "watchdog_timeout_s": 300}
  })");
}

// Waits (at most 2 minutes) until `file` contains `text`.
bool WaitForText(const std::filesystem::path& file, const std::string& text) {
  const auto deadline = Clock::now() + std::chrono::minutes(2);
  while (Clock::now() < deadline) {
    if (absl::StrContains(ReadFile(file), text)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// Waits (at most 2 minutes) until `file` has `lines` lines.
bool WaitForLines(const std::filesystem::path& file, int lines) {
  const auto deadline = Clock::now() + std::chrono::minutes(2);
  while (Clock::now() < deadline) {
    const std::string text = ReadFile(file);
    if (std::count(text.begin(), text.end(), '\n') >= lines) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

class ExecutorShutdown : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
    ASSERT_THAT(redis, IsOk());
    redis_ = *std::move(redis);
  }
  void TearDown() override {
    // Nothing outlives a test: stopped ranks are continued and killed.
    for (int r = 0; r < 2; ++r) {
      Signal(dir_, absl::StrCat("rank", r), SIGCONT);
      Signal(dir_, absl::StrCat("rank", r), SIGKILL);
    }
    Signal(dir_, "planner", SIGKILL);
    std::error_code ignored;
    if (!HasFailure()) std::filesystem::remove_all(dir_, ignored);
  }
  // Writes job.json and the plans of its iterations to DIR/plans.
  void WriteJob(const std::string& job_id, int pipeline, int data, int iterations) {
    dir_ = FreshDirectory(absl::StrCat("shutdown-", job_id));
    std::ofstream(dir_ / "job.json")
        << JobConfig(job_id, redis_->port(), pipeline, data, iterations);
  }
  void WritePlans(int iterations) {
    const CommandResult plan = RunCommand(
        absl::StrCat("cd '", dir_.string(), "' && ", Bin("varipipe-plan"),
                     " --config job.json --iterations ", iterations, " --emit-plans plans"));
    ASSERT_EQ(plan.exit_code, 0) << plan.output;
  }
  // Sends SIGTERM to rank `r` and returns the seconds until it exited (or a
  // minute when it did not).
  double TerminateAndTime(int r) {
    const auto start = Clock::now();
    Signal(dir_, absl::StrCat("rank", r), SIGTERM);
    while (!RankExit(dir_, r).has_value() && Clock::now() - start < std::chrono::minutes(1)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    std::printf("rank %d exited %.2f s after SIGTERM\n", r, seconds);
    return seconds;
  }
  // Polls rank `r`'s status endpoint until it shows the rank inside an
  // instruction of an iteration (at most 2 minutes).
  void WaitUntilInAnInstruction(int r) {
    const std::string marker = "status endpoint (StatusService, health) on 127.0.0.1:";
    const std::filesystem::path log = dir_ / absl::StrCat("rank", r, ".log");
    ASSERT_TRUE(WaitForText(log, marker)) << ReadFile(log);
    const std::string text = ReadFile(log);
    const int port = std::stoi(text.substr(text.find(marker) + marker.size()));
    const auto deadline = Clock::now() + std::chrono::minutes(2);
    while (Clock::now() < deadline) {
      const CommandResult status =
          RunCommand(absl::StrCat(Bin("varipipe-ctl"), " executor --address 127.0.0.1:", port));
      if (absl::StrContains(status.output, "in instruction #")) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ADD_FAILURE() << "rank " << r << " never showed an instruction\n" << RankLogs(dir_, 2);
  }
  void ExpectStoppedBySigterm(int r, double seconds, const std::string& where) {
    const std::string log = ReadFile(dir_ / absl::StrCat("rank", r, ".log"));
    EXPECT_LT(seconds, kStopSeconds) << log;
    EXPECT_EQ(RankExit(dir_, r), 128 + SIGTERM) << log;
    EXPECT_THAT(log, AllOf(HasSubstr("received SIGTERM"), HasSubstr("stopped by SIGTERM"),
                           HasSubstr(where), HasSubstr("exiting with status 143")));
  }

  std::unique_ptr<RedisServer> redis_;
  std::filesystem::path dir_;
};

TEST_F(ExecutorShutdown, SigtermEndsARankWaitingAtTheRendezvous) {
  WriteJob("rendezvous", 2, 1, 10);
  // Rank 1 never comes.
  StartRank(dir_, 0, 2, redis_->password(), "--config job.json --plans plans --run_id rdv");
  ASSERT_TRUE(WaitForText(dir_ / "rank0.log", "meeting 2 ranks")) << RankLogs(dir_, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // inside the wait
  const double seconds = TerminateAndTime(0);
  ExpectStoppedBySigterm(0, seconds, "rendezvous");
}

TEST_F(ExecutorShutdown, SigtermEndsARankWaitingOnAStoppedPeer) {
  WriteJob("peer", 2, 1, 40);
  WritePlans(40);
  StartRanks(dir_, 2, redis_->password(), "--config job.json --plans plans --run_id peer");
  WaitUntilInAnInstruction(0);
  Signal(dir_, "rank1", SIGSTOP);
  // Rank 0 runs into a transfer with its stopped peer (at most one
  // instruction's compute later).
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const double seconds = TerminateAndTime(0);
  ExpectStoppedBySigterm(0, seconds, "rank 1");
}

TEST_F(ExecutorShutdown, SigtermEndsARankInTheDataParallelAllReduce) {
  WriteJob("allreduce", 1, 2, 40);
  WritePlans(40);
  StartRanks(dir_, 2, redis_->password(),
             "--config job.json --plans plans --run_id ar --metrics_jsonl m.jsonl");
  // Two iterations done: the gradient all-reduce's group is connected.
  ASSERT_TRUE(WaitForLines(dir_ / "m.jsonl", 2)) << RankLogs(dir_, 2);
  Signal(dir_, "rank1", SIGSTOP);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const double seconds = TerminateAndTime(0);
  // pp = 1: the only waits on the peer are all-reduces (the gradients' in
  // the plan, or the iteration's totals).
  ExpectStoppedBySigterm(0, seconds, "stopped by SIGTERM");
  EXPECT_THAT(
      ReadFile(dir_ / "rank0.log"),
      AnyOf(HasSubstr("all-reduce over ranks 0,1: aborted for shutdown"), HasSubstr("all_reduce")));
}

TEST_F(ExecutorShutdown, SigtermEndsARankWaitingForAPlan) {
  WriteJob("plan", 1, 1, 100);
  const std::string token_flag = varipipe::testing::TokenFileFlag(dir_);
  const std::string planner =
      StartPlannerDaemon(dir_, "planner", redis_->password(),
                         "--config job.json --progress_interval_s 0" + token_flag);
  ASSERT_FALSE(planner.empty()) << ReadFile(dir_ / "planner.log");
  // Three iterations run and are reported ...
  StartRanks(dir_, 1, redis_->password(),
             absl::StrCat("--planner ", planner, token_flag, " --run_id first --iterations 3"));
  ASSERT_EQ(WaitForRanks(dir_, 1), 0) << RankLogs(dir_, 1);
  // ... so iteration 50 is beyond the planning window (2 + 1 + plan_ahead 4):
  // nobody plans it, and the rank waits for it (up to --plan_wait_s).
  StartRanks(dir_, 1, redis_->password(),
             absl::StrCat("--planner ", planner, token_flag,
                          " --run_id second --first_iteration 50 --iterations 1"));
  ASSERT_TRUE(WaitForText(dir_ / "rank0.log", "transport: ")) << RankLogs(dir_, 1);
  std::this_thread::sleep_for(std::chrono::seconds(2));  // into the plan wait
  const double seconds = TerminateAndTime(0);
  ExpectStoppedBySigterm(0, seconds, "iteration 50");
  EXPECT_THAT(ReadFile(dir_ / "rank0.log"),
              AnyOf(HasSubstr("the plan of iteration 50"), HasSubstr("before iteration 50")));
}

// Rank 0 fails at start-up (its --metrics_jsonl is a directory; only rank 0
// writes metrics), after the rendezvous. Rank 1 then fails on the transfer
// with it, and names rank 0 by its own error (rank 0 reported it) first,
// then its own transfer.
TEST_F(ExecutorShutdown, AStartUpFailureIsNamedNotBlamed) {
  WriteJob("startup", 2, 1, 10);
  WritePlans(10);
  std::filesystem::create_directories(dir_ / "metrics-dir");
  StartRanks(dir_, 2, redis_->password(),
             "--config job.json --plans plans --run_id startup --metrics_jsonl metrics-dir");
  ASSERT_EQ(WaitForRanks(dir_, 2), 1);
  const std::string logs = RankLogs(dir_, 2);
  EXPECT_EQ(RankExit(dir_, 0), 1) << logs;
  EXPECT_EQ(RankExit(dir_, 1), 1) << logs;
  const std::string rank1 = ReadFile(dir_ / "rank1.log");
  EXPECT_THAT(rank1, AllOf(HasSubstr("ended because rank 0 failed:"),
                           HasSubstr("cannot open for appending"),
                           HasSubstr("(this rank was at: ")))
      << logs;
  EXPECT_LT(rank1.find("cannot open for appending"), rank1.find("(this rank was at: ")) << logs;
  EXPECT_THAT(rank1, Not(HasSubstr("stopped without reporting an error"))) << logs;
}

}  // namespace
}  // namespace varipipe
