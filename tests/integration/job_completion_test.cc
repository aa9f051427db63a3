// The end of a job at the planner daemons (docs/operations.md, "The end of a
// job"), with real varipipe-planner processes sharing a real redis-server and
// a test acting as the job's two executor ranks over gRPC:
// - a daemon serves on while any rank has not reported the last iteration
//   (one rank's report of it is not enough);
// - once both did, each daemon sharing the job logs "job complete": the one
//   without --keep_serving exits 0, the one with it serves on (status calls
//   answer) until SIGTERM;
// - --keep_serving with --exit_when_done is a usage error (2);
// - without a profile, the daemon warns at start-up that it plans with the
//   analytic model of a GPU preset and says how to profile.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc/client_channel.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/testing/planner_process.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_directory.h"
#include "varipipe/v1/service.grpc.pb.h"

namespace varipipe {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::PlannerProcess;
using ::varipipe::testing::RedisServer;

constexpr char kToken[] = "completion-test-token-0123456789abcdef";
constexpr uint64_t kIterations = 3;
constexpr int kRanks = 2;  // pipeline 2

class JobCompletionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::varipipe::testing::PerTestDirectory("varipipe-completion");
    std::ofstream(dir_ / "token") << kToken << "\n";
    fs::permissions(dir_ / "token", fs::perms::owner_read | fs::perms::owner_write);
    absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
    ASSERT_THAT(redis, IsOk());
    redis_ = *std::move(redis);
    std::ofstream(dir_ / "password") << redis_->password() << "\n";
    fs::permissions(dir_ / "password", fs::perms::owner_read | fs::perms::owner_write);
    std::ofstream(dir_ / "job.json") << absl::StrCat(
        R"({"job_id": "completion", "model": {"kind": "GPT", "num_layers": 4,
            "hidden_size": 128, "num_attention_heads": 4, "vocab_size": 1000},
          "parallelism": {"pipeline": 2},
          "cluster": {"device_memory_limit_mib": 2048},
          "data": {"format": "SYNTHETIC", "tokens_per_global_batch": 4096,
                   "max_sequence_length": 512, "synthetic_num_samples": 5000},
          "store": {"redis_address": "127.0.0.1:)",
        redis_->port(), R"(", "password_file": ")", (dir_ / "password").string(), R"("},
          "training": {"iterations": )",
        kIterations, "}}");
  }
  void TearDown() override {
    daemons_.clear();  // kills what is still running
    fs::remove_all(dir_);
  }

  PlannerProcess& Spawn(const std::string& name, std::vector<std::string> args = {}) {
    args.insert(args.begin(), {"--config", (dir_ / "job.json").string(), "--listen",
                               "127.0.0.1:0", "--threads", "1", "--token_file",
                               (dir_ / "token").string()});
    daemons_.push_back(PlannerProcess::Spawn(dir_, name, std::move(args)));
    return *daemons_.back();
  }

  static std::shared_ptr<grpc::Channel> Channel(int port) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = CreateClientChannel(
        absl::StrCat("127.0.0.1:", port), {.token = kToken}, grpc::ChannelArguments());
    EXPECT_THAT(channel, IsOk());
    return *channel;
  }
  static std::unique_ptr<grpc::ClientContext> Context() {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    return context;
  }
  // What an executor rank does with an iteration: fetch its plan, report it.
  static void RunIteration(v1::PlanService::Stub& plans, uint64_t iteration, int rank) {
    v1::GetPlanRequest request;
    request.set_job_id("completion");
    request.set_iteration(iteration);
    request.set_rank(rank);
    v1::PlanEnvelope envelope;
    const grpc::Status fetched = plans.GetPlan(Context().get(), request, &envelope);
    ASSERT_TRUE(fetched.ok()) << "iteration " << iteration << " rank " << rank << ": "
                              << fetched.error_message();
    v1::ReportProgressRequest report;
    report.set_job_id("completion");
    report.set_rank(rank);
    report.set_iteration(iteration);
    v1::ReportProgressResponse response;
    const grpc::Status reported = plans.ReportProgress(Context().get(), report, &response);
    ASSERT_TRUE(reported.ok()) << "iteration " << iteration << " rank " << rank << ": "
                               << reported.error_message();
  }

  fs::path dir_;
  std::unique_ptr<RedisServer> redis_;
  std::vector<std::unique_ptr<PlannerProcess>> daemons_;
};

TEST_F(JobCompletionTest, EachDaemonEndsOnceEveryRankReportedTheLastIteration) {
  PlannerProcess& plain = Spawn("plain");
  PlannerProcess& serving = Spawn("serving", {"--keep_serving"});
  const int port = plain.WaitForPort();
  ASSERT_GT(port, 0) << plain.Log();
  const int serving_port = serving.WaitForPort();
  ASSERT_GT(serving_port, 0) << serving.Log();
  const std::unique_ptr<v1::PlanService::Stub> plans = v1::PlanService::NewStub(Channel(port));
  for (uint64_t i = 0; i + 1 < kIterations; ++i) {
    for (int rank = 0; rank < kRanks; ++rank) {
      RunIteration(*plans, i, rank);
      ASSERT_FALSE(HasFatalFailure());
    }
  }
  // Only rank 0 has the last iteration: both daemons serve on.
  RunIteration(*plans, kIterations - 1, 0);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_FALSE(plain.WaitForExit(absl::Seconds(2)).has_value()) << plain.Log();
  EXPECT_THAT(plain.Log(), Not(HasSubstr("job complete")));
  // Rank 1 too: the job is complete.
  RunIteration(*plans, kIterations - 1, 1);
  ASSERT_FALSE(HasFatalFailure());
  const std::optional<int> exit_code = plain.WaitForExit(absl::Seconds(60));
  ASSERT_TRUE(exit_code.has_value()) << "the daemon did not exit\n" << plain.Log();
  EXPECT_EQ(*exit_code, 0) << plain.Log();
  EXPECT_THAT(plain.Log(), HasSubstr("job complete: all 2 executor ranks reported iteration 2, "
                                     "the last of 3"));
  // The daemon with --keep_serving saw it too, and still answers.
  for (int i = 0; i < 600 && serving.Log().find("job complete") == std::string::npos; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_THAT(serving.Log(), HasSubstr("serving on (--keep_serving)"));
  const std::unique_ptr<v1::StatusService::Stub> status =
      v1::StatusService::NewStub(Channel(serving_port));
  v1::PlannerStatus answer;
  const grpc::Status asked = status->GetPlannerStatus(Context().get(), {}, &answer);
  EXPECT_TRUE(asked.ok()) << asked.error_message() << "\n" << serving.Log();
  EXPECT_EQ(answer.iterations_acknowledged(), kIterations);
  EXPECT_FALSE(serving.WaitForExit(absl::Milliseconds(500)).has_value()) << serving.Log();
  EXPECT_EQ(serving.Stop(), 0) << serving.Log();
}

TEST_F(JobCompletionTest, KeepServingContradictsExitWhenDone) {
  PlannerProcess& daemon = Spawn("both", {"--keep_serving", "--exit_when_done"});
  EXPECT_EQ(daemon.WaitForExit(absl::Seconds(60)), 2) << daemon.Log();
  EXPECT_THAT(daemon.Log(), HasSubstr("--exit_when_done and --keep_serving contradict"));
}

// Part of docs/cost-model.md, "Which device the cost model describes".
TEST_F(JobCompletionTest, WithoutAProfileTheDaemonSaysWhichDeviceItPlansFor) {
  PlannerProcess& daemon = Spawn("analytic");
  ASSERT_GT(daemon.WaitForPort(), 0) << daemon.Log();
  const std::string log = daemon.Log();
  EXPECT_THAT(log, HasSubstr("no profile: planning with the analytic model of a100-40gb "
                             "(cluster.hardware; no planner.cost_model_path)"));
  EXPECT_THAT(log, HasSubstr("varipipe-profile --config job.json --out profile.json"));
  EXPECT_THAT(log, HasSubstr("set planner.cost_model_path"));
  EXPECT_EQ(daemon.Stop(), 0) << log;
}

}  // namespace
}  // namespace varipipe
