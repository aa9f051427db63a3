// Planner daemons against a real redis-server, over real gRPC on loopback.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config/job_config.h"
#include "common/grpc/client_channel.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "hiredis/hiredis.h"
#include "planner/plan/plan_builder.h"
#include "planner/planner.h"
#include "planner/service/planner_daemon.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_directory.h"
#include "varipipe/v1/service.grpc.pb.h"

namespace varipipe::service {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

class PlannerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
    ASSERT_THAT(redis, IsOk());
    redis_ = *std::move(redis);
    dir_ = ::varipipe::testing::PerTestDirectory("varipipe-service");
    std::ofstream(dir_ / "password") << redis_->password() << "\n";
    // The job's token, registered before any daemon starts: every daemon of
    // the job serves it, and the clients below present it.
    std::ofstream(dir_ / "token") << kToken << "\n";
    fs::permissions(dir_ / "token", fs::perms::owner_read | fs::perms::owner_write);
    absl::StatusOr<std::unique_ptr<RedisClient>> client = RedisClient::Connect(
        {.host = redis_->host(), .port = redis_->port(), .password = redis_->password()});
    ASSERT_THAT(client, IsOk());
    ASSERT_THAT((*client)->Command({"SET", "varipipe:svc:token", kToken}), IsOk());
  }
  void TearDown() override {
    for (pid_t pid : children_) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    fs::remove_all(dir_);
  }

  std::string ConfigJson(uint32_t layers = 4, uint64_t iterations = 60) {
    return absl::StrCat(R"({"job_id": "svc", "model": {"kind": "GPT", "num_layers": )", layers,
                        R"(, "hidden_size": 128, "num_attention_heads": 4, "vocab_size": 1000},
        "parallelism": {"pipeline": 2},
        "cluster": {"device_memory_limit_mib": 2048},
        "data": {"format": "SYNTHETIC", "tokens_per_global_batch": 4096,
                 "max_sequence_length": 512, "synthetic_num_samples": 5000},
        "planner": {"plan_ahead": 8},
        "store": {"redis_address": ")",
                        redis_->address(), R"(", "password_file": ")", (dir_ / "password").string(),
                        R"("},
        "training": {"iterations": )",
                        iterations, "}}");
  }
  v1::JobConfig Config(uint32_t layers = 4, uint64_t iterations = 60) {
    const std::string path = (dir_ / absl::StrCat("job", layers, ".json")).string();
    std::ofstream(path) << ConfigJson(layers, iterations);
    absl::StatusOr<v1::JobConfig> c = LoadJobConfigFile(path);
    EXPECT_THAT(c, IsOk());
    return *c;
  }
  // Starts varipipe-planner as a process; returns its port.
  int SpawnDaemon(const std::string& name) {
    const std::string config = (dir_ / "job4.json").string();
    std::ofstream(config) << ConfigJson();
    const std::string port_file = (dir_ / (name + ".port")).string();
    const std::string log = (dir_ / (name + ".log")).string();
    const pid_t pid = fork();
    if (pid == 0) {
      freopen(log.c_str(), "w", stderr);
      const std::string bin = absl::StrCat(VARIPIPE_BINARY_DIR, "/bin/varipipe-planner");
      execl(bin.c_str(), bin.c_str(), "--config", config.c_str(), "--listen", "127.0.0.1:0",
            "--port_file", port_file.c_str(), "--threads", "1", "--progress_interval_s", "0",
            "--lease_ms", "1000", nullptr);
      _exit(127);
    }
    children_.push_back(pid);
    for (int i = 0; i < 2400; ++i) {  // up to 2 minutes on a loaded machine
      std::ifstream in(port_file);
      int port = 0;
      if (in >> port && port > 0) return port;
      absl::SleepFor(absl::Milliseconds(50));
    }
    ADD_FAILURE() << name << " did not start; log: " << std::ifstream(log).rdbuf();
    return 0;
  }
  static constexpr char kToken[] = "service-test-token-0123456789";
  static std::shared_ptr<grpc::Channel> Channel(int port, const std::string& token = kToken) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = CreateClientChannel(
        absl::StrCat("127.0.0.1:", port), {.token = token}, grpc::ChannelArguments());
    EXPECT_THAT(channel, IsOk());
    return *channel;
  }
  static std::unique_ptr<v1::PlanService::Stub> Stub(int port) {
    return v1::PlanService::NewStub(Channel(port));
  }
  static grpc::Status GetPlan(v1::PlanService::Stub& stub, uint64_t iteration, int rank,
                              v1::PlanEnvelope* out, int timeout_s = 20) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_s));
    v1::GetPlanRequest request;
    request.set_job_id("svc");
    request.set_iteration(iteration);
    request.set_rank(rank);
    return stub.GetPlan(&context, request, out);
  }
  static grpc::Status Report(v1::PlanService::Stub& stub, uint64_t iteration, int rank) {
    grpc::ClientContext context;
    v1::ReportProgressRequest request;
    request.set_job_id("svc");
    request.set_rank(rank);
    request.set_iteration(iteration);
    v1::ReportProgressResponse response;
    return stub.ReportProgress(&context, request, &response);
  }

  std::unique_ptr<RedisServer> redis_;
  fs::path dir_;
  std::vector<pid_t> children_;
};

// Two daemon processes share a 60-iteration job; one is killed with SIGKILL
// midway. Every iteration is published exactly once, equals the plan of a
// single in-process planner, and no plan is left after acknowledgement.
TEST_F(PlannerServiceTest, TwoDaemonsShareAJobAndSurviveAKill) {
  const int port_a = SpawnDaemon("a");
  const int port_b = SpawnDaemon("b");
  ASSERT_GT(port_a, 0);
  ASSERT_GT(port_b, 0);
  auto a = Stub(port_a);
  auto b = Stub(port_b);
  const v1::JobConfig config = Config();
  absl::StatusOr<planner::Planner> reference = planner::Planner::Create(config);
  ASSERT_THAT(reference, IsOk());
  absl::StatusOr<std::unique_ptr<SampleDataset>> dataset = OpenSampleDataset(config);
  ASSERT_THAT(dataset, IsOk());
  absl::StatusOr<std::unique_ptr<MiniBatchSampler>> sampler = MiniBatchSampler::Create(
      (*dataset)->AllLengths(), {.seed = config.data().seed(),
                                 .tokens_per_global_batch = config.data().tokens_per_global_batch(),
                                 .max_input_len = config.data().max_sequence_length()});
  ASSERT_THAT(sampler, IsOk());
  std::map<std::string, int> planners;
  for (uint64_t i = 0; i < 60; ++i) {
    if (i == 30) {
      kill(children_[0], SIGKILL);  // daemon a dies with whatever it held
      waitpid(children_[0], nullptr, 0);
      children_.erase(children_.begin());
    }
    const SampledMiniBatch sampled = (*sampler)->Get(i);
    absl::StatusOr<planner::PlanningResult> expected = reference->Plan(
        {.iteration = i, .sample_ids = sampled.sample_ids, .lengths = sampled.lengths});
    ASSERT_THAT(expected, IsOk());
    for (int rank = 0; rank < 2; ++rank) {
      v1::PlanService::Stub& stub = i < 30 && (i + rank) % 2 == 0 ? *a : *b;
      v1::PlanEnvelope envelope;
      const grpc::Status s = GetPlan(stub, i, rank, &envelope);
      ASSERT_TRUE(s.ok()) << "iteration " << i << " rank " << rank << ": " << s.error_message();
      EXPECT_EQ(planner::SerializePlanDeterministically(envelope.plan()),
                planner::SerializePlanDeterministically(expected->plans[rank]))
          << "iteration " << i << " rank " << rank;
      ++planners[envelope.planner_id()];
    }
    for (int rank = 0; rank < 2; ++rank) ASSERT_TRUE(Report(*b, i, rank).ok());
  }
  EXPECT_EQ(planners.size(), 2u) << "both daemons planned";
  absl::StatusOr<std::unique_ptr<RedisInstructionStore>> store = RedisInstructionStore::Open(
      {.host = redis_->host(), .port = redis_->port(), .password = redis_->password()},
      {.job_id = "svc", .world_size = 2, .total_iterations = 60});
  ASSERT_THAT(store, IsOk());
  absl::StatusOr<StoreCounters> c = (*store)->Counters();
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->published, 60u);
  EXPECT_EQ(c->acknowledged, 60u);
  absl::StatusOr<RedisReply> left = (*store)->redis().Command({"KEYS", "varipipe:svc:plan:*"});
  ASSERT_THAT(left, IsOk());
  EXPECT_EQ(left->size(), 0u) << "plans left in Redis";
}

TEST_F(PlannerServiceTest, GetPlanWaitsAndReportsErrors) {
  DaemonOptions options;
  options.worker_threads = -1;  // on-demand only
  options.progress_interval = absl::ZeroDuration();
  absl::StatusOr<std::unique_ptr<PlannerDaemon>> daemon = PlannerDaemon::Start(Config(), options);
  ASSERT_THAT(daemon, IsOk());
  auto stub = Stub((*daemon)->port());
  v1::PlanEnvelope envelope;
  const absl::Time start = absl::Now();
  grpc::Status s = GetPlan(*stub, 3, 1, &envelope);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(envelope.plan().iteration(), 3u);
  EXPECT_EQ(envelope.plan().rank(), 1);
  EXPECT_EQ(GetPlan(*stub, 60, 0, &envelope).error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(GetPlan(*stub, 0, 5, &envelope).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  grpc::ClientContext context;
  v1::GetPlanRequest other;
  other.set_job_id("other");
  EXPECT_EQ(stub->GetPlan(&context, other, &envelope).error_code(), grpc::StatusCode::NOT_FOUND);
  (*daemon)->Shutdown();
}

TEST_F(PlannerServiceTest, WrongPasswordAndDifferentConfigAreRefused) {
  std::ofstream(dir_ / "password", std::ios::trunc) << "not-the-password\n";
  EXPECT_THAT(PlannerDaemon::Start(Config(), {}),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("rejected the password")));
  std::ofstream(dir_ / "password", std::ios::trunc) << redis_->password() << "\n";
  DaemonOptions options;
  options.worker_threads = -1;
  options.progress_interval = absl::ZeroDuration();
  absl::StatusOr<std::unique_ptr<PlannerDaemon>> first = PlannerDaemon::Start(Config(4), options);
  ASSERT_THAT(first, IsOk());
  EXPECT_THAT(PlannerDaemon::Start(Config(6), options),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("another config")));
}

TEST_F(PlannerServiceTest, BackPressureHoldsWithoutProgress) {
  DaemonOptions options;
  options.worker_threads = 2;
  options.progress_interval = absl::ZeroDuration();
  absl::StatusOr<std::unique_ptr<PlannerDaemon>> daemon = PlannerDaemon::Start(Config(), options);
  ASSERT_THAT(daemon, IsOk());
  // The daemon plans up to planner.plan_ahead (8) iterations, however long
  // that takes, and then holds: a broken bound would publish more in the
  // half second after.
  const auto published_reaches = [&](uint64_t n) {
    for (int i = 0; i < 2400 && (*daemon)->Status().iterations_published() < n; ++i) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    absl::SleepFor(absl::Milliseconds(500));
    return (*daemon)->Status().iterations_published();
  };
  EXPECT_EQ(published_reaches(8), 8u);
  auto stub = Stub((*daemon)->port());
  for (int rank = 0; rank < 2; ++rank) {
    v1::PlanEnvelope envelope;
    ASSERT_TRUE(GetPlan(*stub, 3, rank, &envelope).ok());  // only a fetched plan is reported
    ASSERT_TRUE(Report(*stub, 3, rank).ok());
  }
  EXPECT_EQ(published_reaches(12), 12u);  // 4 completed + 8 ahead
}

// Single-machine mode: no store address, the daemon runs its own Redis.
// Also GetJob, WatchPlans and the health service.
TEST_F(PlannerServiceTest, EmbeddedRedisJobWatchAndHealth) {
  v1::JobConfig config = Config(4, 10);
  config.mutable_store()->clear_redis_address();
  config.mutable_store()->clear_password_file();
  DaemonOptions options;
  options.worker_threads = 1;
  options.progress_interval = absl::ZeroDuration();
  absl::StatusOr<std::unique_ptr<PlannerDaemon>> daemon = PlannerDaemon::Start(config, options);
  ASSERT_THAT(daemon, IsOk());
  EXPECT_THAT((*daemon)->store_address(), HasSubstr("127.0.0.1:"));
  EXPECT_NE((*daemon)->store_address(), redis_->address());
  // Its own store: a token generated at registration.
  auto channel = Channel((*daemon)->port(), (*daemon)->token());
  auto stub = v1::PlanService::NewStub(channel);
  {
    grpc::ClientContext context;
    v1::GetJobResponse job;
    ASSERT_TRUE(stub->GetJob(&context, {}, &job).ok());
    EXPECT_EQ(job.config().job_id(), "svc");
    EXPECT_EQ(job.store_address(), (*daemon)->store_address());
    EXPECT_EQ(job.config_hash(), ConfigHash(config));
  }
  {
    // WatchPlans streams rank 1's plans from iteration 2 to the end, as
    // ranks report progress.
    std::thread reporter([&] {
      for (uint64_t i = 0; i < 10; ++i) {
        for (int rank = 0; rank < 2; ++rank) {
          v1::PlanEnvelope envelope;
          ASSERT_TRUE(GetPlan(*stub, i, rank, &envelope).ok());
          ASSERT_TRUE(Report(*stub, i, rank).ok());
        }
      }
    });
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::WatchPlansRequest request;
    request.set_rank(1);
    request.set_first_iteration(2);
    auto reader = stub->WatchPlans(&context, request);
    std::vector<uint64_t> seen;
    v1::PlanEnvelope envelope;
    while (reader->Read(&envelope)) seen.push_back(envelope.plan().iteration());
    reporter.join();
    EXPECT_TRUE(reader->Finish().ok());
    EXPECT_EQ(seen, (std::vector<uint64_t>{2, 3, 4, 5, 6, 7, 8, 9}));
  }
  {
    // grpc.health.v1.Health/Check with an empty request (the whole server);
    // the reply {status: SERVING} encodes as the bytes 08 01.
    grpc::GenericStub generic(channel);
    grpc::ClientContext context;
    grpc::Slice empty(std::string(""));
    grpc::ByteBuffer request(&empty, 1);
    grpc::ByteBuffer response;
    std::promise<grpc::Status> done;
    generic.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                      &response, [&](grpc::Status s) { done.set_value(s); });
    ASSERT_TRUE(done.get_future().get().ok());
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(response.Dump(&slices).ok());
    std::string bytes;
    for (const grpc::Slice& slice : slices) {
      bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
    EXPECT_EQ(bytes, std::string("\x08\x01", 2));
  }
  (*daemon)->Shutdown();
}

// varipipe-ctl against a daemon process: status, plan and trace.
TEST_F(PlannerServiceTest, CtlShowsStatusPlansAndTraces) {
  const int port = SpawnDaemon("ctl");
  ASSERT_GT(port, 0);
  const std::string ctl =
      absl::StrCat(VARIPIPE_BINARY_DIR, "/bin/varipipe-ctl --planner 127.0.0.1:", port,
                   " --token_file ", (dir_ / "token").string(), " ");
  const auto run = [](const std::string& command) {
    std::string output;
    FILE* pipe = popen((command + " 2>&1").c_str(), "r");
    char buffer[4096];
    size_t n = 0;
    while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
    const int status = pclose(pipe);
    return std::make_pair(WEXITSTATUS(status), output);
  };
  auto [code, out] = run(ctl + "plan --iteration 1 --rank 1");
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("iteration 1 rank 1 (dp 0, pp 1)"));
  EXPECT_THAT(out, HasSubstr("recv_start ACTIVATION from 0"));
  std::tie(code, out) = run(ctl + "status");
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("job svc"));
  EXPECT_THAT(out, HasSubstr("store healthy"));
  const std::string trace = (dir_ / "trace.json").string();
  std::tie(code, out) = run(ctl + "trace --iteration 0 --out " + trace);
  EXPECT_EQ(code, 0) << out;
  EXPECT_GT(fs::file_size(trace), 100u);
  std::tie(code, out) = run(ctl + "plan --iteration 60 --rank 0");
  EXPECT_NE(code, 0);
  EXPECT_THAT(out, HasSubstr("past the job's last"));
  std::tie(code, out) = run(ctl + "frobnicate");
  EXPECT_EQ(code, 2);
}

// Redis is stopped and restarted without persistence mid-run: the daemon
// reconnects, registers the job again and re-plans what was lost; clients
// keep getting plans.
TEST_F(PlannerServiceTest, SurvivesARedisRestart) {
  DaemonOptions options;
  options.worker_threads = 1;
  options.progress_interval = absl::ZeroDuration();
  absl::StatusOr<std::unique_ptr<PlannerDaemon>> daemon = PlannerDaemon::Start(Config(), options);
  ASSERT_THAT(daemon, IsOk());
  auto stub = Stub((*daemon)->port());
  std::vector<std::string> before;
  for (uint64_t i = 0; i < 6; ++i) {
    for (int rank = 0; rank < 2; ++rank) {
      v1::PlanEnvelope envelope;
      ASSERT_TRUE(GetPlan(*stub, i, rank, &envelope).ok());
      ASSERT_TRUE(Report(*stub, i, rank).ok());
    }
  }
  const int port = redis_->port();
  const std::string password = redis_->password();
  ASSERT_THAT(redis_->Stop(), IsOk());
  redis_.reset();
  absl::SleepFor(absl::Milliseconds(500));
  absl::StatusOr<std::unique_ptr<RedisServer>> again =
      RedisServer::Start({.password = password, .port = port});
  ASSERT_THAT(again, IsOk());
  redis_ = *std::move(again);
  for (uint64_t i = 6; i < 12; ++i) {
    for (int rank = 0; rank < 2; ++rank) {
      v1::PlanEnvelope envelope;
      const grpc::Status s = GetPlan(*stub, i, rank, &envelope, 30);
      ASSERT_TRUE(s.ok()) << "iteration " << i << ": " << s.error_message();
      EXPECT_EQ(envelope.plan().iteration(), i);
      ASSERT_TRUE(Report(*stub, i, rank).ok());
    }
  }
  EXPECT_TRUE((*daemon)->Status().store_healthy());
}

// Keys of the job matching `pattern` (after "varipipe:svc:"), found with
// SCAN as an operator would.
std::vector<std::string> ScanKeys(RedisServer& redis, const std::string& pattern) {
  absl::StatusOr<std::unique_ptr<RedisClient>> client = RedisClient::Connect(
      {.host = redis.host(), .port = redis.port(), .password = redis.password()});
  EXPECT_THAT(client, IsOk());
  std::vector<std::string> keys;
  if (!client.ok()) return keys;
  std::string cursor = "0";
  do {
    absl::StatusOr<RedisReply> reply = (*client)->Command(
        {"SCAN", cursor, "MATCH", absl::StrCat("varipipe:svc:", pattern), "COUNT", "1000"});
    EXPECT_THAT(reply, IsOk());
    if (!reply.ok() || reply->size() != 2) break;
    cursor = ElementString(reply->element(0));
    const redisReply* batch = reply->element(1);
    for (size_t i = 0; i < batch->elements; ++i) keys.push_back(ElementString(batch->element[i]));
  } while (cursor != "0");
  return keys;
}

// WatchPlans with max_ahead 2 never streams a plan more than 2 iterations
// past the rank's last report (or past first_iteration before any): with 8
// iterations published, rank 0's stream holds at 0 and 1, and each report
// releases exactly one more plan. The daemon records every plan it streams
// as fetched, so the store shows what went out.
TEST_F(PlannerServiceTest, WatchPlansHonoursMaxAhead) {
  DaemonOptions options;
  options.worker_threads = 1;
  options.progress_interval = absl::ZeroDuration();
  absl::StatusOr<std::unique_ptr<PlannerDaemon>> daemon = PlannerDaemon::Start(Config(), options);
  ASSERT_THAT(daemon, IsOk());
  for (int i = 0; i < 2400 && (*daemon)->Status().iterations_published() < 8; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_GE((*daemon)->Status().iterations_published(), 8u);
  auto stub = Stub((*daemon)->port());
  std::mutex mu;
  std::condition_variable changed;
  std::vector<uint64_t> seen;
  grpc::ClientContext context;
  v1::WatchPlansRequest request;
  request.set_job_id("svc");
  request.set_rank(0);
  request.set_first_iteration(0);
  request.set_max_ahead(2);
  auto reader = stub->WatchPlans(&context, request);
  std::thread watcher([&] {
    v1::PlanEnvelope envelope;
    while (reader->Read(&envelope)) {
      std::lock_guard<std::mutex> lock(mu);
      seen.push_back(envelope.plan().iteration());
      changed.notify_all();
    }
  });
  absl::StatusOr<std::unique_ptr<RedisClient>> redis = RedisClient::Connect(
      {.host = redis_->host(), .port = redis_->port(), .password = redis_->password()});
  ASSERT_THAT(redis, IsOk());
  const auto fetched = [&](uint64_t iteration) {
    absl::StatusOr<RedisReply> r =
        (*redis)->Command({"SISMEMBER", absl::StrCat("varipipe:svc:fetched:", iteration), "0"});
    return r.ok() && r->integer() == 1;
  };
  // Waits until `n` plans arrived, then gives an unbounded stream a second
  // to overshoot; returns what arrived.
  const auto received = [&](size_t n) {
    {
      std::unique_lock<std::mutex> lock(mu);
      changed.wait_for(lock, std::chrono::minutes(2), [&] { return seen.size() >= n; });
    }
    absl::SleepFor(absl::Seconds(1));
    std::lock_guard<std::mutex> lock(mu);
    return seen;
  };
  EXPECT_EQ(received(2), (std::vector<uint64_t>{0, 1}));
  EXPECT_FALSE(fetched(2)) << "plan 2 went out before rank 0 reported iteration 0";
  ASSERT_TRUE(Report(*stub, 0, 0).ok());
  EXPECT_EQ(received(3), (std::vector<uint64_t>{0, 1, 2}));
  EXPECT_FALSE(fetched(3));
  ASSERT_TRUE(Report(*stub, 1, 0).ok());
  ASSERT_TRUE(Report(*stub, 2, 0).ok());
  EXPECT_EQ(received(5), (std::vector<uint64_t>{0, 1, 2, 3, 4}));
  EXPECT_FALSE(fetched(5));
  context.TryCancel();
  watcher.join();
  (void)reader->Finish();
  (*daemon)->Shutdown();
}

// Redis restarts without its data in the middle of a 24-iteration run: the
// daemon registers the job again and plans from iteration 0 while the ranks
// are at 8. Acknowledging a later iteration retires those plans, so once the
// run ends no plan (nor its fetch and acknowledgement sets) is left, and the
// acknowledged count equals the published one.
TEST_F(PlannerServiceTest, ARedisRestartLeavesNoPlanBehind) {
  constexpr uint64_t kIterations = 24;
  DaemonOptions options;
  options.worker_threads = 1;
  options.progress_interval = absl::ZeroDuration();
  absl::StatusOr<std::unique_ptr<PlannerDaemon>> daemon =
      PlannerDaemon::Start(Config(4, kIterations), options);
  ASSERT_THAT(daemon, IsOk());
  auto stub = Stub((*daemon)->port());
  const auto run = [&](uint64_t from, uint64_t to) {
    for (uint64_t i = from; i < to; ++i) {
      for (int rank = 0; rank < 2; ++rank) {
        v1::PlanEnvelope envelope;
        const grpc::Status s = GetPlan(*stub, i, rank, &envelope, 60);
        ASSERT_TRUE(s.ok()) << "iteration " << i << ": " << s.error_message();
        ASSERT_EQ(envelope.plan().iteration(), i);
        ASSERT_TRUE(Report(*stub, i, rank).ok()) << "iteration " << i;
      }
    }
  };
  run(0, 8);
  const int port = redis_->port();
  const std::string password = redis_->password();
  ASSERT_THAT(redis_->Stop(), IsOk());
  redis_.reset();
  absl::StatusOr<std::unique_ptr<RedisServer>> again =
      RedisServer::Start({.password = password, .port = port});
  ASSERT_THAT(again, IsOk());
  redis_ = *std::move(again);
  // The daemon plans iterations 0.. again once it is back (up to
  // plan_ahead = 8 while no rank has reported since).
  for (int i = 0; i < 2400 && (*daemon)->Status().iterations_published() < 4; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  run(8, kIterations);
  (*daemon)->Shutdown();
  EXPECT_THAT(ScanKeys(*redis_, "plan:*"), ::testing::IsEmpty());
  EXPECT_THAT(ScanKeys(*redis_, "fetched:*"), ::testing::IsEmpty());
  EXPECT_THAT(ScanKeys(*redis_, "acks:*"), ::testing::IsEmpty());
  absl::StatusOr<std::unique_ptr<RedisInstructionStore>> store = RedisInstructionStore::Open(
      {.host = redis_->host(), .port = redis_->port(), .password = redis_->password()},
      {.job_id = "svc", .world_size = 2, .total_iterations = kIterations});
  ASSERT_THAT(store, IsOk());
  absl::StatusOr<StoreCounters> c = (*store)->Counters();
  ASSERT_THAT(c, IsOk());
  std::printf("after the restart: %llu plans published, %llu acknowledged\n",
              static_cast<unsigned long long>(c->published),
              static_cast<unsigned long long>(c->acknowledged));
  EXPECT_GT(c->published, kIterations - 8) << "iterations before the restart were planned again";
  EXPECT_EQ(c->acknowledged, c->published);
}

}  // namespace
}  // namespace varipipe::service
