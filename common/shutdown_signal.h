// Graceful shutdown on SIGTERM and SIGINT.
//
// ShutdownSignal blocks SIGTERM and SIGINT in the calling thread (and so in
// every thread it creates afterwards) and waits for them on a dedicated
// thread with sigwait(). Long-running loops poll Requested() or block in
// WaitFor(); no code runs inside a signal handler.
//
//   int main(...) {
//     varipipe::ShutdownSignal shutdown;   // before any other thread starts
//     while (!shutdown.Requested()) { ... }
//   }
//
// A second signal after the first ends the process at once (exit code
// 128 + signal), for operators whose shutdown is stuck. SIGUSR1 is used
// internally to stop the waiting thread; SIGUSR1 sent from outside is
// ignored while the object lives.
//
// Code that blocks where polling Requested() is impossible (a transfer
// inside a communication library) registers OnShutdown() callbacks that
// wake it. ExitAfter() bounds the whole shutdown: a process still running
// that long after the signal exits with 128 + signal.
//
// Thread safety: all methods may be called from any thread.
#ifndef VARIPIPE_COMMON_SHUTDOWN_SIGNAL_H_
#define VARIPIPE_COMMON_SHUTDOWN_SIGNAL_H_

#include <atomic>
#include <csignal>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace varipipe {

class ShutdownSignal {
 public:
  // REQUIRES: constructed in the main thread before other threads start, and
  // at most one instance alive at a time.
  ShutdownSignal();
  ~ShutdownSignal();
  ShutdownSignal(const ShutdownSignal&) = delete;
  ShutdownSignal& operator=(const ShutdownSignal&) = delete;

  // True once SIGTERM or SIGINT arrived or Request() was called.
  bool Requested() const { return request_claimed_.load(); }
  // Waits up to `timeout` for the request and its callbacks; returns whether
  // they happened.
  bool WaitFor(absl::Duration timeout) const {
    return requested_.WaitForNotificationWithTimeout(timeout);
  }
  // The signal that requested shutdown, or 0 (none, or Request()).
  int signal_number() const { return signal_number_.load(); }
  // Requests shutdown from code (e.g. when the work is done).
  void Request();

  // Unregisters its callback on destruction; once it returned, the callback
  // neither runs nor will run.
  class Subscription {
   public:
    Subscription(ShutdownSignal* owner, int id) : owner_(owner), id_(id) {}
    ~Subscription();
    Subscription(const Subscription&) = delete;
    Subscription& operator=(const Subscription&) = delete;

   private:
    ShutdownSignal* owner_;
    int id_;
  };
  // Runs `callback` once when shutdown is requested (on the thread that
  // requests it: the signal thread for signals), or at once when it already
  // was. Callbacks must be quick and must not block (e.g. cancel a call).
  [[nodiscard]] std::unique_ptr<Subscription> OnShutdown(std::function<void()> callback);

  // Once a signal requested shutdown, the process exits with status
  // 128 + signal if it is still running `grace` later (logging that it
  // does), wherever it is stuck. Without a call, it waits for the code.
  void ExitAfter(absl::Duration grace);

 private:
  void WaitLoop();
  void RunCallbacks();

  sigset_t signals_;
  sigset_t previous_mask_;
  std::atomic<int> signal_number_{0};
  // Set by the first Request(); guards requested_.Notify(), which may run
  // only once.
  std::atomic<bool> request_claimed_{false};
  // Set by the destructor before it wakes the waiter with SIGUSR1; a
  // SIGUSR1 from outside the process is ignored.
  std::atomic<bool> stopping_{false};
  absl::Notification requested_;
  // Milliseconds ExitAfter() allows after a signal; negative: no limit.
  std::atomic<int64_t> exit_after_ms_{-1};
  // Held while callbacks run or change, so an unsubscribed callback never
  // runs afterwards.
  std::mutex callbacks_mu_;
  std::map<int, std::function<void()>> callbacks_;
  int next_callback_ = 0;
  bool callbacks_ran_ = false;
  std::thread waiter_;
};

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_SHUTDOWN_SIGNAL_H_
