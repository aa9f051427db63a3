#ifndef VARIPIPE_PLANNER_SERVICE_STORE_OPTIONS_H_
#define VARIPIPE_PLANNER_SERVICE_STORE_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace varipipe::service {

// One job in the instruction store (RedisInstructionStore).
struct StoreOptions {
  std::string key_prefix = "varipipe";
  std::string job_id;
  int world_size = 1;
  uint64_t total_iterations = 0;
  // How long a claim holds before another daemon may take the iteration
  // over.
  absl::Duration lease = absl::Seconds(30);
  // Safety expiry of a published plan no rank acknowledged.
  absl::Duration plan_ttl = absl::Hours(24);
  int64_t events_max_length = 10000;
};

}  // namespace varipipe::service

#endif  // VARIPIPE_PLANNER_SERVICE_STORE_OPTIONS_H_
