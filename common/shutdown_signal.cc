#include "common/shutdown_signal.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>

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
  if (!request_claimed_.exchange(true)) requested_.Notify();
}

void ShutdownSignal::WaitLoop() {
  while (true) {
    int signal_number = 0;
    if (sigwait(&signals_, &signal_number) != 0) continue;
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
    Request();
  }
}

}  // namespace varipipe
