#include "executor/runtime/launch_env.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/config/job_config.h"
#include "common/config/rank_layout.h"

namespace varipipe::executor {
namespace {

struct VariableNames {
  const char* launcher;
  const char* rank;
  const char* world_size;
  const char* local_rank;
};

constexpr VariableNames kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
};

absl::StatusOr<int> ParseVariable(const GetEnvFn& getenv, const char* name, int min_value) {
  const std::optional<std::string> value = getenv(name);
  if (!value.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("environment variable ", name, " is not set"));
  }
  int parsed = 0;
  if (!absl::SimpleAtoi(*value, &parsed) || parsed < min_value) {
    return absl::InvalidArgumentError(absl::StrCat("environment variable ", name, "='", *value,
                                                   "' must be an integer >= ", min_value));
  }
  return parsed;
}

}  // namespace

absl::StatusOr<LaunchEnv> ReadLaunchEnv(const GetEnvFn& getenv) {
  for (const VariableNames& names : kLaunchers) {
    if (!getenv(names.rank).has_value() && !getenv(names.world_size).has_value()) continue;
    LaunchEnv env;
    env.launcher = names.launcher;
    absl::StatusOr<int> rank = ParseVariable(getenv, names.rank, 0);
    if (!rank.ok()) return rank.status();
    absl::StatusOr<int> world_size = ParseVariable(getenv, names.world_size, 1);
    if (!world_size.ok()) return world_size.status();
    env.rank = *rank;
    env.world_size = *world_size;
    if (env.rank >= env.world_size) {
      return absl::InvalidArgumentError(absl::StrCat("environment variable ", names.rank, "=",
                                                     env.rank, " is not below ", names.world_size,
                                                     "=", env.world_size));
    }
    // LOCAL_RANK is optional: without it every process counts as local rank 0
    // of its own node only if the world is a single process.
    if (getenv(names.local_rank).has_value()) {
      absl::StatusOr<int> local_rank = ParseVariable(getenv, names.local_rank, 0);
      if (!local_rank.ok()) return local_rank.status();
      env.local_rank = *local_rank;
    } else if (env.world_size > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "environment variable ", names.local_rank, " is not set (", names.launcher,
          " sets it; when launching by hand set it to the process's index on its node)"));
    }
    return env;
  }
  return LaunchEnv{.rank = 0, .world_size = 1, .local_rank = 0, .launcher = "none"};
}

absl::StatusOr<LaunchEnv> ReadLaunchEnv() {
  return ReadLaunchEnv([](const char* name) -> std::optional<std::string> {
    const char* value = std::getenv(name);
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  });
}

absl::StatusOr<RankCoordinates> ComputeCoordinates(const LaunchEnv& env,
                                                   const v1::JobConfig& config) {
  const int expected = WorldSize(config);
  if (env.world_size != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the launcher started ", env.world_size, " process(es) but job ", config.job_id(),
        " needs parallelism.pipeline (", config.parallelism().pipeline(), ") x parallelism.data (",
        config.parallelism().data(), ") x parallelism.tensor (",
        std::max(1u, config.parallelism().tensor()), ") x parallelism.context (",
        std::max(1u, config.parallelism().context()), ") = ", expected));
  }
  const RankLayout layout = RankLayout::Of(config.parallelism());
  const int plan_rank = layout.PipelineRankOf(env.rank);
  return RankCoordinates{.rank = env.rank,
                         .dp_rank = static_cast<int>(layout.DpRank(plan_rank)),
                         .pp_rank = static_cast<int>(layout.PpRank(plan_rank)),
                         .plan_rank = plan_rank,
                         .tensor_index = static_cast<int>(layout.TensorIndex(env.rank)),
                         .context_rank = static_cast<int>(layout.ContextRank(plan_rank))};
}

std::string LaunchId() {
  if (const char* id = std::getenv("TORCHELASTIC_RUN_ID"); id != nullptr && *id != '\0') {
    const char* restarts = std::getenv("TORCHELASTIC_RESTART_COUNT");
    return absl::StrCat(id, ".", restarts != nullptr ? restarts : "0");
  }
  if (const char* id = std::getenv("OMPI_MCA_orte_ess_jobid"); id != nullptr && *id != '\0') {
    return id;
  }
  return "default";
}

}  // namespace varipipe::executor
