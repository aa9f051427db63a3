#ifndef VARIPIPE_PLANNER_SERVICE_JOB_REGISTRY_H_
#define VARIPIPE_PLANNER_SERVICE_JOB_REGISTRY_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/redis/redis_client.h"
#include "planner/service/store_keys.h"
#include "planner/service/store_options.h"
#include "varipipe/v1/config.pb.h"

namespace varipipe::service {

// A stable hex digest of a config (FNV-1a 64 of its deterministic
// serialization); equal configs have equal digests.
std::string ConfigHash(const v1::JobConfig& config);

// What every daemon of a job agrees on, each written once by the first:
// the config, the job token and an AUTO job's stage layout.
class JobRegistry {
 public:
  JobRegistry(RedisClient& redis, const StoreKeys& keys, const StoreOptions& options)
      : redis_(redis), keys_(keys), options_(options) {}

  // Writes the job config if none is stored; otherwise checks it matches
  // (FAILED_PRECONDITION naming both digests and the first differing field).
  absl::Status RegisterJob(const v1::JobConfig& config);
  // The stored job config; NOT_FOUND when none.
  absl::StatusOr<v1::JobConfig> LoadJob();
  // Stores `candidate` as the job's token unless the job has one, and
  // returns the stored token. With `must_match` (a daemon given
  // --token_file), another stored token is FAILED_PRECONDITION.
  absl::StatusOr<std::string> RegisterToken(const std::string& candidate, bool must_match);
  // The job's stage layout (parallelism.stage_layout AUTO): the stored one,
  // or NOT_FOUND when no daemon chose one yet.
  absl::StatusOr<v1::StageLayoutConfig> LoadStageLayout();
  // Stores `chosen` unless the job has a layout, and returns the stored one
  // (the first daemon's choice holds for the whole job).
  absl::StatusOr<v1::StageLayoutConfig> RegisterStageLayout(const v1::StageLayoutConfig& chosen);

 private:
  RedisClient& redis_;
  const StoreKeys& keys_;
  const StoreOptions& options_;
};

}  // namespace varipipe::service

#endif  // VARIPIPE_PLANNER_SERVICE_JOB_REGISTRY_H_
