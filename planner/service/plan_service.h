// PlanService (proto/varipipe/v1/service.proto) served by a planner daemon:
// plans from the instruction store, waiting (without polling) until they are
// published; progress reports that acknowledge plans; the job description.
//
// Status codes: UNAUTHENTICATED without the job token, NOT_FOUND for another
// job, OUT_OF_RANGE past the last iteration, INVALID_ARGUMENT for a rank
// outside the job, DEADLINE_EXCEEDED while waiting, UNAVAILABLE when Redis is
// unreachable, while the daemon starts ("starting: ...", before the token is
// checked) and once it shuts down (waiting calls end with it too),
// RESOURCE_EXHAUSTED beyond --max_calls waiting calls; for
// ReportProgress PERMISSION_DENIED when the rank never
// fetched the iteration's plan and FAILED_PRECONDITION for an iteration
// beyond the rank's next (rejected reports change nothing).
#ifndef VARIPIPE_PLANNER_SERVICE_PLAN_SERVICE_H_
#define VARIPIPE_PLANNER_SERVICE_PLAN_SERVICE_H_

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "varipipe/v1/service.grpc.pb.h"

namespace varipipe::service {

class PlannerDaemon;

class PlanServiceImpl final : public v1::PlanService::Service {
 public:
  explicit PlanServiceImpl(PlannerDaemon* daemon) : daemon_(daemon) {}

  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::GetJobResponse* response) override;
  grpc::Status GetPlan(grpc::ServerContext* context, const v1::GetPlanRequest* request,
                       v1::PlanEnvelope* response) override;
  grpc::Status WatchPlans(grpc::ServerContext* context, const v1::WatchPlansRequest* request,
                          grpc::ServerWriter<v1::PlanEnvelope>* writer) override;
  grpc::Status ReportProgress(grpc::ServerContext* context,
                              const v1::ReportProgressRequest* request,
                              v1::ReportProgressResponse* response) override;

 private:
  // Waits for (or plans) one rank's plan; deadline from the context.
  grpc::Status FetchPlan(grpc::ServerContext* context, uint64_t iteration, int rank,
                         v1::PlanEnvelope* out);
  // Waits until `rank` reported `iteration` or a later one (WatchPlans'
  // max_ahead); deadline from the context.
  grpc::Status WaitForReport(grpc::ServerContext* context, int rank, uint64_t iteration);
  grpc::Status CheckJob(const std::string& job_id) const;
  grpc::Status TooManyWaiting() const;

  PlannerDaemon* daemon_;
};

// absl::Status -> grpc::Status with the same code and message.
grpc::Status ToGrpc(const absl::Status& status);

}  // namespace varipipe::service

#endif  // VARIPIPE_PLANNER_SERVICE_PLAN_SERVICE_H_
