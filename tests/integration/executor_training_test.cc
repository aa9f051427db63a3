// Four real executor processes (pp=4, Gloo over loopback, rendezvous through
// a real redis-server) train a small GPT for ten iterations on plans that
// varipipe-plan emitted: every rank exits 0, the loss decreases, and rank 0
// writes one metrics line per iteration. The data is learnable (arithmetic
// token sequences), so a falling loss means the pipeline really trains.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/status_matchers.h"

namespace varipipe {
namespace {

using ::varipipe::testing::IsOk;

struct CommandResult {
  int exit_code = -1;
  std::string output;
};

CommandResult RunCommand(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer;
  size_t n = 0;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) {
    result.output.append(buffer.data(), n);
  }
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

std::string Bin(const std::string& name) {
  return absl::StrCat(VARIPIPE_BINARY_DIR, "/bin/", name);
}

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST(ExecutorTraining, FourPipelineRanksTrainTenIterations) {
  absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
  ASSERT_THAT(redis, IsOk());
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("varipipe-train-", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // Arithmetic sequences of mixed lengths: token k = (start + step * k) % 60 + 1.
  {
    std::mt19937 rng(5);
    std::ofstream data(dir / "data.jsonl");
    std::ofstream lengths(dir / "lengths.csv");
    for (int i = 0; i < 2000; ++i) {
      const int bucket = static_cast<int>(rng() % 3);
      const int n = bucket == 0 ? 4 + static_cast<int>(rng() % 13)
                    : bucket == 1 ? 16 + static_cast<int>(rng() % 33)
                                  : 48 + static_cast<int>(rng() % 43);
      const int start = static_cast<int>(rng() % 60);
      const int step = 1 + static_cast<int>(rng() % 3);
      std::vector<int> tokens;
      for (int k = 0; k < n; ++k) tokens.push_back((start + step * k) % 60 + 1);
      data << "{\"input\": [" << absl::StrJoin(tokens, ", ") << "]}\n";
      lengths << n << ",0\n";
    }
  }
  std::ofstream(dir / "job.json") << absl::StrCat(R"({
    "job_id": "train-test",
    "model": {"kind": "gpt", "num_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
              "ffn_hidden_size": 128, "vocab_size": 64, "dtype": "float32"},
    "parallelism": {"pipeline": 4, "data": 1},
    "cluster": {"devices_per_node": 4, "device_memory_limit_mib": 6},
    "data": {"format": "jsonl", "path": "data.jsonl", "tokens_per_global_batch": 2048,
             "max_sequence_length": 96, "seed": 3},
    "planner": {"schedules": ["adaptive", "one_f_one_b"], "tmax_interval_ms": 0.01},
    "store": {"password_env": "VARIPIPE_TEST_REDIS_PASSWORD", "redis_address": "127.0.0.1:)",
                                                  (*redis)->port(), R"("},
    "training": {"iterations": 10, "learning_rate": 0.003, "warmup_iterations": 2,
                 "watchdog_timeout_s": 60}
  })");
  const std::string cd = absl::StrCat("cd '", dir.string(), "' && ");
  const CommandResult plan = RunCommand(
      cd + Bin("varipipe-plan") +
      " --config job.json --lengths lengths.csv --iterations 10 --emit-plans plans");
  ASSERT_EQ(plan.exit_code, 0) << plan.output;

  // The password comes from the environment the config names; the fixture's
  // server requires one.
  std::string launch = cd + "export VARIPIPE_TEST_REDIS_PASSWORD='" + (*redis)->password() +
                       "'; pids=''; for r in 0 1 2 3; do RANK=$r WORLD_SIZE=4 LOCAL_RANK=$r "
                       "timeout 300 " +
                       Bin("varipipe-executor") +
                       " --config job.json --plans plans --run_id test "
                       "--metrics_jsonl metrics.jsonl > rank$r.log 2>&1 & pids=\"$pids $!\"; "
                       "done; rc=0; for p in $pids; do wait $p || rc=1; done; exit $rc";
  const CommandResult run = RunCommand(launch);
  std::string logs;
  for (int r = 0; r < 4; ++r) {
    logs += absl::StrCat("--- rank ", r, "\n", ReadFile(dir / absl::StrCat("rank", r, ".log")));
  }
  ASSERT_EQ(run.exit_code, 0) << run.output << logs;

  std::vector<double> losses;
  std::ifstream metrics(dir / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    google::protobuf::Struct record;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(line, &record).ok()) << line;
    losses.push_back(record.fields().at("loss").number_value());
    EXPECT_GT(record.fields().at("padding_efficiency").number_value(), 0.5) << line;
    EXPECT_GT(record.fields().at("instructions").number_value(), 10) << line;
  }
  ASSERT_EQ(losses.size(), 10u) << logs;
  std::printf("losses: %s\n", absl::StrJoin(losses, " ").c_str());
  EXPECT_NEAR(losses.front(), std::log(64.0), 0.5);  // near-uniform at the start
  EXPECT_LT(losses.back(), 0.9 * losses.front()) << logs;
  EXPECT_THAT(ReadFile(dir / "rank0.log"), ::testing::HasSubstr("iteration 9: loss"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace varipipe
