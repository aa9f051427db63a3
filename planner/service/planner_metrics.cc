#include "planner/service/planner_metrics.h"

#include <algorithm>

#include "common/metrics/metric_registry.h"
#include "planner/service/planner_daemon.h"
#include "spdlog/spdlog.h"

namespace varipipe::service {
namespace {

metrics::Registry& R() { return metrics::Registry::Default(); }
metrics::Labels Job(const std::string& job) { return {{"job", job}}; }

// Planning takes milliseconds to seconds; GetPlan waits up to minutes.
const std::vector<double>& PlanBuckets() {
  static const auto* b = new std::vector<double>(metrics::ExponentialBuckets(0.0005, 2, 16));
  return *b;
}
const std::vector<double>& GetPlanBuckets() {
  static const auto* b = new std::vector<double>(metrics::ExponentialBuckets(0.0001, 4, 12));
  return *b;
}

metrics::Counter& Planned(const std::string& job) {
  return R().GetCounter("varipipe_planner_planned_iterations_total",
                        "Iterations this daemon planned and published.", Job(job));
}
metrics::Counter& Claimed(const std::string& job) {
  return R().GetCounter("varipipe_planner_claimed_iterations_total",
                        "Iterations this daemon claimed in the instruction store.", Job(job));
}
metrics::Counter& RedisErrors(const std::string& job) {
  return R().GetCounter("varipipe_planner_redis_errors_total",
                        "Failed calls of this daemon to the instruction store (Redis).", Job(job));
}

}  // namespace

void RecordPlanned(const std::string& job, double planning_seconds) {
  R().GetHistogram("varipipe_planner_plan_duration_seconds",
                   "Time to plan one iteration (micro-batching to validated plans), this daemon.",
                   PlanBuckets(), Job(job))
      .Observe(planning_seconds);
  Planned(job).Increment();
}

void RecordClaimed(const std::string& job) { Claimed(job).Increment(); }

void RecordRedisError(const std::string& job) { RedisErrors(job).Increment(); }

GetPlanTimer::~GetPlanTimer() {
  R().GetHistogram(
         "varipipe_planner_get_plan_duration_seconds",
         "Time to serve one plan (a GetPlan call, or one plan of WatchPlans), waiting for it "
         "to be published included.",
         GetPlanBuckets(), Job(job_))
      .Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
}

absl::StatusOr<std::unique_ptr<PlannerMetricsEndpoint>> PlannerMetricsEndpoint::Start(
    const std::string& listen, PlannerDaemon* daemon) {
  if (listen.empty()) return nullptr;
  std::unique_ptr<PlannerMetricsEndpoint> e(new PlannerMetricsEndpoint());
  const std::string job = daemon->config().job_id();
  // Every series exists from the first scrape on (zero until it moves).
  Planned(job);
  Claimed(job);
  RedisErrors(job);
  e->collector_ = R().AddCollector([daemon, job] {
    const v1::PlannerStatus s = daemon->Status();
    R().GetCounter("varipipe_planner_published_iterations_total",
                   "Iterations of the job published in the instruction store (by any daemon).",
                   Job(job))
        .RaiseTo(static_cast<double>(s.iterations_published()));
    R().GetCounter("varipipe_planner_acknowledged_iterations_total",
                   "Iterations of the job every executor rank acknowledged.", Job(job))
        .RaiseTo(static_cast<double>(s.iterations_acknowledged()));
    R().GetCounter("varipipe_planner_errors_total",
                   "Planning and instruction-store errors of this daemon.", Job(job))
        .RaiseTo(static_cast<double>(s.errors()));
    R().GetGauge("varipipe_planner_queue_depth_iterations",
                 "Iterations claimed but not yet published.", Job(job))
        .Set(s.queue_depth());
    R().GetGauge("varipipe_planner_worker_utilization_ratio",
                 "Share of the planning workers' time spent planning since start.", Job(job))
        .Set(s.worker_utilization());
    R().GetGauge("varipipe_planner_store_up",
                 "1 when the instruction store answered the last call, else 0.", Job(job))
        .Set(s.store_healthy() ? 1 : 0);
    // How far planning is ahead of the slowest executor rank.
    uint64_t ahead = 0;
    if (absl::StatusOr<PlannerDaemon::StoreLease> store = daemon->AcquireStore(); store.ok()) {
      if (absl::StatusOr<StoreCounters> c = (*store)->Counters(); c.ok()) {
        ahead = c->published - std::min(c->min_progress, c->published);
      }
    }
    R().GetGauge("varipipe_planner_plan_ahead_iterations",
                 "Published iterations the slowest executor rank has not completed yet.", Job(job))
        .Set(static_cast<double>(ahead));
  });
  absl::StatusOr<std::unique_ptr<metrics::MetricsHttpServer>> server =
      metrics::MetricsHttpServer::Start(listen, &R());
  if (!server.ok()) {
    R().RemoveCollector(e->collector_);
    return server.status();
  }
  e->server_ = *std::move(server);
  spdlog::info("Prometheus metrics on http://{}:{}/metrics", e->server_->host(),
               e->server_->port());
  return e;
}

PlannerMetricsEndpoint::~PlannerMetricsEndpoint() {
  server_.reset();  // no scrape runs the collector after this
  if (collector_ >= 0) R().RemoveCollector(collector_);
}

}  // namespace varipipe::service
