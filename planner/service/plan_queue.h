#ifndef VARIPIPE_PLANNER_SERVICE_PLAN_QUEUE_H_
#define VARIPIPE_PLANNER_SERVICE_PLAN_QUEUE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/redis/redis_client.h"
#include "planner/service/store_keys.h"
#include "planner/service/store_options.h"

namespace varipipe::service {

// The iterations' plans from claim to publication: daemons claim an
// iteration under a lease and publish every rank's plan at once; executors
// (through the daemons) read and wait for them. Claims and publication are
// Lua scripts, so each iteration is published exactly once: publication
// succeeds only while the publisher holds the lease and no plan exists.
class PlanQueue {
 public:
  PlanQueue(RedisClient& redis, const StoreKeys& keys, const StoreOptions& options)
      : redis_(redis), keys_(keys), options_(options) {}

  // Claims an iteration below `limit` for `planner_id`: first one whose
  // planner died (unpublished, lease expired), else the next new one.
  // nullopt when nothing may be claimed now (limit reached or job done).
  absl::StatusOr<std::optional<uint64_t>> Claim(const std::string& planner_id, uint64_t limit);
  // Claims a specific iteration when it is neither published nor leased
  // (on-demand planning for a waiting executor). True when claimed.
  absl::StatusOr<bool> ClaimIteration(uint64_t iteration, const std::string& planner_id);
  // Publishes every rank's serialized PlanEnvelope if `planner_id` still
  // holds the lease and the iteration is unpublished. True on success.
  absl::StatusOr<bool> Publish(uint64_t iteration, const std::vector<std::string>& envelopes,
                               const std::string& summary_json, const std::string& planner_id);

  // A rank's serialized PlanEnvelope, nullopt when not published (or gone).
  absl::StatusOr<std::optional<std::string>> GetPlan(uint64_t iteration, int rank);
  // The same, waiting up to `timeout` for publication (blocking stream
  // reads, no polling).
  absl::StatusOr<std::optional<std::string>> WaitPlan(uint64_t iteration, int rank,
                                                      absl::Duration timeout);
  // True when the iteration's plan exists.
  absl::StatusOr<bool> IsPublished(uint64_t iteration);

 private:
  RedisClient& redis_;
  const StoreKeys& keys_;
  const StoreOptions& options_;
};

}  // namespace varipipe::service

#endif  // VARIPIPE_PLANNER_SERVICE_PLAN_QUEUE_H_
