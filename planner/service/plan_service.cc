#include "planner/service/plan_service.h"

#include <chrono>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config/job_config.h"
#include "common/config/rank_layout.h"
#include "common/logging.h"
#include "google/protobuf/util/json_util.h"
#include "planner/service/planner_daemon.h"
#include "planner/service/planner_metrics.h"
#include "spdlog/spdlog.h"

namespace varipipe::service {

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

grpc::Status PlanServiceImpl::TooManyWaiting() const {
  return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                      absl::StrCat("this planner already serves ", daemon_->max_calls(),
                                   " waiting GetPlan/WatchPlans calls (--max_calls); try "
                                   "another planner or later"));
}

grpc::Status PlanServiceImpl::CheckJob(const std::string& job_id) const {
  if (!job_id.empty() && job_id != daemon_->config().job_id()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("unknown job '", job_id, "' (this planner serves '",
                                     daemon_->config().job_id(), "')"));
  }
  return grpc::Status::OK;
}

grpc::Status PlanServiceImpl::GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                                     v1::GetJobResponse* response) {
  const PlannerDaemon::CallScope call(daemon_);
  if (grpc::Status s = daemon_->CheckServing(); !s.ok()) return s;
  if (grpc::Status s = daemon_->Authenticate(*context); !s.ok()) return s;
  if (grpc::Status s = CheckJob(request->job_id()); !s.ok()) return s;
  *response->mutable_config() = daemon_->config();
  response->set_config_hash(ConfigHash(daemon_->config()));
  response->set_store_address(daemon_->store_address());
  *response->mutable_stage_layout() = LayerLayoutToConfig(daemon_->stage_layout());
  absl::StatusOr<PlannerDaemon::StoreLease> store = daemon_->AcquireStore();
  if (store.ok()) {
    absl::StatusOr<StoreCounters> counters = (*store)->Counters();
    if (counters.ok()) response->set_published_iterations(counters->published);
  }
  return grpc::Status::OK;
}

grpc::Status PlanServiceImpl::FetchPlan(grpc::ServerContext* context, uint64_t iteration, int rank,
                                        v1::PlanEnvelope* out) {
  const GetPlanTimer timer(daemon_->config().job_id());
  const v1::JobConfig& c = daemon_->config();
  if (iteration >= c.training().iterations()) {
    return grpc::Status(grpc::StatusCode::OUT_OF_RANGE,
                        absl::StrCat("iteration ", iteration, " is past the job's last (",
                                     c.training().iterations() - 1, ")"));
  }
  const int world = WorldSize(c);
  if (rank < 0 || rank >= world) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("rank ", rank, " is outside the job's ", world, " ranks"));
  }
  // Plans are per pipeline rank; every tensor rank of one fetches its plan
  // (common/config/rank_layout.h), and fetches and reports stay per rank.
  const int plan_rank = RankLayout::Of(c.parallelism()).PipelineRankOf(rank);
  absl::StatusOr<PlannerDaemon::StoreLease> store = daemon_->AcquireStore();
  if (!store.ok()) return ToGrpc(store.status());
  const absl::Time deadline = context->deadline() == std::chrono::system_clock::time_point::max()
                                  ? absl::InfiniteFuture()
                                  : absl::FromChrono(context->deadline());
  bool asked_for_planning = false;
  while (!context->IsCancelled()) {
    // Wait in slices so cancellation, shutdown and on-demand planning are
    // noticed.
    if (grpc::Status s = daemon_->CheckServing(); !s.ok()) return s;
    const absl::Duration slice = std::min(absl::Seconds(2), deadline - absl::Now());
    if (slice <= absl::ZeroDuration()) break;
    absl::StatusOr<std::optional<std::string>> bytes =
        (*store)->plans().WaitPlan(iteration, plan_rank, slice);
    if (!bytes.ok()) return ToGrpc(bytes.status());
    if (bytes->has_value()) {
      if (!out->ParseFromString(**bytes)) {
        return grpc::Status(grpc::StatusCode::DATA_LOSS,
                            absl::StrCat("stored plan of iteration ", iteration, " is corrupt"));
      }
      // Only a rank that fetched a plan may report the iteration.
      return ToGrpc((*store)->progress().RecordFetch(iteration, rank));
    }
    if (!asked_for_planning) {
      // Nobody may be planning it (e.g. Redis restarted without data):
      // plan it here unless a lease says otherwise.
      asked_for_planning = true;
      if (absl::Status s = daemon_->PlanOnDemand(iteration); !s.ok()) {
        spdlog::warn("on-demand planning of iteration {} failed: {}", iteration, s.message());
      }
    }
  }
  if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
  return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                      absl::StrCat("iteration ", iteration, " is not published yet"));
}

grpc::Status PlanServiceImpl::WaitForReport(grpc::ServerContext* context, int rank,
                                            uint64_t iteration) {
  if (rank < 0 || rank >= WorldSize(daemon_->config())) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("rank ", rank, " is outside the job"));
  }
  absl::StatusOr<PlannerDaemon::StoreLease> store = daemon_->AcquireStore();
  if (!store.ok()) return ToGrpc(store.status());
  const absl::Time deadline = context->deadline() == std::chrono::system_clock::time_point::max()
                                  ? absl::InfiniteFuture()
                                  : absl::FromChrono(context->deadline());
  while (!context->IsCancelled()) {
    // In slices, so cancellation and shutdown are noticed.
    if (grpc::Status s = daemon_->CheckServing(); !s.ok()) return s;
    const absl::Duration slice = std::min(absl::Seconds(2), deadline - absl::Now());
    if (slice <= absl::ZeroDuration()) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          absl::StrCat("rank ", rank, " has not reported iteration ", iteration,
                                       " (WatchPlans max_ahead)"));
    }
    absl::StatusOr<bool> reported = (*store)->progress().WaitForReport(rank, iteration, slice);
    if (!reported.ok()) return ToGrpc(reported.status());
    if (*reported) return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
}

grpc::Status PlanServiceImpl::GetPlan(grpc::ServerContext* context,
                                      const v1::GetPlanRequest* request,
                                      v1::PlanEnvelope* response) {
  const PlannerDaemon::CallScope call(daemon_);
  if (grpc::Status s = daemon_->CheckServing(); !s.ok()) return s;
  if (grpc::Status s = daemon_->Authenticate(*context); !s.ok()) return s;
  if (grpc::Status s = CheckJob(request->job_id()); !s.ok()) return s;
  if (!daemon_->EnterWait()) return TooManyWaiting();
  const absl::Cleanup leave = [this] { daemon_->LeaveWait(); };
  return FetchPlan(context, request->iteration(), request->rank(), response);
}

grpc::Status PlanServiceImpl::WatchPlans(grpc::ServerContext* context,
                                         const v1::WatchPlansRequest* request,
                                         grpc::ServerWriter<v1::PlanEnvelope>* writer) {
  const PlannerDaemon::CallScope call(daemon_);
  if (grpc::Status s = daemon_->CheckServing(); !s.ok()) return s;
  if (grpc::Status s = daemon_->Authenticate(*context); !s.ok()) return s;
  if (grpc::Status s = CheckJob(request->job_id()); !s.ok()) return s;
  if (!daemon_->EnterWait()) return TooManyWaiting();
  const absl::Cleanup leave = [this] { daemon_->LeaveWait(); };
  const uint64_t first = request->first_iteration();
  const uint64_t ahead = request->max_ahead() > 0
                             ? request->max_ahead()
                             : std::max<uint64_t>(1, daemon_->config().planner().plan_ahead());
  for (uint64_t i = first; i < daemon_->config().training().iterations() && !context->IsCancelled();
       ++i) {
    // At most `ahead` streamed plans the rank has not acknowledged: plan i
    // goes out once the rank reported iteration i - ahead (the first `ahead`
    // from first_iteration go out at once).
    if (i >= first + ahead) {
      if (grpc::Status s = WaitForReport(context, request->rank(), i - ahead); !s.ok()) return s;
    }
    v1::PlanEnvelope envelope;
    grpc::Status s = FetchPlan(context, i, request->rank(), &envelope);
    if (!s.ok()) return s;
    if (!writer->Write(envelope)) break;
  }
  return grpc::Status::OK;
}

grpc::Status PlanServiceImpl::ReportProgress(grpc::ServerContext* context,
                                             const v1::ReportProgressRequest* request,
                                             v1::ReportProgressResponse* response) {
  const PlannerDaemon::CallScope call(daemon_);
  if (grpc::Status s = daemon_->CheckServing(); !s.ok()) return s;
  if (grpc::Status s = daemon_->Authenticate(*context); !s.ok()) return s;
  if (grpc::Status s = CheckJob(request->job_id()); !s.ok()) return s;
  const int world = WorldSize(daemon_->config());
  if (request->rank() < 0 || request->rank() >= world) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("rank ", request->rank(), " is outside the job"));
  }
  const uint64_t total = daemon_->config().training().iterations();
  if (request->iteration() >= total) {
    return grpc::Status(grpc::StatusCode::OUT_OF_RANGE,
                        absl::StrCat("iteration ", request->iteration(),
                                     " is past the job's last (", total - 1, ")"));
  }
  absl::StatusOr<PlannerDaemon::StoreLease> store = daemon_->AcquireStore();
  if (!store.ok()) return ToGrpc(store.status());
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(*request, &json);
  // Checked and applied atomically: a report for an iteration the rank never
  // fetched, or beyond the one it is due to run, changes nothing.
  if (absl::Status s =
          (*store)->progress().CheckedReport(request->iteration(), request->rank(), json);
      !s.ok()) {
    spdlog::warn("{}", s.message());
    return ToGrpc(s);
  }
  // What the run teaches the cost model; a failure here loses one sample,
  // never the report.
  if (absl::Status s = daemon_->LearnFromReport(**store, *request); !s.ok()) {
    spdlog::warn("rank {} iteration {}: calibration not updated: {}", request->rank(),
                 request->iteration(), s.message());
  }
  response->set_continue_training(request->iteration() + 1 <
                                  daemon_->config().training().iterations());
  return grpc::Status::OK;
}

}  // namespace varipipe::service
