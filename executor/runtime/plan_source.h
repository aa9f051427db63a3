// Where an executor's plans come from, one per iteration:
// - PlanFiles: the layout varipipe-plan --emit-plans writes (plan_files.h);
// - PlannerService: the planner daemons' PlanService over gRPC, trying each
//   address in turn when one is unavailable; an iteration's plan is
//   acknowledged with ReportProgress once the iteration ran, which lets the
//   store delete it and the planners plan further ahead. A background thread
//   prefetches the next plans over WatchPlans; Get falls back to GetPlan
//   whenever the stream does not have the plan, so correctness never depends
//   on the stream.
#ifndef VARIPIPE_EXECUTOR_RUNTIME_PLAN_SOURCE_H_
#define VARIPIPE_EXECUTOR_RUNTIME_PLAN_SOURCE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/grpc/client_channel.h"
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
  // Ends a Get or Done waiting on another thread (and every later one) with
  // CANCELLED, for shutdown. Thread-safe; a no-op for sources that never wait.
  virtual void Cancel() {}
};

std::unique_ptr<PlanSource> PlanFileSource(std::string dir, int rank);

// Thread safety: GetJob/Get/Done/StartPrefetch from one thread; the
// prefetcher is a second, internal thread; the counters from any thread.
class PlannerServiceSource final : public PlanSource {
 public:
  // `addresses`: planner daemons ("host:port"), all serving the same job.
  // `wait` bounds how long Get waits for a plan that is not published yet.
  // `prefetch`: plans streamed ahead of the executor (WatchPlans); 0: none,
  // every plan is fetched with GetPlan when asked for. `security`: the job
  // token every call carries, and TLS (docs/security.md); a channel that
  // cannot be made (an unreadable TLS file) fails every call with the reason.
  PlannerServiceSource(std::vector<std::string> addresses, int rank, absl::Duration wait,
                       int prefetch = 4, const ClientSecurity& security = {});
  // Cancels the stream and joins the prefetcher.
  ~PlannerServiceSource() override;

  // The job the planners serve (config with defaults applied, store address).
  absl::StatusOr<v1::GetJobResponse> GetJob();
  void set_job_id(std::string job_id) { job_id_ = std::move(job_id); }

  // The pipeline rank whose plans `rank` runs (common/config/rank_layout.h;
  // `rank` itself until set, as without tensor parallelism): each plan
  // must name it. Before the first Get.
  void set_plan_rank(int plan_rank) { plan_rank_ = plan_rank; }

  // Starts prefetching from `first_iteration` (the first Get does it too).
  void StartPrefetch(uint64_t first_iteration);

  absl::StatusOr<v1::ExecutionPlan> Get(uint64_t iteration) override;
  absl::Status Done(const v1::ReportProgressRequest& progress) override;
  std::string Describe() const override;
  void Cancel() override;

  // Plans Get returned from the stream, and from GetPlan.
  uint64_t prefetched_plans() const { return prefetched_plans_.load(); }
  uint64_t direct_plans() const { return direct_plans_.load(); }

 private:
  // Runs `call` against the current planner, moving to the next address
  // while planners are unavailable (one round over all of them).
  template <typename Call>
  absl::Status WithFailover(const char* what, Call call);
  absl::StatusOr<v1::ExecutionPlan> GetDirect(uint64_t iteration);
  // Points the prefetcher at `first` (cancelling its stream) and drops what
  // it holds.
  void RestartPrefetchLocked(uint64_t first) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The prefetcher thread, starting at planner `index`.
  void PrefetchLoop(size_t index);
  // How one plan stream ended: whether it read a plan, a plan that failed
  // its check (the stream was then cancelled), and the stream's status.
  struct StreamEnd {
    bool read_any = false;
    absl::Status bad;
    grpc::Status status;
  };
  // Reads one WatchPlans stream from planner `index`, from next_ on, into
  // ahead_, until it ends, a plan fails its check, or the source stops or
  // restarts (a generation other than `generation`). Called and returns
  // with mu_ held; releases it while waiting on the stream.
  StreamEnd StreamPlans(size_t index, uint64_t generation) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<v1::PlanService::Stub>> stubs_;
  absl::Status channel_error_;  // why stubs_ is empty, if it is
  size_t current_ = 0;          // the direct calls' planner
  int rank_;
  int plan_rank_;
  absl::Duration wait_;
  int prefetch_;
  std::string job_id_;
  std::atomic<uint64_t> prefetched_plans_{0};
  std::atomic<uint64_t> direct_plans_{0};

  absl::Mutex mu_;
  absl::CondVar changed_;  // any of the fields below changed
  std::thread prefetcher_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Bumped by every restart; a stream of an older generation is stale.
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::string stream_job_id_ ABSL_GUARDED_BY(mu_);
  // The next iteration the stream delivers; every held plan is below it.
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  // The executor asks for nothing below this; older plans are not kept.
  uint64_t wanted_ ABSL_GUARDED_BY(mu_) = 0;
  // The stream ended (end of the job) or was refused for good: no plans
  // come until a restart.
  bool idle_ ABSL_GUARDED_BY(mu_) = false;
  // At most prefetch_ plans, each at least wanted_, keyed by iteration.
  std::map<uint64_t, v1::ExecutionPlan> ahead_ ABSL_GUARDED_BY(mu_);
  // The open stream's context (owned by the prefetcher) while one is open.
  grpc::ClientContext* stream_context_ ABSL_GUARDED_BY(mu_) = nullptr;

  // Set by Cancel(); the direct call in flight, which Cancel() cancels.
  // BeginCall registers a call's context (false once cancelled), EndCall
  // unregisters it.
  bool BeginCall(grpc::ClientContext* context);
  void EndCall();
  absl::Mutex call_mu_;
  bool cancelled_ ABSL_GUARDED_BY(call_mu_) = false;
  grpc::ClientContext* call_context_ ABSL_GUARDED_BY(call_mu_) = nullptr;
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_PLAN_SOURCE_H_
