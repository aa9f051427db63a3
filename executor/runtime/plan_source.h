// Where an executor's plans come from, one per iteration:
// - PlanFiles: the layout varipipe-plan --emit-plans writes (plan_files.h);
// - PlannerService: the planner daemons' PlanService over gRPC, trying each
//   address in turn when one is unavailable; an iteration's plan is
//   acknowledged with ReportProgress once the iteration ran, which lets the
//   store delete it and the planners plan further ahead.
#ifndef VARIPIPE_EXECUTOR_RUNTIME_PLAN_SOURCE_H_
#define VARIPIPE_EXECUTOR_RUNTIME_PLAN_SOURCE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "varipipe/v1/plan.pb.h"
#include "varipipe/v1/service.grpc.pb.h"

namespace varipipe::executor {

class PlanSource {
 public:
  virtual ~PlanSource() = default;
  virtual absl::StatusOr<v1::ExecutionPlan> Get(uint64_t iteration) = 0;
  // After the plan's iteration ran: `progress` carries the measurements.
  virtual absl::Status Done(const v1::ReportProgressRequest& progress) = 0;
  virtual std::string Describe() const = 0;
};

std::unique_ptr<PlanSource> PlanFileSource(std::string dir, int rank);

class PlannerServiceSource final : public PlanSource {
 public:
  // `addresses`: planner daemons ("host:port"), all serving the same job.
  // `wait` bounds how long Get waits for a plan that is not published yet.
  PlannerServiceSource(std::vector<std::string> addresses, int rank, absl::Duration wait);

  // The job the planners serve (config with defaults applied, store address).
  absl::StatusOr<v1::GetJobResponse> GetJob();
  void set_job_id(std::string job_id) { job_id_ = std::move(job_id); }

  absl::StatusOr<v1::ExecutionPlan> Get(uint64_t iteration) override;
  absl::Status Done(const v1::ReportProgressRequest& progress) override;
  std::string Describe() const override;

 private:
  // Runs `call` against the current planner, moving to the next address
  // while planners are unavailable (one round over all of them).
  template <typename Call>
  absl::Status WithFailover(const char* what, Call call);

  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<v1::PlanService::Stub>> stubs_;
  size_t current_ = 0;
  int rank_;
  absl::Duration wait_;
  std::string job_id_;
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_PLAN_SOURCE_H_
