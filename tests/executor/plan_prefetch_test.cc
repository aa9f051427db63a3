// PlannerServiceSource's prefetcher against in-process planner daemons
// (real gRPC on loopback) sharing a real redis-server: plans streamed over
// WatchPlans equal GetPlan's, the stream fails over to the next planner,
// follows the executor's jumps, and prefetch 0 keeps plain GetPlan.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config/job_config.h"
#include "common/grpc/call_token.h"
#include "executor/runtime/plan_source.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "planner/service/planner_daemon.h"
#include "planner/service/redis_instruction_store.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_directory.h"
#include "varipipe/v1/service.grpc.pb.h"

namespace varipipe::executor {
namespace {

namespace fs = std::filesystem;
using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;
using ::varipipe::service::DaemonOptions;
using ::varipipe::service::PlannerDaemon;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::RedisServer;
using ::varipipe::testing::StatusIs;

constexpr absl::Duration kWait = absl::Seconds(20);

class PlanPrefetchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
    ASSERT_THAT(redis, IsOk());
    redis_ = *std::move(redis);
    dir_ = ::varipipe::testing::PerTestDirectory("varipipe-prefetch");
    std::ofstream(dir_ / "password") << redis_->password() << "\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A small GPT job, pp=2 (world size 2).
  v1::JobConfig Config(uint64_t iterations, uint64_t plan_ahead) {
    const std::string json = absl::StrCat(
        R"({"job_id": "prefetch", "model": {"kind": "GPT", "num_layers": 4, "hidden_size": 128,
        "num_attention_heads": 4, "vocab_size": 1000},
        "parallelism": {"pipeline": 2},
        "cluster": {"device_memory_limit_mib": 2048},
        "data": {"format": "SYNTHETIC", "tokens_per_global_batch": 4096,
                 "max_sequence_length": 512, "synthetic_num_samples": 2000},
        "planner": {"plan_ahead": )",
        plan_ahead, R"(},
        "store": {"redis_address": ")",
        redis_->address(), R"(", "password_file": ")", (dir_ / "password").string(), R"("},
        "training": {"iterations": )",
        iterations, "}}");
    absl::StatusOr<v1::JobConfig> config = ParseJobConfigJson(json, "test");
    EXPECT_THAT(config, IsOk());
    ApplyJobConfigDefaults(*config);
    EXPECT_THAT(ValidateJobConfig(*config, "test"), IsOk());
    return *config;
  }
  static std::unique_ptr<PlannerDaemon> StartDaemon(const v1::JobConfig& config) {
    DaemonOptions options;
    options.worker_threads = 1;
    options.progress_interval = absl::ZeroDuration();
    absl::StatusOr<std::unique_ptr<PlannerDaemon>> daemon = PlannerDaemon::Start(config, options);
    EXPECT_THAT(daemon, IsOk());
    return daemon.ok() ? *std::move(daemon) : nullptr;
  }
  static std::string Address(const PlannerDaemon& daemon) {
    return absl::StrCat("127.0.0.1:", daemon.port());
  }
  // The plan GetPlan returns, asked directly.
  static v1::ExecutionPlan Direct(const PlannerDaemon& daemon, uint64_t iteration, int rank) {
    auto stub = v1::PlanService::NewStub(
        *CreateClientChannel(Address(daemon), {.token = daemon.token()}, grpc::ChannelArguments()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    v1::GetPlanRequest request;
    request.set_iteration(iteration);
    request.set_rank(rank);
    v1::PlanEnvelope envelope;
    const grpc::Status s = stub->GetPlan(&context, request, &envelope);
    EXPECT_TRUE(s.ok()) << "iteration " << iteration << ": " << s.error_message();
    return envelope.plan();
  }
  static void ExpectPlan(PlannerServiceSource& source, const PlannerDaemon& daemon,
                         uint64_t iteration, int rank) {
    absl::StatusOr<v1::ExecutionPlan> plan = source.Get(iteration);
    ASSERT_THAT(plan, IsOk()) << "iteration " << iteration;
    EXPECT_EQ(plan->iteration(), iteration);
    EXPECT_EQ(plan->rank(), rank);
    EXPECT_TRUE(MessageDifferencer::Equals(*plan, Direct(daemon, iteration, rank)))
        << "iteration " << iteration << " rank " << rank;
  }

  std::unique_ptr<RedisServer> redis_;
  fs::path dir_;
};

// Both ranks fetch every iteration in order and acknowledge it; the planners
// plan ahead as the acknowledgements arrive.
TEST_F(PlanPrefetchTest, StreamsPlansInOrderAndAcknowledges) {
  constexpr uint64_t kIterations = 12;
  std::unique_ptr<PlannerDaemon> daemon = StartDaemon(Config(kIterations, 8));
  ASSERT_NE(daemon, nullptr);
  std::vector<std::unique_ptr<PlannerServiceSource>> sources;
  for (int rank = 0; rank < 2; ++rank) {
    sources.push_back(std::make_unique<PlannerServiceSource>(
        std::vector{Address(*daemon)}, rank, kWait, 4, ClientSecurity{.token = daemon->token()}));
  }
  EXPECT_THAT(sources[0]->Describe(), HasSubstr("prefetching 4 plans ahead"));
  for (uint64_t i = 0; i < kIterations; ++i) {
    for (int rank = 0; rank < 2; ++rank) ExpectPlan(*sources[rank], *daemon, i, rank);
    for (int rank = 0; rank < 2; ++rank) {
      v1::ReportProgressRequest progress;
      progress.set_iteration(i);
      ASSERT_THAT(sources[rank]->Done(progress), IsOk());
    }
  }
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_GT(sources[rank]->prefetched_plans(), 0u) << "rank " << rank;
    EXPECT_EQ(sources[rank]->prefetched_plans() + sources[rank]->direct_plans(), kIterations);
  }
  absl::StatusOr<std::unique_ptr<service::RedisInstructionStore>> store =
      service::RedisInstructionStore::Open(
          {.host = redis_->host(), .port = redis_->port(), .password = redis_->password()},
          {.job_id = "prefetch", .world_size = 2, .total_iterations = kIterations});
  ASSERT_THAT(store, IsOk());
  absl::StatusOr<service::StoreCounters> counters = (*store)->Counters();
  ASSERT_THAT(counters, IsOk());
  EXPECT_EQ(counters->acknowledged, kIterations);
  sources.clear();  // closes the streams before the daemon stops
}

// The first planner stops while the stream is open (the planners plan only
// 4 iterations past the acknowledged ones, so the stream waits at the
// frontier): the stream moves to the second planner, which shares the
// store, and keeps prefetching.
TEST_F(PlanPrefetchTest, StreamFailsOverToTheNextPlanner) {
  constexpr uint64_t kIterations = 16;
  const v1::JobConfig config = Config(kIterations, 4);
  std::unique_ptr<PlannerDaemon> a = StartDaemon(config);
  std::unique_ptr<PlannerDaemon> b = StartDaemon(config);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto b_stub = v1::PlanService::NewStub(
      grpc::CreateChannel(Address(*b), grpc::InsecureChannelCredentials()));
  PlannerServiceSource source({Address(*a), Address(*b)}, 0, kWait, 4, {.token = a->token()});
  uint64_t published_by_a = kIterations;  // a streamed nothing past these
  uint64_t streamed_from_b = 0;
  for (uint64_t i = 0; i < kIterations; ++i) {
    if (i == 4) {
      EXPECT_GT(source.prefetched_plans(), 0u);
      a->Shutdown();  // cancels the open stream
      published_by_a = b->Status().iterations_published();
    }
    const uint64_t prefetched = source.prefetched_plans();
    ExpectPlan(source, *b, i, 0);
    if (i >= published_by_a && source.prefetched_plans() > prefetched) ++streamed_from_b;
    v1::ReportProgressRequest progress;
    progress.set_iteration(i);
    ASSERT_THAT(source.Done(progress), IsOk());
    // The other rank, for the planners' back-pressure: it fetches its plan
    // (a rank may acknowledge only a plan it fetched) and reports, with the
    // job token as every client does.
    grpc::ClientContext fetch;
    fetch.AddMetadata(kCallTokenHeader, kCallTokenScheme + b->token());
    v1::GetPlanRequest request;
    request.set_job_id(config.job_id());
    request.set_iteration(i);
    request.set_rank(1);
    v1::PlanEnvelope envelope;
    const grpc::Status fetched = b_stub->GetPlan(&fetch, request, &envelope);
    ASSERT_TRUE(fetched.ok()) << fetched.error_message();
    grpc::ClientContext context;
    context.AddMetadata(kCallTokenHeader, kCallTokenScheme + b->token());
    progress.set_rank(1);
    v1::ReportProgressResponse response;
    const grpc::Status reported = b_stub->ReportProgress(&context, progress, &response);
    ASSERT_TRUE(reported.ok()) << reported.error_message();
  }
  EXPECT_LT(published_by_a, kIterations);
  EXPECT_GT(streamed_from_b, 0u);
}

// The executor moves to another iteration (e.g. it resumed from a
// checkpoint): a short step forward skips a few streamed plans, a longer one
// or a step back restarts the stream there.
TEST_F(PlanPrefetchTest, JumpsRestartTheStream) {
  constexpr uint64_t kIterations = 24;
  std::unique_ptr<PlannerDaemon> daemon = StartDaemon(Config(kIterations, kIterations));
  ASSERT_NE(daemon, nullptr);
  daemon->WaitUntilAllPublished();
  PlannerServiceSource source({Address(*daemon)}, 1, kWait, 4, {.token = daemon->token()});
  source.StartPrefetch(0);
  const std::vector<uint64_t> order = {0, 1, 7, 8, 20, 21, 2, 3, 4};
  for (uint64_t i : order) ExpectPlan(source, *daemon, i, 1);
  EXPECT_GT(source.prefetched_plans(), 0u);
  EXPECT_EQ(source.prefetched_plans() + source.direct_plans(), order.size());
  // Past the job's end: GetPlan's error, from the direct path.
  EXPECT_THAT(source.Get(kIterations), StatusIs(absl::StatusCode::kOutOfRange));
  ExpectPlan(source, *daemon, 5, 1);
}

TEST_F(PlanPrefetchTest, WithoutPrefetchEveryPlanIsFetchedDirectly) {
  constexpr uint64_t kIterations = 6;
  std::unique_ptr<PlannerDaemon> daemon = StartDaemon(Config(kIterations, kIterations));
  ASSERT_NE(daemon, nullptr);
  PlannerServiceSource source({Address(*daemon)}, 0, kWait, 0, {.token = daemon->token()});
  EXPECT_THAT(source.Describe(), HasSubstr("no prefetching"));
  for (uint64_t i = 0; i < kIterations; ++i) ExpectPlan(source, *daemon, i, 0);
  EXPECT_EQ(source.prefetched_plans(), 0u);
  EXPECT_EQ(source.direct_plans(), kIterations);
  // A rank outside the job: the stream is refused and Get reports GetPlan's
  // error at once instead of waiting out its plan wait (10 minutes here, so
  // the bound below is a wide margin, not a speed requirement).
  PlannerServiceSource outside({Address(*daemon)}, 5, absl::Minutes(10), 4,
                               {.token = daemon->token()});
  const absl::Time start = absl::Now();
  EXPECT_THAT(outside.Get(0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_LT(absl::Now() - start, absl::Minutes(5));
}

}  // namespace
}  // namespace varipipe::executor
