#include "executor/runtime/plan_source.h"

#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "executor/runtime/plan_files.h"
#include "grpcpp/grpcpp.h"
#include "spdlog/spdlog.h"

namespace varipipe::executor {
namespace {

class FileSource final : public PlanSource {
 public:
  FileSource(std::string dir, int rank) : dir_(std::move(dir)), rank_(rank) {}
  absl::StatusOr<v1::ExecutionPlan> Get(uint64_t iteration) override {
    return ReadPlanFile(dir_, iteration, rank_);
  }
  absl::Status Done(const v1::ReportProgressRequest&) override { return absl::OkStatus(); }
  std::string Describe() const override { return absl::StrCat("plan files in ", dir_); }

 private:
  std::string dir_;
  int rank_;
};

absl::Status FromGrpc(const grpc::Status& s, absl::string_view what, absl::string_view address) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, " at planner ", address, ": ", s.error_message()));
}

}  // namespace

std::unique_ptr<PlanSource> PlanFileSource(std::string dir, int rank) {
  return std::make_unique<FileSource>(std::move(dir), rank);
}

PlannerServiceSource::PlannerServiceSource(std::vector<std::string> addresses, int rank,
                                           absl::Duration wait)
    : addresses_(std::move(addresses)), rank_(rank), wait_(wait) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  for (const std::string& address : addresses_) {
    stubs_.push_back(v1::PlanService::NewStub(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args)));
  }
}

template <typename Call>
absl::Status PlannerServiceSource::WithFailover(const char* what, Call call) {
  absl::Status last = absl::UnavailableError("no planner address");
  for (size_t attempt = 0; attempt < stubs_.size(); ++attempt) {
    const size_t index = (current_ + attempt) % stubs_.size();
    last = FromGrpc(call(*stubs_[index]), what, addresses_[index]);
    if (last.code() != absl::StatusCode::kUnavailable) {
      if (index != current_) {
        spdlog::warn("planner {} unavailable; now using {}", addresses_[current_],
                     addresses_[index]);
        current_ = index;
      }
      return last;
    }
  }
  return last;
}

absl::StatusOr<v1::GetJobResponse> PlannerServiceSource::GetJob() {
  v1::GetJobResponse response;
  v1::GetJobRequest request;
  request.set_job_id(job_id_);
  const absl::Status status = WithFailover("GetJob", [&](v1::PlanService::Stub& stub) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    context.set_wait_for_ready(false);
    return stub.GetJob(&context, request, &response);
  });
  if (!status.ok()) return status;
  job_id_ = response.config().job_id();
  return response;
}

absl::StatusOr<v1::ExecutionPlan> PlannerServiceSource::Get(uint64_t iteration) {
  v1::GetPlanRequest request;
  request.set_job_id(job_id_);
  request.set_iteration(iteration);
  request.set_rank(rank_);
  v1::PlanEnvelope envelope;
  const absl::Time deadline = absl::Now() + wait_;
  absl::Status status;
  // A planner answers DEADLINE_EXCEEDED while the plan is not published;
  // keep asking (any planner) until our own deadline.
  do {
    status = WithFailover("GetPlan", [&](v1::PlanService::Stub& stub) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Seconds(30))));
      return stub.GetPlan(&context, request, &envelope);
    });
  } while (status.code() == absl::StatusCode::kDeadlineExceeded && absl::Now() < deadline);
  if (status.code() == absl::StatusCode::kDeadlineExceeded) {
    return absl::DeadlineExceededError(absl::StrCat(
        "no plan for iteration ", iteration, " rank ", rank_, " within ",
        absl::FormatDuration(wait_), " (are the planner daemons planning this job? see "
        "varipipe-ctl status): ", status.message()));
  }
  if (!status.ok()) return status;
  return std::move(*envelope.mutable_plan());
}

absl::Status PlannerServiceSource::Done(const v1::ReportProgressRequest& progress) {
  v1::ReportProgressRequest request = progress;
  request.set_job_id(job_id_);
  request.set_rank(rank_);
  v1::ReportProgressResponse response;
  return WithFailover("ReportProgress", [&](v1::PlanService::Stub& stub) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return stub.ReportProgress(&context, request, &response);
  });
}

std::string PlannerServiceSource::Describe() const {
  return absl::StrCat("planner service at ", absl::StrJoin(addresses_, ","));
}

}  // namespace varipipe::executor
