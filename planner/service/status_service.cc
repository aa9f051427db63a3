#include "planner/service/status_service.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "planner/service/plan_service.h"
#include "planner/service/planner_daemon.h"

namespace varipipe::service {

grpc::Status StatusServiceImpl::GetPlannerStatus(grpc::ServerContext* context,
                                                 const v1::GetPlannerStatusRequest*,
                                                 v1::PlannerStatus* response) {
  const PlannerDaemon::CallScope call(daemon_);
  if (grpc::Status s = daemon_->CheckServing(); !s.ok()) return s;
  if (grpc::Status s = daemon_->Authenticate(*context); !s.ok()) return s;
  *response = daemon_->Status();
  return grpc::Status::OK;
}

grpc::Status StatusServiceImpl::GetJobStatus(grpc::ServerContext* context,
                                             const v1::GetJobStatusRequest* request,
                                             v1::JobStatus* response) {
  const PlannerDaemon::CallScope call(daemon_);
  if (grpc::Status s = daemon_->CheckServing(); !s.ok()) return s;
  if (grpc::Status s = daemon_->Authenticate(*context); !s.ok()) return s;
  const v1::JobConfig& c = daemon_->config();
  if (!request->job_id().empty() && request->job_id() != c.job_id()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("unknown job '", request->job_id(), "'"));
  }
  absl::StatusOr<PlannerDaemon::StoreLease> store = daemon_->AcquireStore();
  if (!store.ok()) return ToGrpc(store.status());
  absl::StatusOr<StoreCounters> counters = (*store)->Counters();
  if (!counters.ok()) return ToGrpc(counters.status());
  response->set_job_id(c.job_id());
  response->set_total_iterations(c.training().iterations());
  response->set_published_iterations(counters->published);
  absl::StatusOr<std::vector<std::pair<int, std::string>>> reports = (*store)->progress().Reports();
  if (!reports.ok()) return ToGrpc(reports.status());
  double tokens = 0;
  for (const auto& [reporting_rank, json] : *reports) {
    v1::ReportProgressRequest report;
    if (!google::protobuf::util::JsonStringToMessage(json, &report).ok()) continue;
    v1::RankProgress* rank = response->add_ranks();
    rank->set_rank(report.rank());
    rank->set_last_iteration(report.iteration());
    rank->set_tokens_per_second(report.tokens_per_second());
    rank->set_last_loss(report.loss());
    if (report.rank() % static_cast<int>(c.parallelism().pipeline()) == 0) {
      tokens += report.tokens_per_second();  // one rank per replica
    }
  }
  response->set_tokens_per_second(tokens);
  return grpc::Status::OK;
}

grpc::Status StatusServiceImpl::GetTrace(grpc::ServerContext* context,
                                         const v1::GetTraceRequest* request,
                                         v1::TraceResponse* response) {
  const PlannerDaemon::CallScope call(daemon_);
  if (grpc::Status s = daemon_->CheckServing(); !s.ok()) return s;
  if (grpc::Status s = daemon_->Authenticate(*context); !s.ok()) return s;
  const v1::JobConfig& c = daemon_->config();
  if (!request->job_id().empty() && request->job_id() != c.job_id()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("unknown job '", request->job_id(), "'"));
  }
  if (request->iteration() >= c.training().iterations()) {
    return grpc::Status(grpc::StatusCode::OUT_OF_RANGE, "iteration past the end of the job");
  }
  // Planning is the expensive part: only iterations the job has planned (or
  // is planning) are traced, never one beyond the planning window.
  absl::StatusOr<PlannerDaemon::StoreLease> store = daemon_->AcquireStore();
  if (!store.ok()) return ToGrpc(store.status());
  absl::StatusOr<StoreCounters> counters = (*store)->Counters();
  if (!counters.ok()) return ToGrpc(counters.status());
  if (request->iteration() >= counters->claimed) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("iteration ", request->iteration(),
                     " is not planned yet (planned so far: below ", counters->claimed, ")"));
  }
  std::string summary;
  double ms = 0;
  std::string trace;
  absl::StatusOr<std::vector<std::string>> plans =
      daemon_->PlanIteration(request->iteration(), &summary, &ms, true, &trace);
  if (!plans.ok()) return ToGrpc(plans.status());
  response->set_chrome_trace_json(trace);
  return grpc::Status::OK;
}

}  // namespace varipipe::service
