// The planner daemon's security defaults (docs/security.md), against real
// daemon processes, a real redis-server and real gRPC on loopback: loopback
// by default, no port sharing, the job token on every call, secrets never on
// a command line and in private files only, optional TLS.
#include <arpa/inet.h>
#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/auth/job_token.h"
#include "common/config/job_config.h"
#include "common/grpc/client_channel.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "planner/service/planner_daemon.h"
#include "planner/service/redis_instruction_store.h"
#include "tests/testing/command.h"
#include "tests/testing/health_check.h"
#include "tests/testing/planner_process.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_directory.h"
#include "varipipe/v1/service.grpc.pb.h"

namespace varipipe::service {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using ::varipipe::testing::HealthStatus;
using ::varipipe::testing::Bin;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::PlannerProcess;
using ::varipipe::testing::RunCommand;

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A process's command line with the NULs between arguments as spaces.
std::string CommandLine(pid_t pid) {
  std::string text = ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
  for (char& c : text) c = c == '\0' ? ' ' : c;
  return text;
}

// Processes whose parent is `parent` (from /proc/PID/stat).
std::vector<pid_t> Children(pid_t parent) {
  std::vector<pid_t> children;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return children;
  while (const dirent* entry = readdir(proc)) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(entry->d_name, &pid)) continue;
    const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
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
  closedir(proc);
  return children;
}

// An address as /proc/net/tcp{,6} prints it (the raw 32-bit words in hex, host
// byte order) in text; IPv4-mapped IPv6 addresses as IPv4.
std::string AddressFromProc(const std::string& hex) {
  uint32_t words[4] = {};
  const size_t count = hex.size() / 8;
  for (size_t i = 0; i < count && i < 4; ++i) {
    if (!absl::SimpleHexAtoi(hex.substr(8 * i, 8), &words[i])) return hex;
  }
  char text[INET6_ADDRSTRLEN] = {};
  if (count == 1) {
    in_addr in{};
    std::memcpy(&in.s_addr, &words[0], 4);
    inet_ntop(AF_INET, &in, text, sizeof(text));
    return text;
  }
  in6_addr in6{};
  std::memcpy(&in6, words, sizeof(in6));
  if (IN6_IS_ADDR_V4MAPPED(&in6)) {
    in_addr in{};
    std::memcpy(&in.s_addr, &in6.s6_addr[12], 4);
    inet_ntop(AF_INET, &in, text, sizeof(text));
    return text;
  }
  inet_ntop(AF_INET6, &in6, text, sizeof(text));
  return text;
}

// How many threads process `pid` runs under each name (the kernel's COMM,
// /proc/PID/task/TID/comm, at most 15 characters).
std::map<std::string, int> ThreadsByName(pid_t pid) {
  std::map<std::string, int> names;
  std::error_code error;
  for (const auto& task : fs::directory_iterator(absl::StrCat("/proc/", pid, "/task"), error)) {
    std::string name = ReadFile(task.path() / "comm");
    if (name.empty()) continue;  // ended meanwhile
    if (name.back() == '\n') name.pop_back();
    ++names[name];
  }
  return names;
}

// "ADDRESS:PORT" of every listening TCP socket the process holds, from its
// file descriptors and /proc/net/tcp and tcp6.
std::vector<std::string> ListeningSockets(pid_t pid) {
  std::set<std::string> inodes;
  const fs::path fds = absl::StrCat("/proc/", pid, "/fd");
  std::error_code error;
  for (const auto& fd : fs::directory_iterator(fds, error)) {
    const std::string target = fs::read_symlink(fd.path(), error).string();
    if (target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  std::vector<std::string> sockets;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::istringstream lines(ReadFile(table));
    std::string line;
    std::getline(lines, line);  // header
    while (std::getline(lines, line)) {
      const std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      // sl local_address rem_address st tx:rx tr:tm retrnsmt uid timeout inode
      if (f.size() < 10 || f[3] != "0A" || inodes.count(f[9]) == 0) continue;
      const std::vector<std::string> address = absl::StrSplit(f[1], ':');
      uint32_t port = 0;
      absl::SimpleHexAtoi(address[1], &port);
      sockets.push_back(absl::StrCat(AddressFromProc(address[0]), ":", port));
    }
  }
  return sockets;
}

// Whether something listens on `port` on any address (the default port may be
// taken by a daemon outside this test).
bool PortInUse(int port) {
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::istringstream lines(ReadFile(table));
    std::string line;
    while (std::getline(lines, line)) {
      const std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (f.size() < 4 || f[3] != "0A") continue;
      const std::vector<std::string> address = absl::StrSplit(f[1], ':');
      uint32_t p = 0;
      if (address.size() == 2 && absl::SimpleHexAtoi(address[1], &p) &&
          static_cast<int>(p) == port) {
        return true;
      }
    }
  }
  return false;
}

class PlannerSecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
    ASSERT_THAT(redis, IsOk());
    redis_ = *std::move(redis);
    dir_ = ::varipipe::testing::PerTestDirectory("varipipe-security");
    WritePrivate(dir_ / "password", redis_->password() + "\n");
  }
  void TearDown() override {
    daemons_.clear();  // kills what is still running
    fs::remove_all(dir_);
  }

  static void WritePrivate(const fs::path& path, const std::string& text) {
    std::ofstream(path) << text;
    fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write);
  }

  // A small job; `embedded`: no store address (the daemon starts its own
  // redis-server).
  fs::path WriteConfig(bool embedded = false) {
    const std::string store =
        embedded ? std::string("{}")
                 : absl::StrCat(R"({"redis_address": ")", redis_->address(),
                                R"(", "password_file": ")", (dir_ / "password").string(), R"("})");
    const fs::path path = dir_ / (embedded ? "embedded.json" : "job.json");
    std::ofstream(path) << absl::StrCat(
        R"({"job_id": "sec", "model": {"kind": "GPT", "num_layers": 4, "hidden_size": 128,
            "num_attention_heads": 4, "vocab_size": 1000},
          "parallelism": {"pipeline": 2},
          "cluster": {"device_memory_limit_mib": 2048},
          "data": {"format": "SYNTHETIC", "tokens_per_global_batch": 4096,
                   "max_sequence_length": 512, "synthetic_num_samples": 5000},
          "planner": {"plan_ahead": 4},
          "store": )",
        store, R"(, "training": {"iterations": 20}})");
    return path;
  }
  v1::JobConfig Config(bool embedded = false) {
    absl::StatusOr<v1::JobConfig> c = LoadJobConfigFile(WriteConfig(embedded).string());
    EXPECT_THAT(c, IsOk());
    return *c;
  }

  PlannerProcess& Spawn(const std::string& name, std::vector<std::string> args) {
    daemons_.push_back(PlannerProcess::Spawn(dir_, name, std::move(args)));
    return *daemons_.back();
  }

  static std::shared_ptr<grpc::Channel> Channel(int port, const std::string& token,
                                                const TlsFiles& tls = {}) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = CreateClientChannel(
        absl::StrCat("127.0.0.1:", port), {.token = token, .tls = tls}, grpc::ChannelArguments());
    EXPECT_THAT(channel, IsOk());
    return *channel;
  }

  static std::unique_ptr<grpc::ClientContext> Context() {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return context;
  }

  std::unique_ptr<RedisServer> redis_;
  fs::path dir_;
  std::vector<std::unique_ptr<PlannerProcess>> daemons_;
};

// Done when: a planner daemon started with no --listen listens only on
// 127.0.0.1.
TEST_F(PlannerSecurityTest, DaemonWithoutListenFlagListensOnLoopbackOnly) {
  constexpr int kDefaultPort = 50051;
  if (PortInUse(kDefaultPort)) {
    GTEST_SKIP() << "port " << kDefaultPort << " is taken by another process on this machine";
  }
  PlannerProcess& daemon = Spawn("default", {"--config", WriteConfig().string()});
  const int port = daemon.WaitForPort();
  if (port == 0 && absl::StrContains(daemon.Log(), "in use")) {
    GTEST_SKIP() << "port " << kDefaultPort << " was taken meanwhile: " << daemon.Log();
  }
  ASSERT_EQ(port, kDefaultPort) << daemon.Log();
  const std::vector<std::string> sockets = ListeningSockets(daemon.pid());
  EXPECT_THAT(sockets, ::testing::ElementsAre(absl::StrCat("127.0.0.1:", kDefaultPort)));
  EXPECT_EQ(daemon.Stop(), 0) << daemon.Log();
}

// Done when: a second daemon on a taken port exits 1 naming the port (gRPC's
// SO_REUSEPORT is off); the first keeps serving.
TEST_F(PlannerSecurityTest, SecondDaemonOnATakenPortExitsOneNamingThePort) {
  WritePrivate(dir_ / "token", "0123456789abcdef0123456789abcdef\n");
  const std::string config = WriteConfig().string();
  const std::string token_file = (dir_ / "token").string();
  PlannerProcess& first =
      Spawn("first", {"--config", config, "--listen", "127.0.0.1:0", "--token_file", token_file});
  const int port = first.WaitForPort();
  ASSERT_GT(port, 0) << first.Log();
  const std::string taken = absl::StrCat("127.0.0.1:", port);
  PlannerProcess& second =
      Spawn("second", {"--config", config, "--listen", taken, "--token_file", token_file});
  EXPECT_EQ(second.WaitForExit(), 1) << second.Log();
  EXPECT_THAT(second.Log(), HasSubstr(taken));
  EXPECT_THAT(second.Log(), HasSubstr("in use"));
  // Only the first daemon holds the port, and it still answers.
  EXPECT_THAT(ListeningSockets(first.pid()), ::testing::Contains(taken));
  auto stub = v1::PlanService::NewStub(Channel(port, "0123456789abcdef0123456789abcdef"));
  v1::GetJobResponse job;
  const grpc::Status s = stub->GetJob(Context().get(), {}, &job);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(first.Stop(), 0) << first.Log();
}

// Done when: a client without the secret gets UNAUTHENTICATED from
// PlanService and StatusService; the health service still answers.
TEST_F(PlannerSecurityTest, CallsWithoutTheJobTokenAreUnauthenticated) {
  DaemonOptions options;
  options.worker_threads = 1;
  options.progress_interval = absl::ZeroDuration();
  absl::StatusOr<std::unique_ptr<PlannerDaemon>> daemon = PlannerDaemon::Start(Config(), options);
  ASSERT_THAT(daemon, IsOk());
  const std::string token = (*daemon)->token();
  EXPECT_EQ(token.size(), 64u);
  const int port = (*daemon)->port();
  for (const std::string& presented : {std::string(), std::string("wrong-token-0123456789")}) {
    SCOPED_TRACE(presented.empty() ? "no token" : "wrong token");
    auto channel = Channel(port, presented);
    auto plans = v1::PlanService::NewStub(channel);
    auto status = v1::StatusService::NewStub(channel);
    v1::GetJobResponse job;
    v1::PlanEnvelope envelope;
    v1::GetPlanRequest plan_request;
    v1::ReportProgressRequest report;
    report.set_iteration(0);
    v1::ReportProgressResponse report_response;
    v1::PlannerStatus planner_status;
    v1::JobStatus job_status;
    v1::TraceResponse trace;
    const std::vector<std::pair<std::string, grpc::Status>> calls = {
        {"GetJob", plans->GetJob(Context().get(), {}, &job)},
        {"GetPlan", plans->GetPlan(Context().get(), plan_request, &envelope)},
        {"ReportProgress", plans->ReportProgress(Context().get(), report, &report_response)},
        {"GetPlannerStatus", status->GetPlannerStatus(Context().get(), {}, &planner_status)},
        {"GetJobStatus", status->GetJobStatus(Context().get(), {}, &job_status)},
        {"GetTrace", status->GetTrace(Context().get(), {}, &trace)}};
    for (const auto& [method, s] : calls) {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << method << ": " << s.error_message();
    }
    auto context = Context();
    auto reader = plans->WatchPlans(context.get(), {});
    EXPECT_FALSE(reader->Read(&envelope));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(HealthStatus(channel), 1);
  }
  // Nothing was acknowledged or reported by the refused calls.
  auto status = v1::StatusService::NewStub(Channel(port, token));
  v1::JobStatus job_status;
  const grpc::Status s = status->GetJobStatus(Context().get(), {}, &job_status);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(job_status.ranks_size(), 0);
  v1::PlanEnvelope envelope;
  v1::GetPlanRequest request;
  request.set_rank(1);
  ASSERT_TRUE(v1::PlanService::NewStub(Channel(port, token))
                  ->GetPlan(Context().get(), request, &envelope)
                  .ok());
  EXPECT_EQ(envelope.plan().rank(), 1);
  (*daemon)->Shutdown();
}

// Single-machine mode: the embedded redis-server's command line holds no
// secret, --store_file and its token file are private, and varipipe-ctl finds
// the token beside the store file (and is refused without it).
TEST_F(PlannerSecurityTest, EmbeddedRedisSecretsStayOffCommandLinesAndInPrivateFiles) {
  const fs::path store_file = dir_ / "store";
  // redis-server rewrites its process title once started, so a wrapper
  // records the arguments it is started with (what /proc/PID/cmdline shows
  // until then).
  const fs::path wrapper = dir_ / "redis-server";
  std::ofstream(wrapper) << "#!/bin/sh\nprintf '%s\\n' \"$0\" \"$@\" > '"
                         << (dir_ / "argv").string() << "'\nexec redis-server \"$@\"\n";
  fs::permissions(wrapper, fs::perms::owner_all);
  setenv("VARIPIPE_REDIS_SERVER", wrapper.c_str(), 1);
  PlannerProcess& daemon =
      Spawn("embedded", {"--config", WriteConfig(/*embedded=*/true).string(), "--listen",
                         "127.0.0.1:0", "--store_file", store_file.string()});
  unsetenv("VARIPIPE_REDIS_SERVER");
  const int port = daemon.WaitForPort();
  ASSERT_GT(port, 0) << daemon.Log();
  ASSERT_TRUE(fs::exists(store_file));
  std::istringstream store(ReadFile(store_file));
  std::string address;
  std::string password;
  ASSERT_TRUE(store >> address >> password);
  const std::string token = ReadFile(TokenFileBeside(store_file.string()));
  ASSERT_FALSE(token.empty());
  for (const fs::path& file :
       std::vector<fs::path>{store_file, TokenFileBeside(store_file.string())}) {
    struct stat info {};
    ASSERT_EQ(stat(file.c_str(), &info), 0);
    EXPECT_EQ(info.st_mode & 07777, 0600u) << file;
  }
  // No leftover temporary files beside them.
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    files += entry.path().filename().string().rfind("store", 0) == 0;
  }
  EXPECT_EQ(files, 2);

  // Done when: no secret appears in any process's command line.
  std::vector<pid_t> redis_servers;
  for (pid_t child : Children(daemon.pid())) {
    if (CommandLine(child).find("redis-server") != std::string::npos) {
      redis_servers.push_back(child);
    }
  }
  ASSERT_EQ(redis_servers.size(), 1u) << "the daemon's redis-server child";
  const std::string argv = ReadFile(dir_ / "argv");
  EXPECT_THAT(argv, HasSubstr("redis-server"));
  EXPECT_THAT(argv, Not(HasSubstr(password))) << argv;
  for (pid_t pid : {redis_servers[0], daemon.pid()}) {
    const std::string command_line = CommandLine(pid);
    ASSERT_FALSE(command_line.empty());
    EXPECT_THAT(command_line, Not(HasSubstr(password))) << "pid " << pid;
    EXPECT_THAT(command_line, Not(HasSubstr(token.substr(0, 64)))) << "pid " << pid;
  }

  const std::string ctl = absl::StrCat(Bin("varipipe-ctl"), " --planner 127.0.0.1:", port);
  varipipe::testing::CommandResult refused = RunCommand(ctl + " status");
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_THAT(refused.output, HasSubstr("token"));
  EXPECT_THAT(refused.output, HasSubstr("(16)")) << "UNAUTHENTICATED";
  varipipe::testing::CommandResult allowed =
      RunCommand(ctl + " --store_file " + store_file.string() + " status");
  EXPECT_EQ(allowed.exit_code, 0) << allowed.output;
  EXPECT_THAT(allowed.output, HasSubstr("job sec"));
  EXPECT_EQ(daemon.Stop(), 0) << daemon.Log();
}

// --token_file gives the job's token; a daemon with another token file for
// the same job, or a token file other users can read, is refused (exit 2).
TEST_F(PlannerSecurityTest, TokenFileIsTheJobsTokenAndAnotherIsRefused) {
  const std::string config = WriteConfig().string();
  WritePrivate(dir_ / "token", "first-token-0123456789abcdef\n");
  WritePrivate(dir_ / "other", "other-token-0123456789abcdef\n");
  std::ofstream(dir_ / "public") << "public-token-0123456789abcdef\n";
  fs::permissions(dir_ / "public", fs::perms::owner_read | fs::perms::owner_write |
                                       fs::perms::group_read | fs::perms::others_read);
  PlannerProcess& first = Spawn("first", {"--config", config, "--listen", "127.0.0.1:0",
                                          "--token_file", (dir_ / "token").string()});
  const int port = first.WaitForPort();
  ASSERT_GT(port, 0) << first.Log();
  PlannerProcess& other = Spawn("other", {"--config", config, "--listen", "127.0.0.1:0",
                                          "--token_file", (dir_ / "other").string()});
  EXPECT_EQ(other.WaitForExit(), 2) << other.Log();
  EXPECT_THAT(other.Log(), HasSubstr("another token"));
  PlannerProcess& public_file = Spawn("public", {"--config", config, "--listen", "127.0.0.1:0",
                                                 "--token_file", (dir_ / "public").string()});
  EXPECT_EQ(public_file.WaitForExit(), 2) << public_file.Log();
  EXPECT_THAT(public_file.Log(), HasSubstr("other users may read"));
  // A daemon without --token_file serves the job with the registered token.
  PlannerProcess& plain = Spawn("plain", {"--config", config, "--listen", "127.0.0.1:0"});
  const int plain_port = plain.WaitForPort();
  ASSERT_GT(plain_port, 0) << plain.Log();
  const std::string ctl = Bin("varipipe-ctl");
  for (int p : {port, plain_port}) {
    varipipe::testing::CommandResult r =
        RunCommand(absl::StrCat(ctl, " --planner 127.0.0.1:", p, " --token_file ",
                                (dir_ / "token").string(), " plan --iteration 0 --rank 1"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr("iteration 0 rank 1"));
  }
  EXPECT_EQ(first.Stop(), 0) << first.Log();
  EXPECT_EQ(plain.Stop(), 0) << plain.Log();
}

// Done when: a rogue ReportProgress for an iteration not yet fetched changes
// nothing (a real daemon: the plans are still there, back-pressure holds);
// reports beyond a rank's next iteration or past the job (2^64-1) are
// refused too; a GetPlan far beyond the planning window does not plan it;
// GetTrace traces planned iterations only.
TEST_F(PlannerSecurityTest, RogueProgressReportsAndFarRequestsChangeNothing) {
  const std::string token = "rogue-test-token-0123456789abcdef";
  WritePrivate(dir_ / "token", token + "\n");
  PlannerProcess& daemon =
      Spawn("checked", {"--config", WriteConfig().string(), "--listen", "127.0.0.1:0",
                        "--token_file", (dir_ / "token").string(), "--threads", "1"});
  const int port = daemon.WaitForPort();
  ASSERT_GT(port, 0) << daemon.Log();
  absl::StatusOr<std::unique_ptr<RedisInstructionStore>> store = RedisInstructionStore::Open(
      {.host = redis_->host(), .port = redis_->port(), .password = redis_->password()},
      {.job_id = "sec", .world_size = 2, .total_iterations = 20});
  ASSERT_THAT(store, IsOk());
  // planner.plan_ahead = 4: the daemon publishes iterations 0-3 and holds.
  const absl::Time deadline = absl::Now() + absl::Minutes(2);
  while ((*store)->Counters()->published < 4 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ((*store)->Counters()->published, 4u) << daemon.Log();
  // Everything the job holds in Redis, key by key with its value.
  const auto snapshot = [&] {
    std::map<std::string, std::string> keys;
    absl::StatusOr<RedisReply> names = (*store)->redis().Command({"KEYS", "varipipe:sec:*"});
    EXPECT_THAT(names, IsOk());
    for (size_t k = 0; k < names->size(); ++k) {
      const std::string name = ElementString(names->element(k));
      absl::StatusOr<RedisReply> dump = (*store)->redis().Command({"DUMP", name});
      EXPECT_THAT(dump, IsOk());
      keys[name] = dump->str();
    }
    return keys;
  };
  const std::map<std::string, std::string> before = snapshot();
  auto stub = v1::PlanService::NewStub(Channel(port, token));
  const auto report = [&](int rank, uint64_t iteration) {
    v1::ReportProgressRequest request;
    request.set_rank(rank);
    request.set_iteration(iteration);
    v1::ReportProgressResponse response;
    return stub->ReportProgress(Context().get(), request, &response);
  };
  const auto get_plan = [&](int rank, uint64_t iteration, int timeout_s = 30) {
    auto context = Context();
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_s));
    v1::GetPlanRequest request;
    request.set_rank(rank);
    request.set_iteration(iteration);
    v1::PlanEnvelope envelope;
    return stub->GetPlan(context.get(), request, &envelope);
  };
  // Published, never fetched: refused.
  for (const auto& [rank, iteration] : {std::pair{0, 2}, std::pair{1, 0}, std::pair{1, 3}}) {
    const grpc::Status s = report(rank, iteration);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("without having fetched its plan"));
  }
  // Past the job, up to 2^64-1.
  for (const uint64_t iteration : {uint64_t{20}, ~uint64_t{0}}) {
    EXPECT_EQ(report(0, iteration).error_code(), grpc::StatusCode::OUT_OF_RANGE) << iteration;
  }
  EXPECT_EQ(snapshot(), before) << "a refused report changed the store";
  for (uint64_t i = 0; i < 4; ++i) EXPECT_TRUE(*(*store)->plans().IsPublished(i)) << i;
  EXPECT_TRUE((*store)->progress().Progress()->empty());

  // Rank 0 fetches and completes iteration 0; fetching iteration 2 does not
  // let it report 2 before 1.
  ASSERT_TRUE(get_plan(0, 0).ok());
  ASSERT_TRUE(report(0, 0).ok());
  ASSERT_TRUE(get_plan(0, 2).ok());
  const grpc::Status early = report(0, 2);
  EXPECT_EQ(early.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << early.error_message();
  EXPECT_THAT(early.error_message(), HasSubstr("due to run iteration"));
  EXPECT_EQ((*store)->progress().Progress()->at(0), (std::pair<int, uint64_t>{0, 0}));

  // Iteration 15 is far beyond the window (rank 0 is due at 1, plan_ahead 4):
  // a GetPlan waits for it and nothing plans it.
  EXPECT_EQ(get_plan(1, 15, 3).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_FALSE(*(*store)->plans().IsPublished(15));
  EXPECT_EQ((*store)->Counters()->claimed, 4u) << "back-pressure was lifted";

  auto status = v1::StatusService::NewStub(Channel(port, token));
  v1::GetTraceRequest trace_request;
  trace_request.set_iteration(12);
  v1::TraceResponse trace;
  EXPECT_EQ(status->GetTrace(Context().get(), trace_request, &trace).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  trace_request.set_iteration(1);
  const grpc::Status traced = status->GetTrace(Context().get(), trace_request, &trace);
  EXPECT_TRUE(traced.ok()) << traced.error_message();
  EXPECT_EQ(daemon.Stop(), 0) << daemon.Log();
}

// A resource bound: 200 clients wait for a plan from a daemon with
// --max_calls 16; at most 16 wait, the others get RESOURCE_EXHAUSTED at once,
// and the daemon's threads serving calls and its Redis connections stay
// under the caps. Counts only, sampled until an event (every refused call
// returned) and then in the steady state: no wall-clock window.
TEST_F(PlannerSecurityTest, WaitingCallsThreadsAndStoreConnectionsAreBounded) {
  constexpr int kMaxCalls = 16;
  constexpr int kClients = 200;
  const std::string token = "bounded-test-token-0123456789abcdef";
  WritePrivate(dir_ / "token", token + "\n");
  PlannerProcess& daemon =
      Spawn("bounded", {"--config", WriteConfig().string(), "--listen", "127.0.0.1:0",
                        "--token_file", (dir_ / "token").string(), "--threads", "1", "--max_calls",
                        std::to_string(kMaxCalls)});
  const int port = daemon.WaitForPort();
  ASSERT_GT(port, 0) << daemon.Log();
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int c = 0; c < 8; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.channel_id", c);  // a connection per channel
    channels.push_back(
        *CreateClientChannel(absl::StrCat("127.0.0.1:", port), {.token = token}, args));
  }
  // Rank 0 completes iteration 0, so iteration 15 is beyond the planning
  // window: nobody plans it and its GetPlan calls wait.
  auto stub = v1::PlanService::NewStub(channels[0]);
  {
    v1::GetPlanRequest request;
    v1::PlanEnvelope envelope;
    ASSERT_TRUE(stub->GetPlan(Context().get(), request, &envelope).ok());
    v1::ReportProgressRequest report;
    v1::ReportProgressResponse response;
    ASSERT_TRUE(stub->ReportProgress(Context().get(), report, &response).ok());
  }
  std::atomic<int> exhausted{0};
  std::atomic<int> returned{0};
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  for (int c = 0; c < kClients; ++c) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    contexts.back()->set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(5));
  }
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      auto client = v1::PlanService::NewStub(channels[c % channels.size()]);
      v1::GetPlanRequest request;
      request.set_iteration(15);
      request.set_rank(1);
      v1::PlanEnvelope envelope;
      const grpc::Status s = client->GetPlan(contexts[c].get(), request, &envelope);
      if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) ++exhausted;
      ++returned;
    });
  }
  // The daemon's threads, split into those serving calls (the synchronous
  // server runs each call on one of gRPC's "grpcpp_sync_server" threads,
  // which the quota caps) and the rest (the daemon's own and gRPC's timer,
  // poller and executor threads, which calls do not multiply). The most of
  // each, and of both together, over the samples; returns how many serve
  // calls now.
  int most_serving = 0;
  int most_other = 0;
  int most_threads = 0;
  std::string most_threads_names;
  const auto sample_threads = [&] {
    const std::map<std::string, int> by_name = ThreadsByName(daemon.pid());
    int serving = 0;
    int other = 0;
    std::string names;
    for (const auto& [name, n] : by_name) {
      (name.rfind("grpcpp_sync_ser", 0) == 0 ? serving : other) += n;
      absl::StrAppend(&names, names.empty() ? "" : ", ", n, " ", name);
    }
    most_serving = std::max(most_serving, serving);
    most_other = std::max(most_other, other);
    if (serving + other > most_threads) {
      most_threads = serving + other;
      most_threads_names = names;
    }
    return serving;
  };
  absl::StatusOr<std::unique_ptr<RedisClient>> redis = RedisClient::Connect(
      {.host = redis_->host(), .port = redis_->port(), .password = redis_->password()});
  ASSERT_THAT(redis, IsOk());
  const auto connections = [&] {
    absl::StatusOr<RedisReply> list = (*redis)->Command({"CLIENT", "LIST"});
    if (!list.ok()) return -1;
    const std::string clients = list->str();
    return static_cast<int>(std::count(clients.begin(), clients.end(), '\n')) - 1;
  };
  int most_connections = 0;
  // Until every call that does not wait has returned (an event; the limit
  // only ends a test that would hang), sampling all along.
  const absl::Time limit = absl::Now() + absl::Minutes(2);
  while (returned.load() < kClients - kMaxCalls && absl::Now() < limit) {
    sample_threads();
    most_connections = std::max(most_connections, connections());
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_GE(exhausted.load(), kClients - kMaxCalls);
  // The calls still out wait for iteration 15 (their deadline is minutes
  // away), each on a serving thread: sampled until the threads serving
  // calls are at least as many (an event again; else the count misses them,
  // gRPC having named its threads otherwise), and a while after.
  int serving_now = 0;
  while (absl::Now() < limit) {
    serving_now = sample_threads();
    most_connections = std::max(most_connections, connections());
    if (serving_now >= kClients - returned.load()) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  for (int sample = 0; sample < 20; ++sample) {
    sample_threads();
    most_connections = std::max(most_connections, connections());
  }
  const int waiting = kClients - returned.load();
  EXPECT_LE(waiting, kMaxCalls);
  EXPECT_GE(serving_now, waiting) << "threads serving the waiting calls not found by name";
  std::printf(
      "%d of %d calls refused, %d wait; at most %d threads serving calls, %d others, %d in all "
      "(%s); at most %d store connections\n",
      exhausted.load(), kClients, waiting, most_serving, most_other, most_threads,
      most_threads_names.c_str(), most_connections);
  // The threads serving calls: at most the quota (max_calls +
  // kSpareThreads). Without it they grew with the calls in flight, towards
  // one per client.
  EXPECT_LE(most_serving, kMaxCalls + PlannerDaemon::kSpareThreads);
  // The others do not serve calls, so their number does not follow the
  // calls' but the machine's load (gRPC starts executor threads when its
  // queue waits): the daemon's own (main, the planning worker, progress,
  // signal watch, planning helpers; up to 7 seen) and gRPC's (timers,
  // pollers, executors; 8-10 seen), far from the 200 threads that one per
  // call would make.
  EXPECT_LE(most_other, 2 * PlannerDaemon::kSpareThreads);
  // The daemon's connections besides this test's: one per waiting call, the
  // worker's, a few spare ones.
  EXPECT_LE(most_connections, kMaxCalls + PlannerDaemon::kSpareConnections + 1);
  // Calls that do not wait are still served.
  v1::GetJobResponse job;
  const grpc::Status s = stub->GetJob(Context().get(), {}, &job);
  EXPECT_TRUE(s.ok()) << s.error_message();
  for (auto& context : contexts) context->TryCancel();
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(daemon.Stop(), 0) << daemon.Log();
}

// TLS with gRPC's SSL credentials: a client that trusts the CA and presents
// the token is served; a plaintext client is not; mutual TLS requires the
// client's certificate.
TEST_F(PlannerSecurityTest, TlsServesVerifiedClientsOnly) {
  // A CA, a server certificate for 127.0.0.1 and a client certificate.
  const varipipe::testing::CommandResult made = RunCommand(absl::StrCat(
      "cd '", dir_.string(), "' && (set -e; ",
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=test-ca -keyout ca.key "
      "-out ca.pem && ",
      "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > san.ext && ",
      "openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key -out "
      "server.csr && ",
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 "
      "-extfile san.ext -out server.pem && ",
      "openssl req -newkey rsa:2048 -nodes -subj /CN=client -keyout client.key -out "
      "client.csr && ",
      "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 "
      "-out client.pem)"));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  DaemonOptions options;
  options.worker_threads = -1;
  options.progress_interval = absl::ZeroDuration();
  options.tls = {.cert_file = (dir_ / "server.pem").string(),
                 .key_file = (dir_ / "server.key").string(),
                 .ca_file = (dir_ / "ca.pem").string()};
  absl::StatusOr<std::unique_ptr<PlannerDaemon>> daemon = PlannerDaemon::Start(Config(), options);
  ASSERT_THAT(daemon, IsOk());
  const int port = (*daemon)->port();
  const std::string token = (*daemon)->token();
  const TlsFiles client = {.cert_file = (dir_ / "client.pem").string(),
                           .key_file = (dir_ / "client.key").string(),
                           .ca_file = (dir_ / "ca.pem").string()};
  v1::GetJobResponse job;
  grpc::Status s =
      v1::PlanService::NewStub(Channel(port, token, client))->GetJob(Context().get(), {}, &job);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(job.config().job_id(), "sec");
  s = v1::PlanService::NewStub(Channel(port, "", client))->GetJob(Context().get(), {}, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  auto context = Context();
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  s = v1::PlanService::NewStub(Channel(port, token))->GetJob(context.get(), {}, &job);
  EXPECT_FALSE(s.ok()) << "a plaintext client was served";
  context = Context();
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  s = v1::PlanService::NewStub(Channel(port, token, {.ca_file = client.ca_file}))
          ->GetJob(context.get(), {}, &job);
  EXPECT_FALSE(s.ok()) << "a client without a certificate was served under mutual TLS";
  // varipipe-ctl with the same files.
  WritePrivate(dir_ / "token", token + "\n");
  const varipipe::testing::CommandResult ctl = RunCommand(
      absl::StrCat(Bin("varipipe-ctl"), " --planner 127.0.0.1:", port, " --token_file ",
                   (dir_ / "token").string(), " --tls_ca ", client.ca_file, " --tls_cert ",
                   client.cert_file, " --tls_key ", client.key_file, " status"));
  EXPECT_EQ(ctl.exit_code, 0) << ctl.output;
  (*daemon)->Shutdown();
}

}  // namespace
}  // namespace varipipe::service
