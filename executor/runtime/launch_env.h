// Where this executor process sits in the job: its global rank, the world
// size and its local rank, read from the launcher's environment, and its
// (data-parallel, pipeline, context, tensor) coordinates under the job's
// parallelism.
//
// Launchers:
//   torchrun --no_python:  RANK, WORLD_SIZE, LOCAL_RANK
//   mpirun (Open MPI):     OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
//                          OMPI_COMM_WORLD_LOCAL_RANK
//
// Rank layout: common/config/rank_layout.h.
#ifndef VARIPIPE_EXECUTOR_RUNTIME_LAUNCH_ENV_H_
#define VARIPIPE_EXECUTOR_RUNTIME_LAUNCH_ENV_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "varipipe/v1/config.pb.h"

namespace varipipe::executor {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  // "torchrun", "mpirun" or "none" (no launcher variables: a single process).
  std::string launcher;
};

// common/config/rank_layout.h: `rank` is the global rank, `plan_rank` the
// plan rank whose plan it runs (the same without tensor parallelism), and
// `context_rank` its lane in its context group (0 without context
// parallelism).
struct RankCoordinates {
  int rank = 0;
  int dp_rank = 0;
  int pp_rank = 0;
  int plan_rank = 0;
  int tensor_index = 0;
  int context_rank = 0;
};

// Looks variables up with `getenv` (tests pass their own). Errors name the
// variable: a non-integer value, a rank outside [0, world size), or a
// partial set of variables.
using GetEnvFn = std::function<std::optional<std::string>(const char* name)>;
absl::StatusOr<LaunchEnv> ReadLaunchEnv(const GetEnvFn& getenv);
// The same over the process environment.
absl::StatusOr<LaunchEnv> ReadLaunchEnv();

// The launch's id: torchrun's run id with its restart count (torchrun
// --standalone draws a fresh id per launch), else Open MPI's job id (fresh
// per mpirun), else "default". Ranks of one launch agree on it.
std::string LaunchId();

// Coordinates of `env.rank` in `config`. Fails when the launcher's world size
// differs from pipeline * data * tensor * context of the config.
absl::StatusOr<RankCoordinates> ComputeCoordinates(const LaunchEnv& env,
                                                   const v1::JobConfig& config);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_LAUNCH_ENV_H_
