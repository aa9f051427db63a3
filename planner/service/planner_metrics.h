// The planner daemon's Prometheus metrics (docs/operations.md, "Metrics"):
// hooks the daemon and PlanService call, and the --metrics_listen endpoint,
// which refreshes the store-wide numbers from the daemon on every scrape.
// Every metric is labelled by job.
#ifndef VARIPIPE_PLANNER_SERVICE_PLANNER_METRICS_H_
#define VARIPIPE_PLANNER_SERVICE_PLANNER_METRICS_H_

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics/metrics_http_server.h"

namespace varipipe::service {

class PlannerDaemon;

// This daemon planned and published an iteration in `planning_seconds`.
void RecordPlanned(const std::string& job, double planning_seconds);
// This daemon claimed an iteration to plan.
void RecordClaimed(const std::string& job);
// A call to the instruction store failed (connect, claim, publish).
void RecordRedisError(const std::string& job);

// Times serving one plan (a GetPlan call, or one plan of WatchPlans), from
// asking to answer, waiting for it to be published included.
class GetPlanTimer {
 public:
  explicit GetPlanTimer(std::string job) : job_(std::move(job)) {}
  ~GetPlanTimer();

 private:
  std::string job_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// The endpoint; stops serving (and reading `daemon`) when destroyed.
class PlannerMetricsEndpoint {
 public:
  // Empty `listen`: nullptr (no endpoint).
  static absl::StatusOr<std::unique_ptr<PlannerMetricsEndpoint>> Start(const std::string& listen,
                                                                       PlannerDaemon* daemon);
  ~PlannerMetricsEndpoint();
  int port() const { return server_->port(); }

 private:
  PlannerMetricsEndpoint() = default;
  int collector_ = -1;
  std::unique_ptr<metrics::MetricsHttpServer> server_;
};

}  // namespace varipipe::service

#endif  // VARIPIPE_PLANNER_SERVICE_PLANNER_METRICS_H_
