#include "common/shutdown_signal.h"

#include <signal.h>

#include <thread>
#include <vector>

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

}  // namespace
}  // namespace varipipe
