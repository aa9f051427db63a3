// No rank ever hangs, with real processes: four executors (pp = 2, dp = 2,
// Gloo on loopback, a real redis-server) fail at every point of a launch,
// with every kind of fault, and every peer ends on the news of the failure
// (a closed connection, the failed rank's report, its lapsed heartbeat),
// never by a wait running out its watchdog, naming the failed rank; the
// relaunch (a fresh run id, as torchrun and mpirun give) resumes
// from the last checkpoint every rank holds and ends with parameters
// byte-identical to an uninterrupted run's.
// - FaultMatrix.*: one test per fault point (before and after the
//   rendezvous, before the first data-parallel all-reduce, in a send and a
//   receive, inside the all-reduce, inside ZeRO stage 1's collectives, while
//   writing a checkpoint, between iterations, inside a context-parallel
//   all-gather of a job with data 2 x context 2), each over the three faults
//   (SIGKILL, an error in the rank, SIGTERM), through the test-only switch
//   VARIPIPE_FAULT_INJECTION (executor/runtime/fault_injection.h). Each cell
//   prints the time from the fault to the last peer's exit.
// - CorruptPlans.*: rank 0's plan of iteration 0 corrupted ten ways; rank 0
//   refuses it, and every rank (the other replica, which has not reached its
//   first data-parallel all-reduce, included) ends naming rank 0, no wait
//   running out its watchdog.
// Nothing here asserts on wall-clock time, which a loaded machine stretches
// (docs/development.md, "No test may depend on timing"): "promptly" is what
// ended each wait. The watchdog is long (a minute), so that no wait of a
// healthy launch runs out under any load, and a wait that was not ended by
// the failure runs out and says so in the rank's log ("... did not
// complete", a Gloo "timed out"), which the test finds.
#include <signal.h>
#include <stdlib.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/testing/command.h"
#include "tests/testing/executor_ranks.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/saved_parameters.h"
#include "tests/testing/seed.h"
#include "tests/testing/status_matchers.h"
#include "varipipe/v1/plan.pb.h"

namespace varipipe {
namespace {

using ::varipipe::testing::Bin;
using ::varipipe::testing::CommandResult;
using ::varipipe::testing::FreshDirectory;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::ExpectSameSavedParameters;
using ::varipipe::testing::RankExit;
using ::varipipe::testing::RankLogs;
using ::varipipe::testing::ReadFile;
using ::varipipe::testing::RunCommand;
using ::varipipe::testing::Signal;
using ::varipipe::testing::StartRanks;
using ::varipipe::testing::WaitForRanks;

constexpr int kRanks = 4;  // pp = 2, dp = 2
constexpr int kIterations = 4;
// Far beyond any wait of a healthy launch, however loaded the machine: a
// wait that runs out is one the failure did not end.
constexpr int kWatchdogSeconds = 60;
// Only ends a test that would otherwise hang: a rank that waited its whole
// watchdog and then diagnosed its peers (ttl + 2 s, then ttl + 1 s) ends
// well within it, and the logs then name the wait that ran out.
constexpr absl::Duration kHangLimit = absl::Minutes(4);

// A small GPT on the synthetic data, its Redis external; checkpoints every
// iteration into DIR/ckpt. With `context` 2: pipeline 1, data 2 and two
// context lanes (every micro-batch split), still four ranks.
std::string JobConfig(const std::string& job_id, int redis_port, int zero_stage, int context = 1) {
  const std::string parallelism = context > 1
                                      ? absl::StrCat(R"({"pipeline": 1, "data": 2, "context": )",
                                                     context, R"(, "context_split": "ALWAYS"})")
                                      : std::string(R"({"pipeline": 2, "data": 2})");
  return absl::StrCat(R"({
    "job_id": ")",
                      job_id, R"(",
    "model": {"kind": "gpt", "num_layers": 4, "hidden_size": 32, "num_attention_heads": 4,
              "ffn_hidden_size": 64, "vocab_size": 64, "dtype": "float32"},
    "parallelism": )",
                      parallelism, R"(,
    "cluster": {"devices_per_node": 4, "device_memory_limit_mib": 6},
    "data": {"format": "synthetic", "tokens_per_global_batch": 1024,
             "max_sequence_length": 64, "seed": 5, "synthetic_num_samples": 2000},
    "planner": {"tmax_interval_ms": 0.01, "threads": 1},
    "store": {"password_env": "VARIPIPE_TEST_REDIS_PASSWORD",
              "redis_address": "127.0.0.1:)",
                      redis_port, R"("},
    "training": {"iterations": )",
                      kIterations, R"(, "learning_rate": 0.01, "warmup_iterations": 1,
                 "watchdog_timeout_s": )",
                      kWatchdogSeconds, R"(, "zero_stage": )", zero_stage, R"(,
                 "checkpoint_dir": "ckpt", "checkpoint_interval": 1}
  })");
}

// Sets VARIPIPE_FAULT_INJECTION for the ranks started while it lives.
class FaultSwitch {
 public:
  explicit FaultSwitch(const std::string& spec) {
    ::setenv("VARIPIPE_FAULT_INJECTION", spec.c_str(), 1);
  }
  ~FaultSwitch() { ::unsetenv("VARIPIPE_FAULT_INJECTION"); }
};

// When each rank exited, from the test's view of its exit file.
struct Ends {
  std::vector<std::optional<absl::Time>> at;
  bool all() const {
    for (const auto& t : at) {
      if (!t) return false;
    }
    return true;
  }
};

Ends WatchEnds(const std::filesystem::path& dir, absl::Duration timeout) {
  Ends ends;
  ends.at.resize(kRanks);
  const absl::Time deadline = absl::Now() + timeout;
  while (!ends.all() && absl::Now() < deadline) {
    for (int r = 0; r < kRanks; ++r) {
      if (!ends.at[r] && RankExit(dir, r).has_value()) ends.at[r] = absl::Now();
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return ends;
}

// The wall-clock time a rank's log says it injected its fault.
std::optional<absl::Time> FaultTime(const std::string& log) {
  const std::string marker = "(at_us=";
  const size_t at = log.find(marker);
  if (at == std::string::npos) return std::nullopt;
  int64_t us = 0;
  const size_t begin = at + marker.size();
  if (!absl::SimpleAtoi(log.substr(begin, log.find(')', begin) - begin), &us)) return std::nullopt;
  return absl::FromUnixMicros(us);
}

// The last non-empty line of `log`.
std::string LastLine(const std::string& log) {
  const size_t end = log.find_last_not_of('\n');
  if (end == std::string::npos) return "";
  const size_t newline = log.rfind('\n', end);
  const size_t begin = newline == std::string::npos ? 0 : newline + 1;
  return log.substr(begin, end + 1 - begin);
}

// The first wait in `log` that ended by running out its time instead of by
// an event: a transfer, collective or group set-up that "did not complete"
// by its deadline (the plan interpreter's "... did not complete (watchdog
// timeout 1m): " prefix names the wait, whatever ended it, and is not one),
// or a Gloo connection or rendezvous that timed out. Empty when none did.
// One time-out is the design, not a missed event: once every rank has
// arrived, the address exchange of the rendezvous cannot be cancelled and
// is bounded by a context timeout of at most 2 s (gloo_transport.cc,
// ConnectFullMesh), so a rank that dies between arriving and connecting
// (a fault "before the rendezvous" that load delays past its arrival) ends
// its peers' exchange that way; a wait for arrivals ("/arrived/") is
// cancellable and still counts.
bool IsBoundedAddressExchange(absl::string_view line) {
  return absl::StrContains(line, "rendezvous: timed out after") &&
         !absl::StrContains(line, "/arrived/");
}

std::string WaitThatRanOut(const std::string& log) {
  constexpr absl::string_view kDidNotComplete = "did not complete";
  for (const absl::string_view line : absl::StrSplit(log, '\n')) {
    for (size_t at = line.find(kDidNotComplete); at != absl::string_view::npos;
         at = line.find(kDidNotComplete, at + 1)) {
      if (!absl::StartsWith(line.substr(at + kDidNotComplete.size()), " (watchdog timeout ")) {
        return std::string(line);
      }
    }
    if ((absl::StrContains(line, "timed out") || absl::StrContains(line, "Timed out")) &&
        !IsBoundedAddressExchange(line)) {
      return std::string(line);
    }
  }
  return "";
}

// Whether `log` (a peer's) names `rank` as the one that failed.
bool NamesFailedRank(const std::string& log, int rank) {
  return absl::StrContains(log, absl::StrCat("rank ", rank, " failed")) ||
         absl::StrContains(log, absl::StrCat("rank ", rank, " stopped without reporting"));
}

class FaultInjection : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
    ASSERT_THAT(redis, IsOk());
    redis_ = *std::move(redis);
  }
  void TearDown() override {
    for (const std::filesystem::path& dir : launched_) {
      for (int r = 0; r < kRanks; ++r) {
        // Only a rank still running: the pid of one that exited may belong
        // to another process by now (pids wrap around quickly on a machine
        // busy starting processes), another test's rank, say.
        if (RankExit(dir, r).has_value()) continue;
        Signal(dir, absl::StrCat("rank", r), SIGCONT);
        Signal(dir, absl::StrCat("rank", r), SIGKILL);
      }
    }
    std::error_code ignored;
    if (!HasFailure()) std::filesystem::remove_all(root_, ignored);
  }

  // DIR/job.json of a job (ZeRO stage `zero_stage`) and its plans in
  // ROOT/plans-<zero_stage>, emitted once.
  std::filesystem::path NewRun(const std::string& name, int zero_stage) {
    const std::filesystem::path dir = root_ / name;
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "job.json") << JobConfig("faults", redis_->port(), zero_stage, context_);
    const std::filesystem::path plans = root_ / PlansName(zero_stage);
    if (!std::filesystem::exists(plans)) {
      const CommandResult plan = RunCommand(absl::StrCat(
          "cd '", dir.string(), "' && ", Bin("varipipe-plan"), " --config job.json --iterations ",
          kIterations, " --emit-plans '", plans.string(), "'"));
      EXPECT_EQ(plan.exit_code, 0) << plan.output;
    }
    return dir;
  }
  std::string Flags(const std::filesystem::path& dir, int zero_stage, const std::string& run_id,
                    const std::string& extra = "") {
    return absl::StrCat("--config job.json --plans '", (root_ / PlansName(zero_stage)).string(),
                        "' --run_id ", run_id, " ", extra);
  }
  std::string PlansName(int zero_stage) const {
    return absl::StrCat("plans-", zero_stage, context_ > 1 ? absl::StrCat("-cp", context_) : "");
  }
  void Start(const std::filesystem::path& dir, const std::string& flags) {
    launched_.push_back(dir);
    StartRanks(dir, kRanks, redis_->password(), flags);
  }
  // Runs a launch to its end; every rank must exit 0.
  void RunClean(const std::filesystem::path& dir, const std::string& flags) {
    Start(dir, flags);
    ASSERT_EQ(WaitForRanks(dir, kRanks), 0) << RankLogs(dir, kRanks);
  }
  // The uninterrupted run of `zero_stage`'s job (once per test): its
  // parameters, rank by rank.
  const std::filesystem::path& Reference(int zero_stage) {
    std::filesystem::path& reference = references_[zero_stage];
    if (reference.empty()) {
      reference = NewRun(absl::StrCat("reference-", zero_stage), zero_stage);
      RunClean(reference, Flags(reference, zero_stage, absl::StrCat("reference-", zero_stage),
                                "--save_parameters params"));
    }
    return reference;
  }
  // One cell: rank `rank` faults with `action` at `point` (in iteration
  // `iteration`, or at the launch's rendezvous); every rank must be gone
  // within the bound, the peers naming `rank`; the relaunch must resume and
  // match the reference. `seeded`: a clean launch of two iterations first,
  // so the faulty launch starts from a checkpoint.
  void RunCell(const std::string& point, const std::string& action, int rank, int iteration,
               int zero_stage, bool seeded) {
    const std::string cell = absl::StrCat(point, "-", action);
    SCOPED_TRACE(cell);
    const std::filesystem::path& reference = Reference(zero_stage);
    const std::filesystem::path dir = NewRun(cell, zero_stage);
    if (seeded) {
      RunClean(dir, Flags(dir, zero_stage, cell + "-seed", "--iterations 2"));
      if (HasFatalFailure()) return;
    }
    {
      const FaultSwitch fault(absl::StrCat("rank=", rank, ",point=", point, ",action=", action,
                                           ",iteration=", iteration));
      Start(dir, Flags(dir, zero_stage, cell + "-fault"));
    }
    const Ends ends = WatchEnds(dir, kHangLimit);
    const std::string logs = RankLogs(dir, kRanks);
    ASSERT_TRUE(ends.all()) << "a rank still runs " << kHangLimit << " after the fault\n" << logs;
    const std::string faulty_log = ReadFile(dir / absl::StrCat("rank", rank, ".log"));
    const std::optional<absl::Time> fault_at = FaultTime(faulty_log);
    ASSERT_TRUE(fault_at.has_value()) << "the fault never fired\n" << logs;
    absl::Time last = *fault_at;
    int last_rank = rank;
    for (int r = 0; r < kRanks; ++r) {
      const std::string log = ReadFile(dir / absl::StrCat("rank", r, ".log"));
      EXPECT_NE(RankExit(dir, r), 0) << "rank " << r << "\n" << logs;
      EXPECT_EQ(WaitThatRanOut(log), "")
          << "a wait of rank " << r << " ran out its time: the failure did not end it\n"
          << logs;
      if (*ends.at[r] > last) {
        last = *ends.at[r];
        last_rank = r;
      }
      if (r == rank) continue;
      EXPECT_TRUE(NamesFailedRank(log, rank))
          << "rank " << r << " does not name rank " << rank << "\n"
          << logs;
    }
    const int expected_exit = action == "kill"      ? 128 + SIGKILL
                              : action == "sigterm" ? 128 + SIGTERM
                                                    : 1;
    EXPECT_EQ(RankExit(dir, rank), expected_exit) << logs;
    // Printed, not asserted: load stretches it (what ended each wait is
    // asserted above).
    const double seconds = absl::ToDoubleSeconds(last - *fault_at);
    std::printf("  rank %d's last line: %s\n", last_rank,
                LastLine(ReadFile(dir / absl::StrCat("rank", last_rank, ".log"))).c_str());
    std::printf("cell %-22s %-7s rank %d faulted; last peer (rank %d) exited %.2f s later\n",
                point.c_str(), action.c_str(), rank, last_rank, seconds);
    // The relaunch: a fresh run id, no fault; resumes from the newest
    // checkpoint every rank holds.
    RunClean(dir, Flags(dir, zero_stage, cell + "-relaunch", "--save_parameters params"));
    if (HasFatalFailure()) return;
    if (iteration > 0 || seeded) {
      EXPECT_THAT(ReadFile(dir / "rank0.log"), ::testing::HasSubstr("resumed from checkpoint"));
    }
    ExpectSameSavedParameters(dir, reference, kRanks);
  }
  void RunPoint(const std::string& point, int rank, int iteration, int zero_stage = 0,
                bool seeded = false) {
    for (const char* action : {"error", "sigterm", "kill"}) {
      RunCell(point, action, rank, iteration, zero_stage, seeded);
      if (HasFatalFailure()) return;
    }
  }

  std::unique_ptr<RedisServer> redis_;
  // parallelism.context of the test's job (JobConfig).
  int context_ = 1;
  std::filesystem::path root_ = FreshDirectory("faults");
  std::vector<std::filesystem::path> launched_;
  std::map<int, std::filesystem::path> references_;
};

// The rendezvous points: the faulty launch is a relaunch itself (two
// iterations done), so its own relaunch resumes from their checkpoint.
TEST_F(FaultInjection, BeforeTheRendezvous) { RunPoint("before_rendezvous", 1, 0, 0, true); }
TEST_F(FaultInjection, AfterTheRendezvousBeforeTheFirstInstruction) {
  RunPoint("after_rendezvous", 2, 0, 0, true);
}
// The other replica has not met its data-parallel group yet.
TEST_F(FaultInjection, InTheFirstIterationBeforeTheAllReduce) {
  RunPoint("before_all_reduce", 0, 0);
}
TEST_F(FaultInjection, InASend) { RunPoint("in_send", 0, 2); }
TEST_F(FaultInjection, InAReceive) { RunPoint("in_receive", 1, 2); }
TEST_F(FaultInjection, InsideTheAllReduce) { RunPoint("in_all_reduce", 2, 2); }
TEST_F(FaultInjection, InsideZeroStage1Collectives) {
  RunPoint("in_sharded_collective", 3, 2, /*zero_stage=*/1);
}
TEST_F(FaultInjection, WhileWritingACheckpoint) { RunPoint("in_checkpoint_write", 1, 2); }
TEST_F(FaultInjection, BetweenIterations) { RunPoint("between_iterations", 3, 1); }
// The iteration's report runs on the reporter's thread while the next
// iteration runs: a rank whose report fails or dies there still ends every
// peer (their reports wait for its totals).
TEST_F(FaultInjection, InTheIterationReport) { RunPoint("in_report", 2, 1); }
// A context-parallel lane (data 2 x context 2, every micro-batch split) that
// fails inside the all-gather of a split micro-batch's keys or values: its
// lane partner waits in the same gather, the other replica at the
// gradient all-reduce.
TEST_F(FaultInjection, InsideTheContextGather) {
  context_ = 2;
  RunPoint("in_context_gather", 1, 2);
}

// Rank 0's plan of iteration 0, corrupted.
struct Corruption {
  const char* name;
  std::function<void(v1::ExecutionPlan&)> edit;          // on the parsed plan
  std::function<std::string(const std::string&)> bytes;  // on the file (when no edit)
};

v1::Instruction* FirstOf(v1::ExecutionPlan& plan, v1::Instruction::OpCase op) {
  for (v1::Instruction& in : *plan.mutable_instructions()) {
    if (in.op_case() == op) return &in;
  }
  return nullptr;
}

std::vector<Corruption> Corruptions() {
  std::vector<Corruption> c;
  c.push_back({"num_buffers", [](v1::ExecutionPlan& p) { p.set_num_buffers(4294967295u); }, {}});
  c.push_back({"huge_lengths",
               [](v1::ExecutionPlan& p) { p.mutable_micro_batches(0)->set_input_len(4000000000u); },
               {}});
  c.push_back({"negative_shape",
               [](v1::ExecutionPlan& p) {
                 FirstOf(p, v1::Instruction::kForward)
                     ->mutable_forward()
                     ->mutable_output_tensors(0)
                     ->set_dims(0, -5);
               },
               {}});
  c.push_back({"enormous_shape",
               [](v1::ExecutionPlan& p) {
                 FirstOf(p, v1::Instruction::kForward)
                     ->mutable_forward()
                     ->mutable_output_tensors(0)
                     ->set_dims(0, int64_t{1} << 40);
               },
               {}});
  c.push_back({"truncated", {}, [](const std::string& s) { return s.substr(0, s.size() / 2); }});
  c.push_back({"random_bytes", {}, [](const std::string& s) {
                 std::mt19937 random(7);
                 std::string bytes(s.size(), '\0');
                 for (char& b : bytes) b = static_cast<char>(random() & 0xff);
                 return bytes;
               }});
  c.push_back({"wrong_rank", [](v1::ExecutionPlan& p) { p.set_pp_rank(1); }, {}});
  c.push_back({"peer_99",
               [](v1::ExecutionPlan& p) {
                 FirstOf(p, v1::Instruction::kSendStart)->mutable_send_start()->set_peer(99);
               },
               {}});
  c.push_back({"unknown_stage",
               [](v1::ExecutionPlan& p) { FirstOf(p, v1::Instruction::kForward)->set_stage(99); },
               {}});
  c.push_back({"all_reduce_group",
               [](v1::ExecutionPlan& p) {
                 v1::AllReduceGradients* reduce =
                     FirstOf(p, v1::Instruction::kAllReduce)->mutable_all_reduce();
                 reduce->clear_group_ranks();
                 reduce->add_group_ranks(0);
                 reduce->add_group_ranks(99);
               },
               {}});
  return c;
}

TEST_F(FaultInjection, CorruptPlansOfRankZeroEndEveryRank) {
  for (const Corruption& corruption : Corruptions()) {
    SCOPED_TRACE(corruption.name);
    const std::filesystem::path dir = NewRun(absl::StrCat("corrupt-", corruption.name), 0);
    // This launch's own copy of the plans, rank 0's of iteration 0 corrupted.
    const std::filesystem::path plans = dir / "plans";
    std::filesystem::copy(root_ / "plans-0", plans, std::filesystem::copy_options::recursive);
    const std::filesystem::path file = plans / "iteration_000000" / "rank_00000.json";
    const std::string text = ReadFile(file);
    std::string corrupted;
    if (corruption.edit) {
      v1::ExecutionPlan plan;
      ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(text, &plan).ok());
      corruption.edit(plan);
      ASSERT_TRUE(google::protobuf::util::MessageToJsonString(plan, &corrupted).ok());
    } else {
      corrupted = corruption.bytes(text);
    }
    std::ofstream(file, std::ios::trunc) << corrupted;
    const absl::Time start = absl::Now();
    Start(dir, absl::StrCat("--config job.json --plans plans --run_id corrupt-", corruption.name));
    const Ends ends = WatchEnds(dir, kHangLimit);
    const std::string logs = RankLogs(dir, kRanks);
    ASSERT_TRUE(ends.all()) << "a rank still runs " << kHangLimit << " after the start\n" << logs;
    // Rank 0 refuses the plan once the ranks met; every other rank must end
    // on the news of it (the other replica used to wait for ever), none by
    // a wait that ran out its watchdog.
    absl::Time last = *ends.at[0];
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_NE(RankExit(dir, r), 0) << logs;
      EXPECT_EQ(WaitThatRanOut(ReadFile(dir / absl::StrCat("rank", r, ".log"))), "")
          << "a wait of rank " << r << " ran out its time: rank 0's refusal did not end it\n"
          << logs;
      last = std::max(last, *ends.at[r]);
      if (r > 0) {
        EXPECT_TRUE(NamesFailedRank(ReadFile(dir / absl::StrCat("rank", r, ".log")), 0))
            << "rank " << r << "\n"
            << logs;
      }
    }
    std::printf("  rank 2's last line: %s\n", LastLine(ReadFile(dir / "rank2.log")).c_str());
    std::printf(
        "corrupt plan %-17s: all four ranks exited %.2f s after the launch (rank 0 %.2f s)\n",
        corruption.name, absl::ToDoubleSeconds(last - start),
        absl::ToDoubleSeconds(*ends.at[0] - start));
  }
}

}  // namespace
}  // namespace varipipe
