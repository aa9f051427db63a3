#include "common/shutdown_signal.h"

#include <signal.h>

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

}  // namespace
}  // namespace varipipe
