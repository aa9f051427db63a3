#include "executor/runtime/iteration_reporter.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace varipipe::executor {
namespace {

// Submit returns while the previous report is still running: the training
// thread never waits for a report unless max_pending are in flight.
TEST(IterationReporterTest, SubmitDoesNotWaitForARunningReport) {
  IterationReporter reporter(/*max_pending=*/2);
  absl::Notification release;
  absl::Notification started;
  ASSERT_TRUE(reporter
                  .Submit([&] {
                    started.Notify();
                    release.WaitForNotification();
                    return absl::OkStatus();
                  })
                  .ok());
  started.WaitForNotification();
  // One running, one more fits: returns at once although the first blocks.
  ASSERT_TRUE(reporter.Submit([] { return absl::OkStatus(); }).ok());
  EXPECT_EQ(reporter.completed(), 0u);
  release.Notify();
  EXPECT_TRUE(reporter.Flush().ok());
  EXPECT_EQ(reporter.completed(), 2u);
}

// Beyond max_pending, Submit waits for the oldest to finish (no unbounded
// backlog when reports lag).
TEST(IterationReporterTest, SubmitWaitsBeyondMaxPending) {
  IterationReporter reporter(/*max_pending=*/1);
  absl::Notification release;
  ASSERT_TRUE(reporter
                  .Submit([&] {
                    release.WaitForNotification();
                    return absl::OkStatus();
                  })
                  .ok());
  std::atomic<bool> second_submitted{false};
  std::thread submitter([&] {
    EXPECT_TRUE(reporter.Submit([] { return absl::OkStatus(); }).ok());
    second_submitted = true;
  });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(second_submitted.load()) << "Submit went past max_pending";
  release.Notify();
  submitter.join();
  EXPECT_TRUE(second_submitted.load());
  EXPECT_TRUE(reporter.Flush().ok());
}

// Reports run one at a time in submission order (every rank's collectives
// in the same order).
TEST(IterationReporterTest, RunsInSubmissionOrderOneAtATime) {
  IterationReporter reporter(/*max_pending=*/3);
  absl::Mutex mu;
  std::vector<int> order;
  std::atomic<int> running{0};
  std::atomic<int> most{0};
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(reporter
                    .Submit([&, i] {
                      const int now = ++running;
                      most = std::max(most.load(), now);
                      {
                        absl::MutexLock lock(&mu);
                        order.push_back(i);
                      }
                      --running;
                      return absl::OkStatus();
                    })
                    .ok());
  }
  ASSERT_TRUE(reporter.Flush().ok());
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[i], i);
  EXPECT_EQ(most.load(), 1);
}

// A failed report is not lost: the next Submit and Flush return it, and no
// later report runs.
TEST(IterationReporterTest, FirstFailureSticksAndDropsLaterReports) {
  IterationReporter reporter(/*max_pending=*/2);
  std::atomic<int> ran{0};
  ASSERT_TRUE(reporter.Submit([] { return absl::UnavailableError("planner gone"); }).ok());
  EXPECT_EQ(reporter.Flush().code(), absl::StatusCode::kUnavailable);
  const absl::Status later = reporter.Submit([&] {
    ++ran;
    return absl::OkStatus();
  });
  EXPECT_EQ(later.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(std::string(later.message()).find("planner gone"), std::string::npos);
  EXPECT_EQ(reporter.Flush().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ran.load(), 0);
}

// Discard drops what has not started; destruction returns once the running
// report does.
TEST(IterationReporterTest, DiscardDropsQueuedReports) {
  std::atomic<int> ran{0};
  absl::Notification release;
  absl::Notification started;
  {
    IterationReporter reporter(/*max_pending=*/3);
    ASSERT_TRUE(reporter
                    .Submit([&] {
                      started.Notify();
                      release.WaitForNotification();
                      ++ran;
                      return absl::OkStatus();
                    })
                    .ok());
    started.WaitForNotification();
    ASSERT_TRUE(reporter
                    .Submit([&] {
                      ++ran;
                      return absl::OkStatus();
                    })
                    .ok());
    reporter.Discard();
    release.Notify();
  }
  EXPECT_EQ(ran.load(), 1);
}

}  // namespace
}  // namespace varipipe::executor
