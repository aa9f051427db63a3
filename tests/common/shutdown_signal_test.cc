#include "common/shutdown_signal.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace varipipe {
namespace {

TEST(ShutdownSignal, SigtermRequestsShutdown) {
  ShutdownSignal shutdown;
  EXPECT_FALSE(shutdown.Requested());
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);
  EXPECT_TRUE(shutdown.WaitFor(absl::Seconds(10)));
  EXPECT_EQ(shutdown.signal_number(), SIGTERM);
}

TEST(ShutdownSignal, RequestFromCode) {
  ShutdownSignal shutdown;
  EXPECT_FALSE(shutdown.WaitFor(absl::Milliseconds(10)));
  shutdown.Request();
  EXPECT_TRUE(shutdown.Requested());
  EXPECT_EQ(shutdown.signal_number(), 0);
}

TEST(ShutdownSignal, ConcurrentRequestsAreSafe) {
  ShutdownSignal shutdown;
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) threads.emplace_back([&] { shutdown.Request(); });
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(shutdown.WaitFor(absl::Seconds(10)));
  // The threads' requests end the wait even while the SIGTERM is still
  // pending; destroying the object then would unblock it with its default
  // action and kill the test. Wait until the handler has taken it.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (shutdown.signal_number() == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(shutdown.signal_number(), SIGTERM);
}

// SIGUSR1 from outside must neither stop the handler nor count as shutdown.
TEST(ShutdownSignal, ForeignSigusr1IsIgnored) {
  ShutdownSignal shutdown;
  ASSERT_EQ(kill(getpid(), SIGUSR1), 0);
  EXPECT_FALSE(shutdown.WaitFor(absl::Milliseconds(100)));
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);
  EXPECT_TRUE(shutdown.WaitFor(absl::Seconds(10)));
  EXPECT_EQ(shutdown.signal_number(), SIGTERM);
}

// Callbacks run once when shutdown is requested; an unsubscribed one never
// does, and one registered afterwards runs at once.
TEST(ShutdownSignal, CallbacksRunOnceOnRequest) {
  ShutdownSignal shutdown;
  int first = 0;
  int dropped = 0;
  auto keep = shutdown.OnShutdown([&first] { ++first; });
  {
    auto gone = shutdown.OnShutdown([&dropped] { ++dropped; });
  }
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);
  ASSERT_TRUE(shutdown.WaitFor(absl::Seconds(10)));
  // Requested() is visible once the callbacks ran.
  int late = 0;
  auto after = shutdown.OnShutdown([&late] { ++late; });
  EXPECT_EQ(first, 1);
  EXPECT_EQ(dropped, 0);
  EXPECT_EQ(late, 1);
  shutdown.Request();
  EXPECT_EQ(first, 1);
}

// ExitAfter: a process that does not end after the signal is ended with
// 128 + signal, wherever it is stuck.
TEST(ShutdownSignal, ExitAfterEndsAStuckProcess) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ShutdownSignal shutdown;
    shutdown.ExitAfter(absl::Milliseconds(200));
    kill(getpid(), SIGTERM);
    while (true) pause();  // stuck: only ExitAfter ends it
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM);
}

}  // namespace
}  // namespace varipipe
