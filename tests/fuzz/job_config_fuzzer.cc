// Job configs (varipipe.v1.JobConfig as protobuf JSON: --config of every
// binary), loaded from a file as the binaries load them. A config that
// loads must print (JobConfigToJson, as varipipe-ctl shows it) to JSON that
// loads again to the same config, and the values derived from it must be
// computable.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/config/job_config.h"
#include "common/dataset/minibatch_sampler.h"
#include "planner/cost/model_dims.h"
#include "tests/fuzz/fuzz_scratch.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace varipipe;
  const std::string path = fuzz::Scratch::Write("job.json", data, size);
  absl::StatusOr<v1::JobConfig> config = LoadJobConfigFile(path);
  if (!config.ok()) return 0;
  const std::string json = JobConfigToJson(*config);
  absl::StatusOr<v1::JobConfig> again = ParseJobConfigJson(json, "printed config");
  if (again.ok()) {
    ApplyJobConfigDefaults(*again);
    const absl::Status valid = ValidateJobConfig(*again, "printed config");
    if (!valid.ok()) {
      std::fprintf(stderr, "%s\n", std::string(valid.message()).c_str());
      again = valid;
    }
  }
  if (!again.ok() || JobConfigToJson(*again) != json) {
    std::fprintf(stderr, "a loaded config does not survive printing and loading:\n%s\n%s\n",
                 json.c_str(), again.ok() ? JobConfigToJson(*again).c_str() : "");
    std::abort();
  }
  if (WorldSize(*config) < 1) std::abort();
  (void)SamplerOptionsFromConfig(*config);
  (void)planner::ModelDimsFromConfig(config->model());
  return 0;
}
