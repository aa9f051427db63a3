// The Redis instruction store against a real redis-server.
#include <set>
#include <thread>

#include "absl/time/clock.h"
#include "common/redis/redis_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/service/redis_instruction_store.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::service {
namespace {

using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::IsOkAndHolds;
using ::varipipe::testing::StatusIs;

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<RedisServer>> server = RedisServer::Start();
    ASSERT_THAT(server, IsOk());
    server_ = *std::move(server);
  }
  std::unique_ptr<RedisInstructionStore> Open(absl::Duration lease = absl::Seconds(30)) {
    absl::StatusOr<std::unique_ptr<RedisInstructionStore>> store = RedisInstructionStore::Open(
        {.host = server_->host(), .port = server_->port(), .password = server_->password()},
        {.job_id = "job", .world_size = 2, .total_iterations = 10, .lease = lease});
    EXPECT_THAT(store, IsOk());
    return *std::move(store);
  }
  // Deletes every lease key of the job: what Redis does when leases expire.
  void ExpireLeases() {
    absl::StatusOr<std::unique_ptr<RedisClient>> client = RedisClient::Connect(
        {.host = server_->host(), .port = server_->port(), .password = server_->password()});
    ASSERT_THAT(client, IsOk());
    absl::StatusOr<RedisReply> keys = (*client)->Command({"KEYS", "*:lease:*"});
    ASSERT_THAT(keys, IsOk());
    ASSERT_GT(keys->size(), 0u) << "no lease keys: has the key schema changed?";
    for (size_t i = 0; i < keys->size(); ++i) {
      ASSERT_THAT((*client)->Command({"DEL", ElementString(keys->element(i))}), IsOk());
    }
  }
  std::unique_ptr<RedisServer> server_;
};

v1::JobConfig Config(uint32_t layers) {
  v1::JobConfig c;
  c.set_job_id("job");
  c.mutable_model()->set_num_layers(layers);
  return c;
}

TEST_F(StoreTest, RegistersOnceAndRefusesAnotherConfig) {
  auto a = Open();
  auto b = Open();
  ASSERT_THAT(a->job().RegisterJob(Config(4)), IsOk());
  EXPECT_THAT(b->job().RegisterJob(Config(4)), IsOk());
  EXPECT_THAT(b->job().RegisterJob(Config(8)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       ::testing::AllOf(HasSubstr("another config"), HasSubstr("num_layers"))));
  absl::StatusOr<v1::JobConfig> loaded = b->job().LoadJob();
  ASSERT_THAT(loaded, IsOk());
  EXPECT_EQ(loaded->model().num_layers(), 4u);
}

TEST_F(StoreTest, ClaimsRespectTheLimitAndTheEnd) {
  auto s = Open();
  EXPECT_THAT(s->plans().Claim("a", 3), IsOkAndHolds(std::optional<uint64_t>(0)));
  EXPECT_THAT(s->plans().Claim("a", 3), IsOkAndHolds(std::optional<uint64_t>(1)));
  EXPECT_THAT(s->plans().Claim("b", 3), IsOkAndHolds(std::optional<uint64_t>(2)));
  EXPECT_THAT(s->plans().Claim("b", 3), IsOkAndHolds(std::optional<uint64_t>()));  // back-pressure
  for (uint64_t i = 3; i < 10; ++i)
    EXPECT_THAT(s->plans().Claim("a", 100), IsOkAndHolds(std::optional<uint64_t>(i)));
  EXPECT_THAT(s->plans().Claim("a", 100), IsOkAndHolds(std::optional<uint64_t>()));  // job done
}

TEST_F(StoreTest, PublishesExactlyOnceAndTakesOverExpiredLeases) {
  // Leases far longer than the test: they end only when the test expires
  // them, so the outcome does not depend on how fast the machine is.
  auto a = Open(absl::Minutes(10));
  auto b = Open(absl::Minutes(10));
  ASSERT_THAT(a->plans().Claim("a", 10), IsOkAndHolds(std::optional<uint64_t>(0)));
  // b cannot take iteration 0 while a's lease lives; it gets a new one.
  ASSERT_THAT(b->plans().Claim("b", 10), IsOkAndHolds(std::optional<uint64_t>(1)));
  // a "crashes" and b stalls: both leases expire (as Redis would expire them
  // once their time ran out).
  ExpireLeases();
  // b's lease on 1 expired too; the lowest lost iteration comes first.
  ASSERT_THAT(b->plans().Claim("b", 10), IsOkAndHolds(std::optional<uint64_t>(0)));
  EXPECT_THAT(a->plans().Publish(0, {"p0", "p1"}, "{}", "a"), IsOkAndHolds(false));  // lease lost
  EXPECT_THAT(b->plans().Publish(0, {"p0", "p1"}, "{}", "b"), IsOkAndHolds(true));
  EXPECT_THAT(b->plans().Publish(0, {"x", "y"}, "{}", "b"), IsOkAndHolds(false));  // once
  EXPECT_THAT(a->plans().GetPlan(0, 1), IsOkAndHolds(std::optional<std::string>("p1")));
  absl::StatusOr<StoreCounters> c = a->Counters();
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->published, 1u);
  EXPECT_EQ(c->claimed, 2u);
  EXPECT_EQ(c->unpublished, 1u);  // iteration 1
}

TEST_F(StoreTest, WaitPlanReturnsOnPublicationAndTimesOut) {
  auto waiter = Open();
  auto publisher = Open();
  EXPECT_THAT(waiter->plans().WaitPlan(5, 0, absl::Milliseconds(100)),
              IsOkAndHolds(std::optional<std::string>()));
  ASSERT_THAT(publisher->plans().ClaimIteration(5, "p"), IsOkAndHolds(true));
  std::thread later([&] {
    absl::SleepFor(absl::Milliseconds(200));
    ASSERT_THAT(publisher->plans().Publish(5, {"r0", "r1"}, "{}", "p"), IsOkAndHolds(true));
  });
  // The plan arrives whether the wait starts before or after the publication;
  // a wait that ignored the publication would end empty after its timeout.
  EXPECT_THAT(waiter->plans().WaitPlan(5, 0, absl::Minutes(2)),
              IsOkAndHolds(std::optional<std::string>("r0")));
  later.join();
}

TEST_F(StoreTest, AcknowledgementsDeleteThePlanAndProgressIsTracked) {
  auto s = Open();
  ASSERT_THAT(s->plans().ClaimIteration(0, "p"), IsOkAndHolds(true));
  ASSERT_THAT(s->plans().Publish(0, {"r0", "r1"}, "{}", "p"), IsOkAndHolds(true));
  ASSERT_THAT(s->progress().Acknowledge(0, 0), IsOk());
  EXPECT_THAT(s->plans().IsPublished(0), IsOkAndHolds(true));
  ASSERT_THAT(s->progress().Acknowledge(0, 1), IsOk());
  EXPECT_THAT(s->plans().IsPublished(0), IsOkAndHolds(false));
  ASSERT_THAT(s->progress().ReportProgress(0, 4, "{}"), IsOk());
  absl::StatusOr<StoreCounters> c = s->Counters();
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->min_progress, 0u);  // rank 1 has not reported
  ASSERT_THAT(s->progress().ReportProgress(1, 2, "{}"), IsOk());
  c = s->Counters();
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->min_progress, 3u);
  EXPECT_EQ(c->acknowledged, 1u);
}

}  // namespace
}  // namespace varipipe::service
