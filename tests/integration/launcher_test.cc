// Real launchers (torchrun, mpirun) start four executors; each finds its
// own place in the job from the launcher's environment.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/command.h"

namespace varipipe {
namespace {

using ::varipipe::testing::Bin;
using ::varipipe::testing::CommandResult;
using ::varipipe::testing::Config;
using ::varipipe::testing::RunCommand;

using ::testing::HasSubstr;

// Debian's torchrun (PyTorch 1.13 under Python 3.11) mis-parses its default
// --redirects/--tee value "0", hence the explicit "--redirects 2 --tee 2";
// it also only knows the underscore spellings of its options.
void ExpectFourRanks(const CommandResult& result, const std::string& launcher) {
  EXPECT_EQ(result.exit_code, 0) << result.output;
  for (const char* rank : {"rank 0 of 4 (launcher %s, local rank 0) = dp 0 pp 0",
                           "rank 1 of 4 (launcher %s, local rank 1) = dp 0 pp 1",
                           "rank 2 of 4 (launcher %s, local rank 2) = dp 1 pp 0",
                           "rank 3 of 4 (launcher %s, local rank 3) = dp 1 pp 1"}) {
    const std::string expected = absl::StrReplaceAll(rank, {{"%s", launcher}});
    EXPECT_THAT(result.output, HasSubstr(expected));
  }
}

TEST(VaripipeExecutor, StartedByTorchrun) {
  const CommandResult result = RunCommand(
      "torchrun --no_python --nproc_per_node 4 --master_addr 127.0.0.1 --master_port 0 "
      "--redirects 2 --tee 2 " +
      Bin("varipipe-executor") + " --check_launch --config " + Config("quickstart-gpt.json"));
  ExpectFourRanks(result, "torchrun");
}

TEST(VaripipeExecutor, StartedByMpirun) {
  const CommandResult result = RunCommand(
      "mpirun --allow-run-as-root --oversubscribe --mca btl self,tcp -np 4 " +
      Bin("varipipe-executor") + " --check_launch --config " + Config("quickstart-gpt.json"));
  ExpectFourRanks(result, "mpirun");
}

}  // namespace
}  // namespace varipipe
