// Shared by the plan fuzz targets: the job configs the plans are checked
// against (plan_configs/, the configs the seed plans were made from) and the
// executor's check, as executor_main runs it.
#ifndef VARIPIPE_TESTS_FUZZ_PLAN_FUZZ_H_
#define VARIPIPE_TESTS_FUZZ_PLAN_FUZZ_H_

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/config/job_config.h"
#include "executor/runtime/plan_check.h"
#include "varipipe/v1/config.pb.h"
#include "varipipe/v1/plan.pb.h"

namespace varipipe::fuzz {

// GPT (interleaved, pp 2 x dp 2) and T5 (pp 2): a plan is checked against
// the config whose job_id it names, else the first.
inline const std::vector<v1::JobConfig>& PlanConfigs() {
  static const auto* const configs = [] {
    auto* loaded = new std::vector<v1::JobConfig>;
    for (const char* name : {"gpt.json", "t5.json"}) {
      const std::string path = std::string(VARIPIPE_FUZZ_DIR) + "/plan_configs/" + name;
      absl::StatusOr<v1::JobConfig> config = LoadJobConfigFile(path);
      if (!config.ok()) {
        std::fprintf(stderr, "%s\n", std::string(config.status().message()).c_str());
        std::abort();
      }
      loaded->push_back(*std::move(config));
    }
    return loaded;
  }();
  return *configs;
}

// The executor's check with the executor's own coordinates: the rank the
// plan names when it is one of the job's ranks (else rank 0), its
// coordinates as ComputeCoordinates derives them, the iteration it names.
inline void CheckFuzzedPlan(const v1::ExecutionPlan& plan) {
  const v1::JobConfig* config = &PlanConfigs().front();
  for (const v1::JobConfig& c : PlanConfigs()) {
    if (c.job_id() == plan.job_id()) config = &c;
  }
  const int world = WorldSize(*config);
  const int pipeline = static_cast<int>(config->parallelism().pipeline());
  const int rank = plan.rank() >= 0 && plan.rank() < world ? plan.rank() : 0;
  const absl::Status status = executor::CheckPlan(plan, *config,
                                                  {.iteration = plan.iteration(),
                                                   .rank = rank,
                                                   .dp_rank = rank / pipeline,
                                                   .pp_rank = rank % pipeline});
  // Errors must be INVALID_ARGUMENT (the executor reports them as such).
  if (!status.ok() && status.code() != absl::StatusCode::kInvalidArgument) std::abort();
}

}  // namespace varipipe::fuzz

#endif  // VARIPIPE_TESTS_FUZZ_PLAN_FUZZ_H_
