#include "executor/runtime/launch_env.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::executor {
namespace {

using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

GetEnvFn Env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

v1::JobConfig Config(int pipeline, int data) {
  v1::JobConfig config;
  config.set_job_id("job");
  config.mutable_parallelism()->set_pipeline(pipeline);
  config.mutable_parallelism()->set_data(data);
  config.mutable_parallelism()->set_tensor(1);
  return config;
}

TEST(LaunchEnv, Torchrun) {
  absl::StatusOr<LaunchEnv> env =
      ReadLaunchEnv(Env({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}}));
  ASSERT_THAT(env, IsOk());
  EXPECT_EQ(env->launcher, "torchrun");
  EXPECT_EQ(env->rank, 5);
  EXPECT_EQ(env->world_size, 8);
  EXPECT_EQ(env->local_rank, 1);
}

TEST(LaunchEnv, OpenMpi) {
  absl::StatusOr<LaunchEnv> env = ReadLaunchEnv(Env({{"OMPI_COMM_WORLD_RANK", "2"},
                                                     {"OMPI_COMM_WORLD_SIZE", "4"},
                                                     {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}}));
  ASSERT_THAT(env, IsOk());
  EXPECT_EQ(env->launcher, "mpirun");
  EXPECT_EQ(env->rank, 2);
}

TEST(LaunchEnv, NoLauncherIsASingleProcess) {
  absl::StatusOr<LaunchEnv> env = ReadLaunchEnv(Env({}));
  ASSERT_THAT(env, IsOk());
  EXPECT_EQ(env->launcher, "none");
  EXPECT_EQ(env->world_size, 1);
}

TEST(LaunchEnv, ErrorsNameTheVariable) {
  EXPECT_THAT(ReadLaunchEnv(Env({{"RANK", "x"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("RANK='x'")));
  EXPECT_THAT(ReadLaunchEnv(Env({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("RANK=2 is not below")));
  EXPECT_THAT(ReadLaunchEnv(Env({{"RANK", "0"}})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("WORLD_SIZE is not set")));
  EXPECT_THAT(ReadLaunchEnv(Env({{"RANK", "0"}, {"WORLD_SIZE", "2"}})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("LOCAL_RANK is not set")));
}

TEST(LaunchEnv, CoordinatesPutPipelineStagesOnConsecutiveRanks) {
  const v1::JobConfig config = Config(4, 2);
  for (int rank = 0; rank < 8; ++rank) {
    absl::StatusOr<RankCoordinates> c = ComputeCoordinates(
        LaunchEnv{.rank = rank, .world_size = 8, .local_rank = 0, .launcher = "torchrun"}, config);
    ASSERT_THAT(c, IsOk());
    EXPECT_EQ(c->dp_rank, rank / 4);
    EXPECT_EQ(c->pp_rank, rank % 4);
  }
  EXPECT_THAT(
      ComputeCoordinates(
          LaunchEnv{.rank = 0, .world_size = 6, .local_rank = 0, .launcher = "torchrun"}, config),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("started 6 process(es)")));
}

// Tensor innermost, then context (common/config/rank_layout.h): global rank
// ((dp * pp + pp_rank) * context + lane) * tensor + tensor index.
TEST(LaunchEnv, CoordinatesPutContextLanesInsideEachPipelineRank) {
  v1::JobConfig config = Config(2, 2);
  config.mutable_parallelism()->set_context(2);
  config.mutable_parallelism()->set_tensor(2);
  for (int rank = 0; rank < 16; ++rank) {
    absl::StatusOr<RankCoordinates> c = ComputeCoordinates(
        LaunchEnv{.rank = rank, .world_size = 16, .local_rank = 0, .launcher = "torchrun"}, config);
    ASSERT_THAT(c, IsOk());
    EXPECT_EQ(c->tensor_index, rank % 2);
    EXPECT_EQ(c->plan_rank, rank / 2);
    EXPECT_EQ(c->context_rank, rank / 2 % 2);
    EXPECT_EQ(c->pp_rank, rank / 4 % 2);
    EXPECT_EQ(c->dp_rank, rank / 8);
  }
  EXPECT_THAT(
      ComputeCoordinates(
          LaunchEnv{.rank = 0, .world_size = 8, .local_rank = 0, .launcher = "torchrun"}, config),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("parallelism.context (2) = 16")));
}

}  // namespace
}  // namespace varipipe::executor
