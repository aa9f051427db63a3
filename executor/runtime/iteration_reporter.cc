#include "executor/runtime/iteration_reporter.h"

#include <algorithm>
#include <utility>

namespace varipipe::executor {

IterationReporter::IterationReporter(size_t max_pending)
    : max_pending_(std::max<size_t>(1, max_pending)), thread_([this] { Loop(); }) {}

IterationReporter::~IterationReporter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    queue_.clear();
  }
  thread_.join();
}

absl::Status IterationReporter::Submit(Job job) {
  absl::MutexLock lock(&mu_);
  const auto room = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !failure_.ok() || queue_.size() + (running_ ? 1 : 0) < max_pending_;
  };
  mu_.Await(absl::Condition(&room));
  if (!failure_.ok()) return failure_;
  queue_.push_back(std::move(job));
  return absl::OkStatus();
}

absl::Status IterationReporter::Flush() {
  absl::MutexLock lock(&mu_);
  const auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !failure_.ok() || (queue_.empty() && !running_);
  };
  mu_.Await(absl::Condition(&idle));
  return failure_;
}

void IterationReporter::Discard() {
  absl::MutexLock lock(&mu_);
  queue_.clear();
}

size_t IterationReporter::completed() const {
  absl::MutexLock lock(&mu_);
  return completed_;
}

void IterationReporter::Loop() {
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      const auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
    }
    const absl::Status status = job();
    absl::MutexLock lock(&mu_);
    running_ = false;
    ++completed_;
    if (!status.ok() && failure_.ok()) {
      failure_ = status;
      queue_.clear();  // nothing after a failed report is reported
    }
  }
}

}  // namespace varipipe::executor
