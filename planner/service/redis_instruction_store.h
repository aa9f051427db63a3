// The Redis instruction store: where planner daemons publish execution plans
// and executors (through the daemons) fetch them. One job's store, split by
// concern, each over the same connection and the keys named in
// store_keys.h (docs/instruction-store.md):
//   job()          the config, token and stage layout all daemons share
//   plans()        claims, leases and publication of each iteration's plans
//   progress()     fetches, acknowledgements and progress reports
//   calibration()  the cost model's online calibration and predictions
//
// Thread safety: one instance per thread (it owns one Redis connection).
#ifndef VARIPIPE_PLANNER_SERVICE_REDIS_INSTRUCTION_STORE_H_
#define VARIPIPE_PLANNER_SERVICE_REDIS_INSTRUCTION_STORE_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/redis/redis_client.h"
#include "planner/service/calibration_store.h"
#include "planner/service/job_registry.h"
#include "planner/service/plan_queue.h"
#include "planner/service/progress_ledger.h"
#include "planner/service/store_keys.h"
#include "planner/service/store_options.h"

namespace varipipe::service {

struct StoreCounters {
  uint64_t claimed = 0;  // iterations ever claimed (the next new one)
  uint64_t published = 0;
  uint64_t acknowledged = 0;  // iterations acknowledged by every rank
  uint64_t unpublished = 0;   // claimed, not yet published
  uint64_t min_progress = 0;  // iterations completed by every rank
};

class RedisInstructionStore {
 public:
  static absl::StatusOr<std::unique_ptr<RedisInstructionStore>> Open(
      const RedisClient::Options& redis, const StoreOptions& options);

  JobRegistry& job() { return job_; }
  PlanQueue& plans() { return plans_; }
  ProgressLedger& progress() { return progress_; }
  CalibrationStore& calibration() { return calibration_; }

  // The job's counters across the concerns: claims and publications,
  // acknowledgements, and the iterations every rank completed.
  absl::StatusOr<StoreCounters> Counters();

  const StoreKeys& keys() const { return keys_; }
  // The connection (for its client id, and for tests).
  RedisClient& redis() { return *redis_; }

 private:
  RedisInstructionStore(std::unique_ptr<RedisClient> redis, const StoreOptions& options);

  std::unique_ptr<RedisClient> redis_;
  const StoreOptions options_;
  const StoreKeys keys_;
  JobRegistry job_;
  PlanQueue plans_;
  ProgressLedger progress_;
  CalibrationStore calibration_;
};

}  // namespace varipipe::service

#endif  // VARIPIPE_PLANNER_SERVICE_REDIS_INSTRUCTION_STORE_H_
