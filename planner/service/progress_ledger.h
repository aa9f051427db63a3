#ifndef VARIPIPE_PLANNER_SERVICE_PROGRESS_LEDGER_H_
#define VARIPIPE_PLANNER_SERVICE_PROGRESS_LEDGER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/redis/redis_client.h"
#include "planner/service/store_keys.h"
#include "planner/service/store_options.h"

namespace varipipe::service {

// What the ranks did with their plans: fetches, acknowledgements and
// progress reports. Once every rank acknowledged an iteration, its plan is
// retired (deleted), and so is every stored plan of an earlier iteration.
class ProgressLedger {
 public:
  ProgressLedger(RedisClient& redis, const StoreKeys& keys, const StoreOptions& options)
      : redis_(redis), keys_(keys), options_(options) {}

  // Records that `rank` fetched the plan of `iteration`: it may report it.
  absl::Status RecordFetch(uint64_t iteration, int rank);
  // Records that `rank` has its plan; once every rank did, retires the plan
  // and those of earlier iterations still stored (see CheckedReport).
  absl::Status Acknowledge(uint64_t iteration, int rank);
  // A rank's report that it completed `iteration`, checked and applied
  // atomically: acknowledges the plan and records the progress and the JSON
  // report. Once every rank acknowledged an iteration, its plan is deleted,
  // and so is every stored plan of an earlier iteration (no rank needs it:
  // ranks run iterations in order), e.g. plans made again after Redis lost
  // its data mid-run; each deleted plan counts as acknowledged.
  // PERMISSION_DENIED when the rank never fetched the iteration's plan;
  // FAILED_PRECONDITION when the iteration is beyond the one the rank is due
  // to run next (its last report + 1). A rejected report changes nothing.
  absl::Status CheckedReport(uint64_t iteration, int rank, const std::string& report_json);
  // Records that `rank` completed `iteration`, with a JSON report
  // (unchecked: for tools and tests).
  absl::Status ReportProgress(int rank, uint64_t iteration, const std::string& report_json);
  // Waits up to `timeout` (blocking stream reads, no polling) until `rank`
  // has reported `iteration` or a later one; true once it has.
  absl::StatusOr<bool> WaitForReport(int rank, uint64_t iteration, absl::Duration timeout);
  // Per-rank last completed iteration (ranks that never reported absent),
  // by rank.
  absl::StatusOr<std::vector<std::pair<int, uint64_t>>> Progress();
  // Per-rank JSON of the last report, by rank.
  absl::StatusOr<std::vector<std::pair<int, std::string>>> Reports();

 private:
  RedisClient& redis_;
  const StoreKeys& keys_;
  const StoreOptions& options_;
};

}  // namespace varipipe::service

#endif  // VARIPIPE_PLANNER_SERVICE_PROGRESS_LEDGER_H_
