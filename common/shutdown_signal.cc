#include "common/shutdown_signal.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace varipipe {

// SIGUSR1 wakes the waiter thread when the object is destroyed; it is part of
// the waited set only so that sigwait() returns.
ShutdownSignal::ShutdownSignal() {
  sigemptyset(&signals_);
  sigaddset(&signals_, SIGTERM);
  sigaddset(&signals_, SIGINT);
  sigaddset(&signals_, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &signals_, &previous_mask_);
  waiter_ = std::thread([this] { WaitLoop(); });
}

ShutdownSignal::~ShutdownSignal() {
  stopping_.store(true);
  pthread_kill(waiter_.native_handle(), SIGUSR1);
  waiter_.join();
  pthread_sigmask(SIG_SETMASK, &previous_mask_, nullptr);
}

void ShutdownSignal::Request() {
  if (request_claimed_.exchange(true)) return;
  // Callbacks first: whoever sees Requested() sees them done.
  RunCallbacks();
  requested_.Notify();
}

void ShutdownSignal::RunCallbacks() {
  std::lock_guard<std::mutex> lock(callbacks_mu_);
  callbacks_ran_ = true;
  for (auto& [id, callback] : callbacks_) callback();
  callbacks_.clear();
}

std::unique_ptr<ShutdownSignal::Subscription> ShutdownSignal::OnShutdown(
    std::function<void()> callback) {
  std::lock_guard<std::mutex> lock(callbacks_mu_);
  const int id = next_callback_++;
  if (callbacks_ran_) {
    callback();
  } else {
    callbacks_[id] = std::move(callback);
  }
  return std::make_unique<Subscription>(this, id);
}

ShutdownSignal::Subscription::~Subscription() {
  std::lock_guard<std::mutex> lock(owner_->callbacks_mu_);
  owner_->callbacks_.erase(id_);
}

void ShutdownSignal::ExitAfter(absl::Duration grace) {
  exit_after_ms_.store(absl::ToInt64Milliseconds(grace));
}

void ShutdownSignal::WaitLoop() {
  absl::Time exit_at = absl::InfiniteFuture();
  while (true) {
    int signal_number = 0;
    if (exit_at != absl::InfiniteFuture()) {
      // Shutting down under ExitAfter(): wait for a second signal only until
      // the limit, then end the process wherever it is stuck.
      const absl::Duration left = std::max(absl::ZeroDuration(), exit_at - absl::Now());
      const timespec timeout = absl::ToTimespec(left);
      signal_number = sigtimedwait(&signals_, nullptr, &timeout);
      if (signal_number < 0) {
        if (errno != EAGAIN) continue;
        const int first = signal_number_.load();
        spdlog::error("still running {} after {}; exiting now with status {}",
                      absl::FormatDuration(absl::Milliseconds(exit_after_ms_.load())),
                      first == SIGTERM ? "SIGTERM" : "SIGINT", 128 + first);
        spdlog::default_logger()->flush();
        std::_Exit(128 + first);
      }
    } else if (sigwait(&signals_, &signal_number) != 0) {
      continue;
    }
    if (signal_number == SIGUSR1) {
      if (stopping_.load()) return;
      continue;  // not ours
    }
    if (requested_.HasBeenNotified() && signal_number_.load() != 0) {
      spdlog::warn("second signal {} during shutdown; exiting now", signal_number);
      spdlog::default_logger()->flush();
      std::_Exit(128 + signal_number);
    }
    spdlog::info("received {}; shutting down (send it again to exit at once)",
                 signal_number == SIGTERM ? "SIGTERM" : "SIGINT");
    signal_number_.store(signal_number);
    if (const int64_t ms = exit_after_ms_.load(); ms >= 0) {
      exit_at = absl::Now() + absl::Milliseconds(ms);
    }
    Request();
  }
}

}  // namespace varipipe
