// The Gloo transport with ranks as threads over loopback TCP, rendezvous
// through a real redis-server.
#include "executor/comm/gloo/gloo_transport.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::executor {
namespace {

using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

class GlooTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
    ASSERT_THAT(redis, IsOk());
    redis_ = *std::move(redis);
  }
  GlooTransport::Options Options(int rank, int size, const std::string& run) {
    GlooTransport::Options o;
    o.redis.host = redis_->host();
    o.redis.port = redis_->port();
    o.redis.password = redis_->password();
    o.prefix = absl::StrCat("test/", run);
    o.rank = rank;
    o.size = size;
    o.connect_timeout = absl::Seconds(20);
    return o;
  }
  // Runs `body(rank, transport)` on `size` threads.
  template <typename F>
  void RunRanks(int size, const std::string& run, F body) {
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r) {
      threads.emplace_back([&, r] {
        absl::StatusOr<std::unique_ptr<GlooTransport>> t =
            GlooTransport::Create(Options(r, size, run));
        ASSERT_THAT(t, IsOk()) << "rank " << r;
        body(r, **t);
      });
    }
    for (auto& t : threads) t.join();
  }
  std::unique_ptr<RedisServer> redis_;
};

TEST_F(GlooTransportTest, TransfersPairInChannelOrder) {
  RunRanks(2, "order", [](int rank, GlooTransport& t) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    if (rank == 0) {
      std::vector<float> a(1000, 1.5f), b(10, 2.5f), c(3, 0);
      auto sa = t.StartSend(1, a.data(), a.size() * 4);
      auto sb = t.StartSend(1, b.data(), b.size() * 4);
      auto rc = t.StartRecv(1, c.data(), c.size() * 4);
      ASSERT_THAT(sa, IsOk());
      ASSERT_THAT(sb, IsOk());
      ASSERT_THAT(rc, IsOk());
      EXPECT_THAT((*rc)->Wait(deadline), IsOk());
      EXPECT_THAT((*sa)->Wait(deadline), IsOk());
      EXPECT_THAT((*sb)->Wait(deadline), IsOk());
      EXPECT_EQ(c, (std::vector<float>{7, 8, 9}));
    } else {
      std::vector<float> a(1000, 0), b(10, 0), c = {7, 8, 9};
      // Posted in the same channel order as rank 0's transfers.
      auto ra = t.StartRecv(0, a.data(), a.size() * 4);
      auto rb = t.StartRecv(0, b.data(), b.size() * 4);
      auto sc = t.StartSend(0, c.data(), c.size() * 4);
      ASSERT_THAT(rb, IsOk());
      EXPECT_THAT((*rb)->Wait(deadline), IsOk());
      EXPECT_THAT((*ra)->Wait(deadline), IsOk());
      EXPECT_THAT((*sc)->Wait(deadline), IsOk());
      EXPECT_EQ(a, std::vector<float>(1000, 1.5f));
      EXPECT_EQ(b, std::vector<float>(10, 2.5f));
    }
  });
}

TEST_F(GlooTransportTest, AWaitWithoutAPeerTimesOutNamingThePeer) {
  // Rank 0 stays alive (and connected) until rank 1's wait has timed out, so
  // the outcome cannot depend on how fast either thread runs.
  absl::Notification waited;
  RunRanks(2, "timeout", [&waited](int rank, GlooTransport& t) {
    if (rank == 1) {
      float x = 0;
      auto r = t.StartRecv(0, &x, sizeof(x));
      if (r.ok()) {
        EXPECT_THAT((*r)->Wait(absl::Now() + absl::Milliseconds(300)),
                    StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("rank 0")));
      } else {
        ADD_FAILURE() << r.status();
      }
      waited.Notify();
    } else {
      // Alive, but never sends. The bound only ends the test if rank 1 died.
      EXPECT_TRUE(waited.WaitForNotificationWithTimeout(absl::Seconds(120)));
    }
  });
}

TEST_F(GlooTransportTest, ADeadPeerIsReportedAsUnavailable) {
  // Rank 0 leaves as soon as its rendezvous is done (Create's barrier makes
  // that safe for rank 1's).
  RunRanks(2, "dead", [](int rank, GlooTransport& t) {
    if (rank == 1) {
      float x = 0;
      auto r = t.StartRecv(0, &x, sizeof(x));
      // Depending on timing the dead connection shows when the receive is
      // posted or while it is waited for; both name the peer.
      const absl::Status s = r.ok() ? (*r)->Wait(absl::Now() + absl::Seconds(20)) : r.status();
      EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("rank 0")));
    }
    // Rank 0 returns: its transport closes its connections.
  });
}

TEST_F(GlooTransportTest, AllReduceAveragesWithinDataParallelGroups) {
  RunRanks(4, "allreduce", [](int rank, GlooTransport& t) {
    // Two pipelines of two stages: groups {0, 2} and {1, 3}.
    const std::vector<int> group = rank % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
    std::vector<float> data(5, static_cast<float>(rank));
    ASSERT_THAT(t.AllReduceMean(data, group), IsOk());
    const float expected = rank % 2 == 0 ? 1.0f : 2.0f;
    EXPECT_EQ(data, std::vector<float>(5, expected)) << "rank " << rank;
  });
}

TEST_F(GlooTransportTest, MissingRankFailsRendezvousClearly) {
  GlooTransport::Options o = Options(0, 2, "missing");
  o.connect_timeout = absl::Seconds(1);
  EXPECT_THAT(GlooTransport::Create(o),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("rendezvous of rank 0 of 2")));
  EXPECT_THAT(GlooTransport::Create(Options(2, 2, "bad")),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// The ring all-reduce against a brute-force sum, over groups of 2 to 5 ranks
// and lengths that leave chunks uneven or empty (fewer elements than
// ranks); every rank gets exactly the same bits, several calls in a row.
TEST_F(GlooTransportTest, RingAllReduceMatchesTheSumOnEveryRank) {
  for (int size : {2, 3, 5}) {
    for (size_t length : {size_t{1}, size_t{4}, size_t{1001}}) {
      std::vector<std::vector<float>> results(size);
      RunRanks(size, absl::StrCat("ring-", size, "-", length), [&](int rank, GlooTransport& t) {
        std::vector<int> group;
        for (int r = 0; r < size; ++r) group.push_back(r);
        for (int call = 0; call < 3; ++call) {
          std::vector<float> data(length);
          for (size_t k = 0; k < length; ++k) {
            data[k] = 0.1f * static_cast<float>(rank + 1) + 0.37f * static_cast<float>(k + call);
          }
          ASSERT_THAT(t.AllReduceMean(data, group), IsOk()) << "rank " << rank;
          if (call == 2) results[rank] = data;
        }
      });
      for (size_t k = 0; k < length; ++k) {
        double sum = 0;
        for (int r = 0; r < size; ++r) sum += 0.1 * (r + 1) + 0.37 * (k + 2);
        ASSERT_NEAR(results[0][k], sum / size, 1e-4 * std::max(1.0, sum)) << size << " " << k;
      }
      for (int r = 1; r < size; ++r) {
        EXPECT_EQ(results[r], results[0]) << "ranks 0 and " << r << " of " << size << " differ";
      }
    }
  }
}

// ZeRO stage 1's collectives against brute force, over groups of 2 to 5
// ranks (shard sizes 1 and 7), interleaved with an all-reduce on the same
// group (slots stay paired): after ReduceScatterSum each rank's shard is the
// sum of that shard over the group, and AllGather then gives every rank the
// same whole buffer; a length the group does not divide is refused.
TEST_F(GlooTransportTest, ReduceScatterAndAllGatherMatchBruteForce) {
  for (int size : {2, 3, 5}) {
    for (size_t shard : {size_t{1}, size_t{7}}) {
      const size_t length = shard * static_cast<size_t>(size);
      std::vector<std::vector<float>> gathered(size);
      RunRanks(size, absl::StrCat("shards-", size, "-", shard), [&](int rank, GlooTransport& t) {
        std::vector<int> group;
        for (int r = 0; r < size; ++r) group.push_back(r);
        const auto value = [](int r, size_t k) {
          return 0.25f * static_cast<float>(r + 1) + 0.5f * static_cast<float>(k);
        };
        std::vector<float> data(length);
        for (size_t k = 0; k < length; ++k) data[k] = value(rank, k);
        ASSERT_THAT(t.ReduceScatterSum(data, group), IsOk()) << "rank " << rank;
        for (size_t k = rank * shard; k < (rank + 1) * shard; ++k) {
          float sum = 0;
          for (int r = 0; r < size; ++r) sum += value(r, k);
          EXPECT_NEAR(data[k], sum, 1e-4f * sum) << "rank " << rank << " element " << k;
        }
        std::vector<float> mean(3, static_cast<float>(rank));
        ASSERT_THAT(t.AllReduceMean(mean, group), IsOk());
        EXPECT_FLOAT_EQ(mean[0], static_cast<float>(size - 1) / 2);
        // Each rank's shard: its rank number, elsewhere garbage.
        std::vector<float> params(length, -1.0f);
        for (size_t k = rank * shard; k < (rank + 1) * shard; ++k) {
          params[k] = static_cast<float>(rank * 100 + k);
        }
        ASSERT_THAT(t.AllGather(params, group), IsOk()) << "rank " << rank;
        gathered[rank] = params;
        std::vector<float> uneven(length + 1);
        EXPECT_THAT(t.ReduceScatterSum(uneven, group),
                    StatusIs(absl::StatusCode::kInvalidArgument));
        EXPECT_THAT(t.AllGather(uneven, group), StatusIs(absl::StatusCode::kInvalidArgument));
      });
      for (int r = 0; r < size; ++r) {
        for (size_t k = 0; k < length; ++k) {
          const int owner = static_cast<int>(k / shard);
          ASSERT_EQ(gathered[r][k], static_cast<float>(owner * 100 + k))
              << "rank " << r << " element " << k << " of " << size;
        }
      }
    }
  }
}

// The started collectives of ZeRO stage 1's buckets run on the collective
// thread in the order they were started: three ranks start two
// reduce-scatters and an all-gather of three buffers back to back, then wait
// for them; each result equals the blocking collective's, bit for bit.
TEST_F(GlooTransportTest, StartedReduceScattersAndAllGathersEqualTheBlockingOnes) {
  constexpr int kSize = 3;
  RunRanks(kSize, "started-shards", [&](int rank, GlooTransport& t) {
    const std::vector<int> group{0, 1, 2};
    const auto values = [&](size_t length, float scale) {
      std::vector<float> v(length);
      for (size_t k = 0; k < length; ++k) {
        v[k] = scale * static_cast<float>(rank + 1) + 0.1f * static_cast<float>(k);
      }
      return v;
    };
    std::vector<float> a = values(12, 0.3f), b = values(30, 0.7f), c = values(9, 1.1f);
    std::vector<float> a_ref = a, b_ref = b, c_ref = c;
    absl::StatusOr<std::unique_ptr<Transfer>> ta = t.StartReduceScatterSum(a, group);
    absl::StatusOr<std::unique_ptr<Transfer>> tb = t.StartReduceScatterSum(b, group);
    absl::StatusOr<std::unique_ptr<Transfer>> tc = t.StartAllGather(c, group);
    for (auto* started : {&ta, &tb, &tc}) {
      ASSERT_THAT(*started, IsOk()) << "rank " << rank;
      ASSERT_THAT((**started)->Wait(absl::Now() + absl::Seconds(30)), IsOk()) << "rank " << rank;
    }
    ASSERT_THAT(t.ReduceScatterSum(a_ref, group), IsOk());
    ASSERT_THAT(t.ReduceScatterSum(b_ref, group), IsOk());
    ASSERT_THAT(t.AllGather(c_ref, group), IsOk());
    // The reduce-scatters define only this rank's shard.
    for (size_t k = rank * 4; k < (rank + 1) * 4u; ++k) EXPECT_EQ(a[k], a_ref[k]) << k;
    for (size_t k = rank * 10; k < (rank + 1) * 10u; ++k) EXPECT_EQ(b[k], b_ref[k]) << k;
    EXPECT_EQ(c, c_ref);
    // A length the group does not divide fails through the transfer.
    std::vector<float> uneven(4);
    absl::StatusOr<std::unique_ptr<Transfer>> bad = t.StartReduceScatterSum(uneven, group);
    ASSERT_THAT(bad, IsOk());
    EXPECT_THAT((*bad)->Wait(absl::Now() + absl::Seconds(30)),
                StatusIs(absl::StatusCode::kInvalidArgument));
  });
}

// Abort() from another thread ends a receive from a peer that is alive but
// never sends, and an all-reduce whose peer never joins, at once with
// CANCELLED and the reason; later calls fail the same way.
TEST_F(GlooTransportTest, AbortEndsWaitsOnSilentPeers) {
  absl::Notification done;
  RunRanks(2, "abort", [&done](int rank, GlooTransport& t) {
    if (rank == 0) {
      // Alive and connected, silent until rank 1 is done.
      EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(120)));
      return;
    }
    float x = 0;
    auto r = t.StartRecv(0, &x, sizeof(x));
    ASSERT_THAT(r, IsOk());
    std::thread aborter([&t] {
      absl::SleepFor(absl::Milliseconds(200));
      t.Abort("aborted for shutdown");
    });
    // The deadline is far: only the abort ends the wait.
    EXPECT_THAT((*r)->Wait(absl::Now() + absl::Seconds(120)),
                StatusIs(absl::StatusCode::kCancelled,
                         ::testing::AllOf(HasSubstr("receive from rank 0"),
                                          HasSubstr("aborted for shutdown"))));
    aborter.join();
    std::vector<float> data(8, 1.0f);
    EXPECT_THAT(t.AllReduceMean(data, {0, 1}), StatusIs(absl::StatusCode::kCancelled));
    EXPECT_THAT(t.StartSend(0, &x, sizeof(x)), StatusIs(absl::StatusCode::kCancelled));
    done.Notify();
  });
  // An all-reduce blocked on a peer that joined the group but never reduces.
  absl::Notification joined;
  absl::Notification reduced;
  RunRanks(2, "abort-allreduce", [&](int rank, GlooTransport& t) {
    std::vector<float> data(1000, 1.0f);
    if (rank == 0) {
      // Joins the group with a first all-reduce, then stays silent.
      EXPECT_THAT(t.AllReduceMean(data, {0, 1}), IsOk());
      joined.Notify();
      EXPECT_TRUE(reduced.WaitForNotificationWithTimeout(absl::Seconds(120)));
      return;
    }
    EXPECT_THAT(t.AllReduceMean(data, {0, 1}), IsOk());
    ASSERT_TRUE(joined.WaitForNotificationWithTimeout(absl::Seconds(120)));
    std::thread aborter([&t] {
      absl::SleepFor(absl::Milliseconds(200));
      t.Abort("aborted for shutdown");
    });
    EXPECT_THAT(t.AllReduceMean(data, {0, 1}),
                StatusIs(absl::StatusCode::kCancelled, HasSubstr("all-reduce over ranks 0,1")));
    aborter.join();
    reduced.Notify();
  });
}

// Every rank's rendezvous succeeds even when each rank closes its transport
// the moment Create returns (as a rank does that refuses its plan): Create
// returns only once every peer has finished connecting. Repeated, since the
// race this guards against (a peer closing while another still completes its
// connection handshake) needs an unlucky interleaving.
TEST_F(GlooTransportTest, ARankLeavingRightAfterItsRendezvousNeverFailsAPeers) {
  constexpr int kRounds = 40;
  constexpr int kSize = 3;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<absl::Status> results(kSize);
    std::vector<std::thread> threads;
    for (int r = 0; r < kSize; ++r) {
      threads.emplace_back([&, r] {
        // Destroyed at once: its connections close as this thread returns.
        results[r] =
            GlooTransport::Create(Options(r, kSize, absl::StrCat("leave-", round))).status();
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < kSize; ++r) {
      ASSERT_THAT(results[r], IsOk()) << "round " << round << ", rank " << r;
    }
  }
}

// A rendezvous whose peers never come ends with CANCELLED as soon as the
// cancellation check says so, long before its timeout.
TEST_F(GlooTransportTest, ACancelledRendezvousEndsAtOnce) {
  GlooTransport::Options o = Options(0, 2, "cancelled");
  o.connect_timeout = absl::Seconds(300);
  const absl::Time cancel_at = absl::Now() + absl::Milliseconds(300);
  o.cancelled = [cancel_at] { return absl::Now() >= cancel_at; };
  EXPECT_THAT(GlooTransport::Create(o),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("rendezvous of rank 0 of 2")));
}

}  // namespace
}  // namespace varipipe::executor
