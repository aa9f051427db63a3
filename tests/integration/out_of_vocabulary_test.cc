// Token ids beyond model.vocab_size, with real processes: the planner
// daemon refuses to start and `varipipe-executor --check_launch` refuses
// the launch, naming the file, the id, its sample and the vocabulary (the
// second check reusing the cache the first wrote beside the index); and in
// a run that meets such a sample anyway (plans from files, no daemon), the
// rank that did not read it names the reading rank's cause first, not its
// own failed receive.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/dataset/indexed_dataset.h"
#include "common/dataset/token_range.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/command.h"
#include "tests/testing/executor_ranks.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/status_matchers.h"

namespace varipipe {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::varipipe::testing::Bin;
using ::varipipe::testing::CommandResult;
using ::varipipe::testing::FreshDirectory;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::ReadFile;
using ::varipipe::testing::RunCommand;

constexpr int kSamples = 400;
constexpr int kVocab = 64;
constexpr int kBadId = 100;

// A GPT of vocabulary `vocab` over DIR/d/data_{input,target}, two pipeline
// stages; `store` is the config's store section (may be empty).
std::string JobJson(int vocab, const std::string& store) {
  return absl::StrCat(R"({"job_id": "oov",
    "model": {"kind": "gpt", "num_layers": 4, "hidden_size": 32, "num_attention_heads": 4,
              "ffn_hidden_size": 64, "vocab_size": )",
                      vocab, R"(, "dtype": "float32"},
    "parallelism": {"pipeline": 2, "data": 1},
    "cluster": {"devices_per_node": 2, "device_memory_limit_mib": 6},
    "data": {"format": "megatron_indexed", "path": "d/data_input",
             "target_path": "d/data_target", "tokens_per_global_batch": 4096,
             "max_sequence_length": 64, "seed": 5},
    "planner": {"tmax_interval_ms": 0.01, "threads": 1},
    )",
                      store.empty() ? "" : absl::StrCat(store, ","),
                      R"(
    "training": {"iterations": 2, "learning_rate": 0.01, "watchdog_timeout_s": 20}})");
}

class OutOfVocabulary : public ::testing::Test {
 protected:
  // Inputs with ids in [1, 64) except id 100 in every sample i with
  // i % 10 == 7 (so the first iteration meets one); targets in range; the
  // lengths for varipipe-plan.
  void SetUp() override {
    std::vector<std::vector<int64_t>> inputs(kSamples);
    std::vector<std::vector<int64_t>> targets(kSamples);
    std::ofstream lengths(dir_ / "lengths.csv");
    for (int i = 0; i < kSamples; ++i) {
      inputs[i].resize(5 + (i * 13) % 50);
      for (size_t k = 0; k < inputs[i].size(); ++k) inputs[i][k] = 1 + (i * 7 + k * 3) % 63;
      if (i % 10 == 7) inputs[i][3] = kBadId;
      targets[i] = {1 + i % 63, 2, 3};
      lengths << inputs[i].size() << "," << targets[i].size() << "\n";
    }
    std::filesystem::create_directories(dir_ / "d");
    ASSERT_THAT(WriteIndexedFile(Prefix("input"), inputs, 1000), IsOk());
    ASSERT_THAT(WriteIndexedFile(Prefix("target"), targets, 1000), IsOk());
  }
  void TearDown() override {
    std::error_code ignored;
    if (!HasFailure()) std::filesystem::remove_all(dir_, ignored);
  }
  std::string Prefix(const std::string& side) const {
    return (dir_ / "d" / absl::StrCat("data_", side)).string();
  }
  // The refusal every start-up check gives.
  std::string Refusal() const {
    return absl::StrCat("data.path: ", Prefix("input"), ".bin: largest token id ", kBadId,
                        " (first in sample 7) is not below model.vocab_size ", kVocab,
                        "; the first sample with an id outside [0, ", kVocab, ") is sample 7");
  }
  CommandResult Run(const std::string& command) {
    return RunCommand(absl::StrCat("cd '", dir_.string(), "' && ", command));
  }

  std::filesystem::path dir_ = FreshDirectory("oov");
};

TEST_F(OutOfVocabulary, PlannerDaemonRefusesToStart) {
  std::ofstream(dir_ / "job.json") << JobJson(kVocab, "");
  // Bounded: a daemon that accepted the data would serve until stopped.
  const CommandResult result =
      Run("timeout 120 " + Bin("varipipe-planner") + " --config job.json --listen 127.0.0.1:0");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_THAT(result.output, AllOf(HasSubstr("cannot start: "), HasSubstr(Refusal())));
  // The scan's result waits beside the index for the next start.
  EXPECT_TRUE(std::filesystem::exists(TokenRangeCachePath(Prefix("input"))));
  EXPECT_TRUE(std::filesystem::exists(TokenRangeCachePath(Prefix("target"))));
}

#ifdef VARIPIPE_HAVE_EXECUTOR
TEST_F(OutOfVocabulary, CheckLaunchRefusesAndReusesTheCache) {
  std::ofstream(dir_ / "job.json") << JobJson(kVocab, "");
  const std::string check =
      Bin("varipipe-executor") + " --check_launch --config job.json";
  const CommandResult first = Run("RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 " + check);
  EXPECT_EQ(first.exit_code, 2) << first.output;
  EXPECT_THAT(first.output, AllOf(HasSubstr(Refusal()), HasSubstr("(scanned in ")));
  const CommandResult second = Run("RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 " + check);
  EXPECT_EQ(second.exit_code, 2) << second.output;
  EXPECT_THAT(second.output,
              AllOf(HasSubstr(Refusal()),
                    HasSubstr(absl::StrCat("(from ", TokenRangeCachePath(Prefix("input")), ")")),
                    Not(HasSubstr("(scanned in "))));
  // Local rank 0 checks for its host.
  const CommandResult other = Run("RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 " + check);
  EXPECT_EQ(other.exit_code, 0) << other.output;
  // A vocabulary that holds every id passes.
  std::ofstream(dir_ / "big.json") << JobJson(kBadId + 1, "");
  const CommandResult fixed = Run("RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 " + Bin("varipipe-executor") +
                                  " --check_launch --config big.json");
  EXPECT_EQ(fixed.exit_code, 0) << fixed.output;
  EXPECT_THAT(fixed.output, HasSubstr("token ids within model.vocab_size 101"));
}

// Plans from files, so no daemon refuses the data: rank 0 (stage 0) fails
// reading a sample; rank 1, whose receive from rank 0 then fails, names
// rank 0's cause first and its own receive after it.
TEST_F(OutOfVocabulary, PeerOfTheFailedRankNamesItsCauseFirst) {
  absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
  ASSERT_THAT(redis, IsOk());
  std::ofstream(dir_ / "job.json") << JobJson(
      kVocab, absl::StrCat(R"("store": {"password_env": "VARIPIPE_TEST_REDIS_PASSWORD",
                                        "redis_address": "127.0.0.1:)",
                           (*redis)->port(), R"("})"));
  const CommandResult plan = Run(Bin("varipipe-plan") +
                                 " --config job.json --lengths lengths.csv --iterations 2 "
                                 "--emit-plans plans");
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  testing::StartRanks(dir_, 2, (*redis)->password(),
                      "--config job.json --plans plans --run_id oov");
  ASSERT_NE(testing::WaitForRanks(dir_, 2, std::chrono::seconds(180)), -1)
      << testing::RankLogs(dir_, 2);
  const std::string logs = testing::RankLogs(dir_, 2);
  EXPECT_EQ(testing::RankExit(dir_, 0), 1) << logs;
  EXPECT_EQ(testing::RankExit(dir_, 1), 1) << logs;
  const std::string cause = absl::StrCat("has token id ", kBadId, " outside the vocabulary");
  EXPECT_THAT(ReadFile(dir_ / "rank0.log"), HasSubstr(cause)) << logs;
  const std::string peer = ReadFile(dir_ / "rank1.log");
  const size_t named = peer.find("ended because rank 0 failed: ");
  ASSERT_NE(named, std::string::npos) << logs;
  const size_t own = peer.find("(this rank was at: ", named);
  ASSERT_NE(own, std::string::npos) << logs;
  EXPECT_NE(peer.substr(named, own - named).find(cause), std::string::npos) << logs;
  // Its own receive never comes first with the cause as an afterthought.
  EXPECT_THAT(peer, Not(HasSubstr("other ranks: rank 0 failed"))) << logs;
}
#endif

}  // namespace
}  // namespace varipipe
