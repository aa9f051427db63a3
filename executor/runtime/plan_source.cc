#include "executor/runtime/plan_source.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
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

// How long Get waits for the stream before asking with GetPlan.
constexpr absl::Duration kPrefetchGrace = absl::Milliseconds(250);
// Pauses between failed stream attempts, doubling up to the maximum.
constexpr absl::Duration kMinBackoff = absl::Milliseconds(100);
constexpr absl::Duration kMaxBackoff = absl::Milliseconds(500);

absl::Status CheckPlan(const v1::ExecutionPlan& plan, uint64_t iteration, int rank,
                       absl::string_view what, absl::string_view address) {
  if (plan.iteration() == iteration && plan.rank() == rank) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, " at planner ", address, " returned the plan of ",
                                          "iteration ", plan.iteration(), " rank ", plan.rank(),
                                          " for iteration ", iteration, " rank ", rank));
}

// Codes after which another planner or another attempt cannot do better.
bool IsPermanent(grpc::StatusCode code) {
  return code == grpc::StatusCode::INVALID_ARGUMENT || code == grpc::StatusCode::NOT_FOUND ||
         code == grpc::StatusCode::PERMISSION_DENIED || code == grpc::StatusCode::UNAUTHENTICATED ||
         code == grpc::StatusCode::UNIMPLEMENTED || code == grpc::StatusCode::FAILED_PRECONDITION;
}

}  // namespace

std::unique_ptr<PlanSource> PlanFileSource(std::string dir, int rank) {
  return std::make_unique<FileSource>(std::move(dir), rank);
}

PlannerServiceSource::PlannerServiceSource(std::vector<std::string> addresses, int rank,
                                           absl::Duration wait, int prefetch,
                                           const ClientSecurity& security)
    : addresses_(std::move(addresses)),
      rank_(rank),
      plan_rank_(rank),
      wait_(wait),
      prefetch_(std::max(prefetch, 0)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  for (const std::string& address : addresses_) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        CreateClientChannel(address, security, args);
    if (!channel.ok()) {
      channel_error_ = Annotate(channel.status(), absl::StrCat("planner ", address));
      stubs_.clear();
      return;
    }
    stubs_.push_back(v1::PlanService::NewStub(*channel));
  }
}

PlannerServiceSource::~PlannerServiceSource() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    if (stream_context_ != nullptr) stream_context_->TryCancel();
    changed_.SignalAll();
  }
  if (prefetcher_.joinable()) prefetcher_.join();
}

template <typename Call>
absl::Status PlannerServiceSource::WithFailover(const char* what, Call call) {
  if (!channel_error_.ok()) return channel_error_;
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

void PlannerServiceSource::StartPrefetch(uint64_t first_iteration) {
  if (prefetch_ == 0 || stubs_.empty()) return;
  absl::MutexLock lock(&mu_);
  if (prefetcher_.joinable()) return;
  wanted_ = first_iteration;
  RestartPrefetchLocked(first_iteration);
  prefetcher_ = std::thread([this, index = current_] { PrefetchLoop(index); });
}

void PlannerServiceSource::RestartPrefetchLocked(uint64_t first) {
  ++generation_;
  stream_job_id_ = job_id_;
  next_ = first;
  idle_ = false;
  ahead_.clear();
  if (stream_context_ != nullptr) stream_context_->TryCancel();
  changed_.SignalAll();
}

PlannerServiceSource::StreamEnd PlannerServiceSource::StreamPlans(size_t index,
                                                                  uint64_t generation) {
  StreamEnd end;
  v1::WatchPlansRequest request;
  request.set_job_id(stream_job_id_);
  request.set_rank(rank_);
  request.set_first_iteration(next_);
  // The iteration running (not yet reported) plus prefetch_ held ones.
  request.set_max_ahead(prefetch_ + 1);
  grpc::ClientContext context;
  stream_context_ = &context;
  bool cancelled = false;  // by us: restarted, stopped, or a bad plan
  mu_.Unlock();
  std::unique_ptr<grpc::ClientReader<v1::PlanEnvelope>> reader =
      stubs_[index]->WatchPlans(&context, request);
  v1::PlanEnvelope envelope;
  while (reader->Read(&envelope)) {
    absl::MutexLock read_lock(&mu_);
    if (stop_ || generation_ != generation) {
      cancelled = true;
      break;
    }
    end.bad = CheckPlan(envelope.plan(), next_, plan_rank_, "WatchPlans", addresses_[index]);
    if (!end.bad.ok()) {
      cancelled = true;
      break;
    }
    end.read_any = true;
    if (next_ >= wanted_) {
      ahead_[next_] = std::move(*envelope.mutable_plan());
      changed_.SignalAll();
    }
    ++next_;
    // Stop reading while full: flow control then holds the server.
    while (!stop_ && generation_ == generation && ahead_.size() >= static_cast<size_t>(prefetch_)) {
      changed_.Wait(&mu_);
    }
    if (stop_ || generation_ != generation) {
      cancelled = true;
      break;
    }
  }
  // Cancelling a stream that ended by itself could replace its status.
  if (cancelled) context.TryCancel();
  end.status = reader->Finish();
  mu_.Lock();
  stream_context_ = nullptr;
  return end;
}

void PlannerServiceSource::PrefetchLoop(size_t index) {
  absl::Duration backoff = kMinBackoff;
  size_t failures = 0;  // consecutive failed attempts
  // Holds mu_ except while a stream is open.
  mu_.Lock();
  while (!stop_) {
    while (!stop_ && (idle_ || ahead_.size() >= static_cast<size_t>(prefetch_))) {
      changed_.Wait(&mu_);
    }
    if (stop_) break;
    const uint64_t generation = generation_;
    next_ = std::max(next_, wanted_);  // nothing below wanted_ is needed
    const StreamEnd end = StreamPlans(index, generation);
    const absl::Status& bad = end.bad;
    const grpc::Status& status = end.status;
    if (stop_) break;
    if (generation_ != generation) continue;  // restarted: open the new one now
    if (end.read_any) {
      backoff = kMinBackoff;
      failures = 0;
    }
    if (bad.ok() && (status.ok() || status.error_code() == grpc::StatusCode::OUT_OF_RANGE)) {
      idle_ = true;  // the job's last iteration was streamed
      changed_.SignalAll();
      continue;
    }
    if (bad.ok() && IsPermanent(status.error_code())) {
      // GetPlan reports the same error to the caller.
      spdlog::warn("plan stream from planner {} refused: {}; not prefetching", addresses_[index],
                   status.error_message());
      idle_ = true;
      changed_.SignalAll();
      continue;
    }
    const size_t from = index;
    index = (index + 1) % stubs_.size();
    const std::string why = bad.ok() ? status.error_message() : std::string(bad.message());
    // One warning per planner while all are failing, then quieter.
    if (++failures <= stubs_.size()) {
      spdlog::warn("plan stream from planner {} failed at iteration {} ({}); streaming from {}",
                   addresses_[from], next_, why, addresses_[index]);
    } else {
      spdlog::debug("plan stream from planner {} failed at iteration {} ({}); streaming from {}",
                    addresses_[from], next_, why, addresses_[index]);
    }
    const absl::Time until = absl::Now() + backoff;
    while (!stop_ && generation_ == generation && absl::Now() < until) {
      changed_.WaitWithDeadline(&mu_, until);
    }
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
  mu_.Unlock();
}

absl::StatusOr<v1::ExecutionPlan> PlannerServiceSource::Get(uint64_t iteration) {
  if (prefetch_ > 0 && !stubs_.empty()) {
    StartPrefetch(iteration);
    absl::MutexLock lock(&mu_);
    wanted_ = iteration;
    ahead_.erase(ahead_.begin(), ahead_.lower_bound(iteration));
    changed_.SignalAll();
    // Neither held nor about to come (a jump, e.g. resuming from a
    // checkpoint, or a stream that ended): stream from here instead.
    const bool coming =
        !idle_ && iteration >= next_ && iteration - next_ < static_cast<uint64_t>(prefetch_);
    if (!ahead_.contains(iteration) && !coming) RestartPrefetchLocked(iteration);
    const absl::Time deadline = absl::Now() + kPrefetchGrace;
    while (!ahead_.contains(iteration) && !idle_ && !stop_ && absl::Now() < deadline) {
      changed_.WaitWithDeadline(&mu_, deadline);
    }
    if (auto it = ahead_.find(iteration); it != ahead_.end()) {
      v1::ExecutionPlan plan = std::move(it->second);
      ahead_.erase(it);
      changed_.SignalAll();
      ++prefetched_plans_;
      return plan;
    }
  }
  // Not streamed (yet): ask directly.
  absl::StatusOr<v1::ExecutionPlan> plan = GetDirect(iteration);
  if (plan.ok() && prefetch_ > 0 && !stubs_.empty()) {
    absl::MutexLock lock(&mu_);
    wanted_ = std::max(wanted_, iteration + 1);
    ahead_.erase(ahead_.begin(), ahead_.lower_bound(wanted_));
    changed_.SignalAll();
  }
  return plan;
}

absl::StatusOr<v1::ExecutionPlan> PlannerServiceSource::GetDirect(uint64_t iteration) {
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
      if (!BeginCall(&context)) return grpc::Status(grpc::StatusCode::CANCELLED, "shutting down");
      const grpc::Status s = stub.GetPlan(&context, request, &envelope);
      EndCall();
      return s;
    });
  } while (status.code() == absl::StatusCode::kDeadlineExceeded && absl::Now() < deadline);
  if (absl::IsCancelled(status)) {
    return absl::CancelledError(
        absl::StrCat("waiting for the plan of iteration ", iteration, ": ", status.message()));
  }
  if (status.code() == absl::StatusCode::kDeadlineExceeded) {
    return absl::DeadlineExceededError(
        absl::StrCat("no plan for iteration ", iteration, " rank ", rank_, " within ",
                     absl::FormatDuration(wait_),
                     " (are the planner daemons planning this job? see "
                     "varipipe-ctl status): ",
                     status.message()));
  }
  if (!status.ok()) return status;
  VP_RETURN_IF_ERROR(
      CheckPlan(envelope.plan(), iteration, plan_rank_, "GetPlan", addresses_[current_]));
  ++direct_plans_;
  return std::move(*envelope.mutable_plan());
}

absl::Status PlannerServiceSource::Done(const v1::ReportProgressRequest& progress) {
  v1::ReportProgressRequest request = progress;
  request.set_job_id(job_id_);
  request.set_rank(rank_);
  v1::ReportProgressResponse response;
  const absl::Status status = WithFailover("ReportProgress", [&](v1::PlanService::Stub& stub) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    if (!BeginCall(&context)) return grpc::Status(grpc::StatusCode::CANCELLED, "shutting down");
    const grpc::Status s = stub.ReportProgress(&context, request, &response);
    EndCall();
    return s;
  });
  // The planners check reports (docs/security.md): one for a plan they have
  // no record of this rank fetching (a Redis that lost its data, a retried
  // report whose first attempt succeeded) is ignored, not an error of the
  // training: the next report, of a plan fetched since, counts.
  if (absl::IsPermissionDenied(status) || absl::IsFailedPrecondition(status)) {
    spdlog::warn("{}", std::string(status.message()));
    return absl::OkStatus();
  }
  return status;
}

bool PlannerServiceSource::BeginCall(grpc::ClientContext* context) {
  absl::MutexLock lock(&call_mu_);
  if (cancelled_) return false;
  call_context_ = context;
  return true;
}

void PlannerServiceSource::EndCall() {
  absl::MutexLock lock(&call_mu_);
  call_context_ = nullptr;
}

void PlannerServiceSource::Cancel() {
  {
    absl::MutexLock lock(&call_mu_);
    cancelled_ = true;
    if (call_context_ != nullptr) call_context_->TryCancel();
  }
  // The prefetcher stops as on destruction (joined there).
  absl::MutexLock lock(&mu_);
  stop_ = true;
  if (stream_context_ != nullptr) stream_context_->TryCancel();
  changed_.SignalAll();
}

std::string PlannerServiceSource::Describe() const {
  return absl::StrCat("planner service at ", absl::StrJoin(addresses_, ","),
                      prefetch_ > 0 ? absl::StrCat(" (prefetching ", prefetch_, " plans ahead)")
                                    : std::string(" (no prefetching)"));
}

}  // namespace varipipe::executor
