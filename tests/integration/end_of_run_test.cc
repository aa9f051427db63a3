// The end of a run as users see it (docs/executor.md, "The end of a run";
// docs/operations.md, "The end of a job"; docs/cost-model.md, "Which device
// the cost model describes"), with real processes: a redis-server, two
// planner daemons sharing the job (one with --keep_serving) and two
// executors (pp = 2) training a tiny Llama without a profile:
// - rank 0 ends with a summary: the iterations, first and last loss, real
//   tokens/s, the checkpoint and export directories as absolute paths, and
//   "export complete" once every rank's part is written;
// - the daemon without --keep_serving logs "job complete" and exits 0 once
//   both ranks reported the last iteration; the other serves on, and
//   varipipe-ctl status names the cost model beside the prediction error;
// - on the CPU, rank 0 warns at start-up that the plans come from a GPU's
//   analytic model, and says how to profile; the daemon says so too once
//   the measured iteration is far from the predicted one.
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/command.h"
#include "tests/testing/executor_ranks.h"
#include "tests/testing/planner_process.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/status_matchers.h"

namespace varipipe {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using ::varipipe::testing::Bin;
using ::varipipe::testing::CommandResult;
using ::varipipe::testing::FreshDirectory;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::LaunchRanks;
using ::varipipe::testing::PlannerProcess;
using ::varipipe::testing::ReadFile;
using ::varipipe::testing::RedisServer;
using ::varipipe::testing::RunCommand;

constexpr char kToken[] = "end-of-run-test-token-0123456789abcdef";

TEST(EndOfRun, RankZeroSummarisesAndTheDaemonsEndTheJob) {
  absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
  ASSERT_THAT(redis, IsOk());
  const fs::path dir = FreshDirectory("end-of-run");
  std::ofstream(dir / "token") << kToken << "\n";
  std::ofstream(dir / "password") << (*redis)->password() << "\n";
  for (const char* secret : {"token", "password"}) {
    fs::permissions(dir / secret, fs::perms::owner_read | fs::perms::owner_write);
  }
  // No planner.cost_model_path: the analytic model of the default preset.
  std::ofstream(dir / "job.json") << absl::StrCat(
      R"({"job_id": "end-of-run",
      "model": {"kind": "GPT", "architecture": "LLAMA", "num_layers": 2, "hidden_size": 32,
                "num_attention_heads": 4, "num_key_value_heads": 2, "ffn_hidden_size": 64,
                "vocab_size": 96, "norm_epsilon": 1e-5, "rope_theta": 10000,
                "dtype": "FLOAT32"},
      "parallelism": {"pipeline": 2},
      "cluster": {"device_memory_limit_mib": 8, "devices_per_node": 8},
      "data": {"format": "SYNTHETIC", "tokens_per_global_batch": 1200,
               "max_sequence_length": 96, "seed": 11, "synthetic_num_samples": 5000},
      "planner": {"tmax_interval_ms": 0.01, "threads": 1},
      "store": {"redis_address": "127.0.0.1:)",
      (*redis)->port(), R"(", "password_file": ")", (dir / "password").string(), R"("},
      "training": {"iterations": 3, "learning_rate": 0.01, "watchdog_timeout_s": 60,
                   "checkpoint_dir": "ckpt", "checkpoint_interval": 3}})");
  const std::vector<std::string> common = {"--config", (dir / "job.json").string(), "--listen",
                                           "127.0.0.1:0", "--threads", "1", "--token_file",
                                           (dir / "token").string()};
  std::unique_ptr<PlannerProcess> plain = PlannerProcess::Spawn(dir, "plain", common);
  std::vector<std::string> serving_args = common;
  serving_args.push_back("--keep_serving");
  std::unique_ptr<PlannerProcess> serving = PlannerProcess::Spawn(dir, "serving", serving_args);
  const int plain_port = plain->WaitForPort();
  ASSERT_GT(plain_port, 0) << plain->Log();
  const int serving_port = serving->WaitForPort();
  ASSERT_GT(serving_port, 0) << serving->Log();

  // Relative output paths, from the ranks' directory (dir).
  const CommandResult run = LaunchRanks(
      dir, 2, "",
      absl::StrCat("--planner 127.0.0.1:", plain_port, ",127.0.0.1:", serving_port,
                   " --token_file token --run_id end --export_hf export --metrics_jsonl m.jsonl"));
  ASSERT_EQ(run.exit_code, 0) << run.output << plain->Log() << serving->Log();
  const std::string rank0 = ReadFile(dir / "rank0.log");
  const std::string abs = fs::canonical(dir).string();
  EXPECT_THAT(rank0, HasSubstr("run summary: iterations 0 to 2 (3 in this launch")) << rank0;
  EXPECT_THAT(rank0, HasSubstr("(iteration 0) -> ")) << rank0;
  EXPECT_THAT(rank0, HasSubstr("(iteration 2)")) << rank0;
  EXPECT_THAT(rank0, HasSubstr("real tokens/s")) << rank0;
  EXPECT_THAT(rank0, HasSubstr(absl::StrCat("checkpoints     ", abs,
                                            "/ckpt (newest after 3 iterations)")))
      << rank0;
  EXPECT_THAT(rank0, HasSubstr(absl::StrCat("Hugging Face    ", abs, "/export: export complete "
                                            "(every rank's part written: ")))
      << rank0;
  EXPECT_THAT(rank0, HasSubstr(absl::StrCat("metrics         ", abs, "/m.jsonl"))) << rank0;
  EXPECT_THAT(rank0, HasSubstr(absl::StrCat("Hugging Face checkpoint in ", abs, "/export")))
      << rank0;
  // The summary comes after both ranks' parts: rank 1's shard is there.
  const std::string index = ReadFile(dir / "export" / "model.safetensors.index.json");
  EXPECT_THAT(index, HasSubstr("model-00002-of-00002.safetensors")) << index;
  EXPECT_TRUE(fs::exists(dir / "export" / "model-00002-of-00002.safetensors"));

  // The device: rank 0 says whether the plans were made for it.
  const bool on_cpu = absl::StrContains(rank0, "; device cpu;");
  const std::string warning =
      "the plans' times come from the analytic model of a100-40gb (cluster.hardware; no "
      "planner.cost_model_path), which describes a GPU, but this executor runs on cpu";
  if (on_cpu) {
    EXPECT_THAT(rank0, HasSubstr(warning)) << rank0;
    EXPECT_THAT(rank0, HasSubstr("varipipe-profile --config job.json")) << rank0;
  } else {
    EXPECT_THAT(rank0, Not(HasSubstr("the plans' times come from"))) << rank0;
  }

  // The daemon without --keep_serving ended the job ...
  const std::optional<int> plain_exit = plain->WaitForExit(absl::Seconds(60));
  ASSERT_TRUE(plain_exit.has_value()) << plain->Log();
  EXPECT_EQ(*plain_exit, 0) << plain->Log();
  EXPECT_THAT(plain->Log(), HasSubstr("job complete: all 2 executor ranks reported iteration 2"));
  // ... the other serves on, and its status names the cost model.
  const CommandResult status = RunCommand(absl::StrCat(
      Bin("varipipe-ctl"), " --planner 127.0.0.1:", serving_port, " --token_file '",
      (dir / "token").string(), "' status 2>&1"));
  EXPECT_EQ(status.exit_code, 0) << status.output << serving->Log();
  EXPECT_THAT(status.output,
              HasSubstr("cost model: the analytic model of a100-40gb (cluster.hardware; no "
                        "planner.cost_model_path)"));
  if (on_cpu) {
    // An A100's times against a CPU's: off by far more than half.
    EXPECT_THAT(status.output, HasSubstr("does the cost model describe the executors' device?"))
        << status.output;
    const std::string logs = plain->Log() + serving->Log();
    EXPECT_THAT(logs, HasSubstr("does not describe the executors' device")) << logs;
  }
  EXPECT_THAT(serving->Log(), HasSubstr("job complete"));
  EXPECT_EQ(serving->Stop(), 0) << serving->Log();
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

}  // namespace
}  // namespace varipipe
