// What happens after an iteration ran and before its numbers are known
// everywhere (the metrics all-reduce over every rank, the report to the
// planner daemons, the status board, the log): run off the critical path, on
// a thread of its own, while the training thread fetches the next plan and
// queues the next iteration's first passes (docs/executor.md, "Where the host
// waits").
//
// Jobs run one at a time in the order they were submitted, so every rank
// runs its reports' collectives in the same order (the reporter must be the
// only user of the transport those collectives go over). The first job that
// fails stops the reporter: later jobs are dropped and every later Submit
// and Flush returns that failure, so a failed report ends training at the
// next iteration's boundary instead of being lost.
//
//   IterationReporter reporter(/*max_pending=*/2);
//   for (...) {
//     ... run iteration i ...
//     VP_RETURN_IF_ERROR(reporter.Submit([=] { return Report(i); }));
//   }
//   VP_RETURN_IF_ERROR(reporter.Flush());  // every report made
#ifndef VARIPIPE_EXECUTOR_RUNTIME_ITERATION_REPORTER_H_
#define VARIPIPE_EXECUTOR_RUNTIME_ITERATION_REPORTER_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace varipipe::executor {

class IterationReporter {
 public:
  using Job = std::function<absl::Status()>;

  // At most `max_pending` jobs wait or run at once: Submit blocks while
  // that many are pending (a report that lags by more than that many
  // iterations holds training back instead of piling up).
  explicit IterationReporter(size_t max_pending = 2);
  // Drops the jobs that have not started and joins the thread once the
  // running one returns (its caller must make it return: the transport it
  // waits on aborted, the plan source cancelled).
  ~IterationReporter();

  IterationReporter(const IterationReporter&) = delete;
  IterationReporter& operator=(const IterationReporter&) = delete;

  // Queues `job`; the failure of an earlier job if there was one (then
  // `job` is dropped).
  absl::Status Submit(Job job);
  // Waits until every submitted job ran; the first failure, if any.
  absl::Status Flush();
  // Drops the jobs that have not started (a failed iteration: nothing
  // after it is reported); the running one finishes.
  void Discard();

  // Jobs that ran to completion, successful or not.
  size_t completed() const;

 private:
  void Loop();

  const size_t max_pending_;
  mutable absl::Mutex mu_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // a job is running now
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  size_t completed_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;  // last: started once the fields above exist
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_ITERATION_REPORTER_H_
