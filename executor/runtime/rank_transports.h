// The transports of one executor rank, owned past the end of its training
// loop and abortable from any thread.
//
// Invariants: once Abort() was called, every transport added (before or
// after) is aborted with the first reason, so a rank that learns of a peer's
// failure while it is still meeting its peers stops at its next wait. The
// transports close only in Close() (or the destructor): a failing rank
// reports its failure first, so that its peers learn the cause before they
// see its connections close.
#ifndef VARIPIPE_EXECUTOR_RUNTIME_RANK_TRANSPORTS_H_
#define VARIPIPE_EXECUTOR_RUNTIME_RANK_TRANSPORTS_H_

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "executor/comm/transport.h"

namespace varipipe::executor {

class RankTransports {
 public:
  RankTransports() = default;
  ~RankTransports() { Close(); }
  RankTransports(const RankTransports&) = delete;
  RankTransports& operator=(const RankTransports&) = delete;

  // Takes `transport` (aborting it at once when Abort() came first); the
  // pointer stays valid until Close().
  Transport* Add(std::unique_ptr<Transport> transport) {
    absl::MutexLock lock(&mu_);
    if (reason_.has_value()) transport->Abort(*reason_);
    transports_.push_back(std::move(transport));
    return transports_.back().get();
  }

  // Ends every wait of every transport, now and later (transport.h's Abort).
  // The first reason wins. Any thread.
  void Abort(const std::string& reason) {
    absl::MutexLock lock(&mu_);
    if (reason_.has_value()) return;
    reason_ = reason;
    for (const std::unique_ptr<Transport>& t : transports_) t->Abort(reason);
  }

  bool aborted() const {
    absl::MutexLock lock(&mu_);
    return reason_.has_value();
  }

  // Closes the connections (peers waiting on this rank then fail at once).
  void Close() {
    std::vector<std::unique_ptr<Transport>> closing;
    {
      absl::MutexLock lock(&mu_);
      closing.swap(transports_);
    }
    // Host transport first, the main one last (the reverse of Add).
    while (!closing.empty()) closing.pop_back();
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Transport>> transports_ ABSL_GUARDED_BY(mu_);
  std::optional<std::string> reason_ ABSL_GUARDED_BY(mu_);
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_RANK_TRANSPORTS_H_
