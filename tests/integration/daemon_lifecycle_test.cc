// A planner daemon's start and stop (docs/operations.md, "Planner daemons"),
// with real varipipe-planner processes, a real redis-server and real gRPC on
// loopback:
// - the port is bound before the slow start-up work, so a second daemon on a
//   taken port exits 1 at once, naming the address, without starting Redis;
// - while start-up runs, calls end with UNAVAILABLE ("starting: ..."), the
//   health service says NOT_SERVING and the port file does not exist yet;
// - SIGTERM stops an idle daemon (its embedded redis-server included) at
//   once with status 0, and one blocked in start-up within the start-up
//   grace (2 s) with 143.
// The times are printed; the bounds asserted are generous (a loaded machine),
// the numbers to expect are in the comments.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc/client_channel.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/testing/health_check.h"
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
using ::varipipe::testing::HealthStatus;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::PlannerProcess;

constexpr char kToken[] = "lifecycle-test-token-0123456789abcdef";

// Processes whose parent is `parent` (from /proc/PID/stat).
std::vector<pid_t> Children(pid_t parent) {
  std::vector<pid_t> children;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator("/proc", error)) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid)) continue;
    std::ifstream in(entry.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // "PID (COMM) STATE PPID ...": COMM may hold spaces, so after the last ')'.
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    const std::vector<std::string> fields =
        absl::StrSplit(stat.substr(close + 2), ' ', absl::SkipEmpty());
    pid_t ppid = 0;
    if (fields.size() > 1 && absl::SimpleAtoi(fields[1], &ppid) && ppid == parent) {
      children.push_back(pid);
    }
  }
  return children;
}

// The port a daemon logged when it bound it ("listening on ... (port N)"),
// before its start-up work; 0 when it did not within `timeout`.
int ListeningPort(PlannerProcess& daemon, absl::Duration timeout = absl::Minutes(1)) {
  const std::string marker = "(port ";
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    const std::string log = daemon.Log();
    const size_t at = log.find("listening on ");
    if (at != std::string::npos) {
      const size_t open = log.find(marker, at);
      const size_t close = log.find(')', open);
      int port = 0;
      if (open != std::string::npos && close != std::string::npos &&
          absl::SimpleAtoi(log.substr(open + marker.size(), close - open - marker.size()), &port)) {
        return port;
      }
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return 0;
}

// A TCP listener on 127.0.0.1 that never accepts: the kernel completes the
// handshakes, so a Redis client connects and then waits for answers that
// never come (a stuck Redis; start-up blocks in its first command).
class SilentListener {
 public:
  SilentListener() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (fd_ >= 0 && bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
        listen(fd_, 64) == 0 &&
        getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
      port_ = ntohs(address.sin_port);
    }
  }
  ~SilentListener() {
    if (fd_ >= 0) close(fd_);
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

double SecondsSince(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

class DaemonLifecycleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::varipipe::testing::PerTestDirectory("varipipe-lifecycle");
    std::ofstream(dir_ / "token") << kToken << "\n";
    fs::permissions(dir_ / "token", fs::perms::owner_read | fs::perms::owner_write);
  }
  void TearDown() override {
    daemons_.clear();  // kills what is still running
    fs::remove_all(dir_);
  }

  // A small job; `store`: the config's "store" object ("{}": the daemon
  // starts its own redis-server).
  std::string WriteConfig(const std::string& name, const std::string& store) {
    const fs::path path = dir_ / (name + ".json");
    std::ofstream(path) << absl::StrCat(
        R"({"job_id": "life", "model": {"kind": "GPT", "num_layers": 4, "hidden_size": 128,
            "num_attention_heads": 4, "vocab_size": 1000},
          "parallelism": {"pipeline": 2},
          "cluster": {"device_memory_limit_mib": 2048},
          "data": {"format": "SYNTHETIC", "tokens_per_global_batch": 4096,
                   "max_sequence_length": 512, "synthetic_num_samples": 5000},
          "planner": {"plan_ahead": 4},
          "store": )",
        store, R"(, "training": {"iterations": 20}})");
    return path.string();
  }
  // A store at 127.0.0.1:`port` with a password file.
  std::string StoreAt(int port, const std::string& password) {
    std::ofstream(dir_ / "password") << password << "\n";
    fs::permissions(dir_ / "password", fs::perms::owner_read | fs::perms::owner_write);
    return absl::StrCat(R"({"redis_address": "127.0.0.1:)", port, R"(", "password_file": ")",
                        (dir_ / "password").string(), R"("})");
  }

  PlannerProcess& Spawn(const std::string& name, std::vector<std::string> args) {
    args.insert(args.end(), {"--threads", "1", "--token_file", (dir_ / "token").string()});
    daemons_.push_back(PlannerProcess::Spawn(dir_, name, std::move(args)));
    return *daemons_.back();
  }

  static std::shared_ptr<grpc::Channel> Channel(int port) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = CreateClientChannel(
        absl::StrCat("127.0.0.1:", port), {.token = kToken}, grpc::ChannelArguments());
    EXPECT_THAT(channel, IsOk());
    return *channel;
  }
  static std::unique_ptr<grpc::ClientContext> Context(int seconds = 30) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
    return context;
  }
  fs::path dir_;
  std::vector<std::unique_ptr<PlannerProcess>> daemons_;
};

// Done when: a second daemon on a taken port exits 1 within a second or two
// naming the address, before any start-up work (it starts no Redis); the
// first keeps serving. Measured: about 0.04 s (was 5.1 s: it started its
// embedded redis-server and opened the dataset first, and that redis-server
// then ignored SIGTERM for Stop()'s 5 s grace).
TEST_F(DaemonLifecycleTest, SecondDaemonOnATakenPortFailsAtOnce) {
  const std::string config = WriteConfig("embedded", "{}");
  PlannerProcess& first = Spawn("first", {"--config", config, "--listen", "127.0.0.1:0"});
  const int port = first.WaitForPort();
  ASSERT_GT(port, 0) << first.Log();
  const std::string taken = absl::StrCat("127.0.0.1:", port);

  const absl::Time start = absl::Now();
  PlannerProcess& second = Spawn("second", {"--config", config, "--listen", taken});
  const std::optional<int> exit_code = second.WaitForExit(absl::Seconds(30));
  const double seconds = SecondsSince(start);
  std::printf("a second daemon on taken port %s exited %s after %.3f s\n", taken.c_str(),
              exit_code ? std::to_string(*exit_code).c_str() : "(still running)", seconds);
  EXPECT_EQ(exit_code, 1) << second.Log();
  EXPECT_LT(seconds, 10.0) << second.Log();
  EXPECT_THAT(second.Log(), HasSubstr(absl::StrCat("cannot listen on ", taken)));
  EXPECT_THAT(second.Log(), HasSubstr("in use"));
  EXPECT_THAT(second.Log(), Not(HasSubstr("redis-server"))) << "started Redis before binding";
  // The first still serves.
  EXPECT_EQ(HealthStatus(Channel(port)), 1);
  v1::GetJobResponse job;
  const grpc::Status s = v1::PlanService::NewStub(Channel(port))->GetJob(Context().get(), {}, &job);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(first.Stop(), 0) << first.Log();
}

// Done when: SIGTERM stops an idle daemon (a client connected, no call in
// flight) within a second with status 0, and its embedded redis-server with
// it. Measured: about 0.2 s (was 5.1 s: the redis-server inherited the
// daemon's blocked SIGTERM and was killed only after Stop()'s 5 s grace; and
// gRPC's shutdown waited its 2 s deadline for the idle client to close its
// connection).
TEST_F(DaemonLifecycleTest, IdleDaemonStopsPromptlyOnSigterm) {
  PlannerProcess& daemon =
      Spawn("idle", {"--config", WriteConfig("embedded", "{}"), "--listen", "127.0.0.1:0"});
  const int port = daemon.WaitForPort();
  ASSERT_GT(port, 0) << daemon.Log();
  // A connected client with no call in flight (an executor between calls):
  // it notices the server's GOAWAY only when it next polls its connection.
  const std::shared_ptr<grpc::Channel> channel = Channel(port);
  EXPECT_EQ(HealthStatus(channel), 1);
  auto stub = v1::PlanService::NewStub(channel);
  v1::GetJobResponse job;
  const grpc::Status job_status = stub->GetJob(Context().get(), {}, &job);
  ASSERT_TRUE(job_status.ok()) << job_status.error_message();
  // Idle: every iteration the window allows is planned.
  absl::SleepFor(absl::Seconds(1));
  const std::vector<pid_t> children = Children(daemon.pid());
  ASSERT_EQ(children.size(), 1u) << "the embedded redis-server";

  const absl::Time start = absl::Now();
  ASSERT_EQ(kill(daemon.pid(), SIGTERM), 0);
  const std::optional<int> exit_code = daemon.WaitForExit(absl::Seconds(30));
  const double seconds = SecondsSince(start);
  std::printf("an idle daemon exited %s %.3f s after SIGTERM\n",
              exit_code ? std::to_string(*exit_code).c_str() : "(still running)", seconds);
  EXPECT_EQ(exit_code, 0) << daemon.Log();
  EXPECT_LT(seconds, 5.0) << daemon.Log();
  EXPECT_THAT(daemon.Log(), HasSubstr("stopped"));
  EXPECT_THAT(daemon.Log(), Not(HasSubstr("embedded redis-server:")));
  // The redis-server was stopped (and reaped), not left behind or killed late.
  EXPECT_NE(kill(children[0], 0), 0) << "redis-server " << children[0] << " still runs";
}

// Done when: while start-up is blocked (here on a Redis that never answers)
// the port is bound, calls end with UNAVAILABLE "starting: ...", the health
// service says NOT_SERVING and there is no port file; SIGTERM then ends the
// daemon within the start-up grace (2 s) with 143.
TEST_F(DaemonLifecycleTest, StartingDaemonIsUnavailableAndStopsOnSigterm) {
  SilentListener stuck_redis;
  ASSERT_GT(stuck_redis.port(), 0);
  PlannerProcess& daemon =
      Spawn("starting", {"--config", WriteConfig("stuck", StoreAt(stuck_redis.port(), "secret")),
                         "--listen", "127.0.0.1:0"});
  const int port = ListeningPort(daemon);
  ASSERT_GT(port, 0) << daemon.Log();

  auto channel = Channel(port);
  v1::GetJobResponse job;
  const grpc::Status job_status =
      v1::PlanService::NewStub(channel)->GetJob(Context().get(), {}, &job);
  EXPECT_EQ(job_status.error_code(), grpc::StatusCode::UNAVAILABLE) << job_status.error_message();
  EXPECT_THAT(job_status.error_message(),
              HasSubstr("starting: connecting to the instruction store"));
  v1::PlannerStatus planner_status;
  const grpc::Status status_status =
      v1::StatusService::NewStub(channel)->GetPlannerStatus(Context().get(), {}, &planner_status);
  EXPECT_EQ(status_status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status_status.error_message(), HasSubstr("starting: "));
  EXPECT_EQ(HealthStatus(channel), 2) << "NOT_SERVING while starting";
  EXPECT_FALSE(fs::exists(dir_ / "starting.port")) << "port file before the daemon is ready";

  const absl::Time start = absl::Now();
  ASSERT_EQ(kill(daemon.pid(), SIGTERM), 0);
  const std::optional<int> exit_code = daemon.WaitForExit(absl::Seconds(30));
  const double seconds = SecondsSince(start);
  std::printf("a daemon blocked in start-up exited %s %.3f s after SIGTERM\n",
              exit_code ? std::to_string(*exit_code).c_str() : "(still running)", seconds);
  EXPECT_EQ(exit_code, 128 + SIGTERM) << daemon.Log();
  EXPECT_LT(seconds, 10.0) << daemon.Log();
  EXPECT_THAT(daemon.Log(), HasSubstr("start-up did not stop within"));
  EXPECT_FALSE(fs::exists(dir_ / "starting.port"));
}

// Done when: a daemon serving a plan stream that waits (for the rank's
// progress report) stops promptly on SIGTERM, with status 0, and the stream
// ends with UNAVAILABLE (so the executor tries another planner). Measured:
// about 0.2 s (was 3.6 s: the call blocked in Redis for the rest of its 2 s
// wait slice, began another, and ended only after gRPC's 2 s shutdown
// deadline cancelled it).
TEST_F(DaemonLifecycleTest, DaemonWithAWaitingStreamStopsOnSigterm) {
  absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
  ASSERT_THAT(redis, IsOk());
  PlannerProcess& daemon = Spawn(
      "busy", {"--config", WriteConfig("external", StoreAt((*redis)->port(), (*redis)->password())),
               "--listen", "127.0.0.1:0"});
  const int port = daemon.WaitForPort();
  ASSERT_GT(port, 0) << daemon.Log();

  auto stub = v1::PlanService::NewStub(Channel(port));
  auto context = Context(60);
  v1::WatchPlansRequest request;
  request.set_rank(0);
  request.set_max_ahead(1);  // plan 0, then wait for the report of iteration 0
  std::unique_ptr<grpc::ClientReader<v1::PlanEnvelope>> reader =
      stub->WatchPlans(context.get(), request);
  v1::PlanEnvelope envelope;
  ASSERT_TRUE(reader->Read(&envelope)) << daemon.Log();
  EXPECT_EQ(envelope.plan().iteration(), 0u);
  // The client reads on, as an executor's prefetcher does.
  std::future<grpc::Status> stream_end = std::async(std::launch::async, [&] {
    v1::PlanEnvelope more;
    while (reader->Read(&more)) {
    }
    return reader->Finish();
  });
  absl::SleepFor(absl::Milliseconds(500));  // the stream waits in the store

  const absl::Time start = absl::Now();
  ASSERT_EQ(kill(daemon.pid(), SIGTERM), 0);
  const std::optional<int> exit_code = daemon.WaitForExit(absl::Seconds(30));
  const double seconds = SecondsSince(start);
  std::printf("a daemon with a waiting plan stream exited %s %.3f s after SIGTERM\n",
              exit_code ? std::to_string(*exit_code).c_str() : "(still running)", seconds);
  EXPECT_EQ(exit_code, 0) << daemon.Log();
  EXPECT_LT(seconds, 5.0) << daemon.Log();
  const grpc::Status s = stream_end.get();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("shutting down"));
}

}  // namespace
}  // namespace varipipe
