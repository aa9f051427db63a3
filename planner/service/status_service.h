// StatusService served by a planner daemon: its own status, the job's
// (per-rank progress from the instruction store) and predicted-timeline
// traces. GetExecutorStatus is UNIMPLEMENTED here (executors serve it).
// Every call is UNAVAILABLE while the daemon starts ("starting: ...") or
// shuts down (PlannerDaemon::CheckServing).
#ifndef VARIPIPE_PLANNER_SERVICE_STATUS_SERVICE_H_
#define VARIPIPE_PLANNER_SERVICE_STATUS_SERVICE_H_

#include "grpcpp/grpcpp.h"
#include "varipipe/v1/service.grpc.pb.h"

namespace varipipe::service {

class PlannerDaemon;

class StatusServiceImpl final : public v1::StatusService::Service {
 public:
  explicit StatusServiceImpl(PlannerDaemon* daemon) : daemon_(daemon) {}

  grpc::Status GetPlannerStatus(grpc::ServerContext*, const v1::GetPlannerStatusRequest*,
                                v1::PlannerStatus* response) override;
  grpc::Status GetJobStatus(grpc::ServerContext*, const v1::GetJobStatusRequest* request,
                            v1::JobStatus* response) override;
  grpc::Status GetTrace(grpc::ServerContext*, const v1::GetTraceRequest* request,
                        v1::TraceResponse* response) override;

 private:
  PlannerDaemon* daemon_;
};

}  // namespace varipipe::service

#endif  // VARIPIPE_PLANNER_SERVICE_STATUS_SERVICE_H_
