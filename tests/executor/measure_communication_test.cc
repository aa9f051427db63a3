// varipipe-profile's transfer measurements (executor/profile/update_profile.h):
// the link fit recovers a known line, and the measurements over real Gloo
// ranks (threads over loopback TCP) give every rank a complete, positive
// set of links, the context group's collectives included.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "executor/comm/gloo/gloo_transport.h"
#include "executor/profile/update_profile.h"
#include "tests/testing/gloo_rank.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::executor {
namespace {

using ::varipipe::testing::IsOk;

// t(n) = 50 us + n / (1 GB/s), exactly: the fit gives both back (the
// latency as the smallest message's time, 4 bytes later); a noisy small
// message slower than the large ones changes neither.
TEST(FitLink, RecoversLatencyAndBandwidth) {
  std::vector<TransferSample> samples;
  for (size_t bytes : TransferSizes(16 << 20)) {
    samples.push_back({static_cast<double>(bytes), 0.05 + static_cast<double>(bytes) / 1e6});
  }
  const auto [latency_us, gbps] = FitLink(samples);
  EXPECT_NEAR(latency_us, 50, 0.01);
  EXPECT_NEAR(gbps, 1.0, 1e-3);
  samples[1].ms = 10;  // a 16-byte message caught behind something else
  const auto [noisy_latency_us, noisy_gbps] = FitLink(samples);
  EXPECT_DOUBLE_EQ(noisy_latency_us, latency_us);
  EXPECT_DOUBLE_EQ(noisy_gbps, gbps);
}

class MeasureCommunicationTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
    ASSERT_THAT(redis, IsOk());
    redis_ = *std::move(redis);
  }
  std::unique_ptr<RedisServer> redis_;
};

TEST_P(MeasureCommunicationTest, EveryRankGetsEveryLink) {
  const int size = GetParam();
  std::vector<absl::StatusOr<v1::CommunicationCosts>> results(size, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<GlooTransport>> transport =
          ::varipipe::testing::ConnectGlooRank(*redis_, absl::StrCat("measure/", size), r, size);
      if (!transport.ok()) {
        results[r] = transport.status();
        return;
      }
      results[r] = MeasureCommunication(**transport, torch::kCPU, 256 << 10, 2);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < size; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r, " of ", size));
    ASSERT_THAT(results[r], IsOk());
    const v1::CommunicationCosts& c = *results[r];
    EXPECT_EQ(c.all_reduce_ranks(), static_cast<uint32_t>(size));
    EXPECT_EQ(c.collective_ranks(), static_cast<uint32_t>(size));
    for (const double v : {c.p2p_latency_us(), c.all_reduce_latency_us(),
                           c.all_gather_step_latency_us(), c.reduce_scatter_step_latency_us()}) {
      EXPECT_TRUE(std::isfinite(v) && v >= 0) << v;
    }
    for (const double v :
         {c.p2p_bandwidth_gbps(), c.all_reduce_bandwidth_gbps(), c.all_gather_step_bandwidth_gbps(),
          c.reduce_scatter_step_bandwidth_gbps()}) {
      EXPECT_TRUE(std::isfinite(v) && v > 0) << v;
    }
    // Every rank takes rank 0's point-to-point fit.
    EXPECT_EQ(c.p2p_bandwidth_gbps(), results[0]->p2p_bandwidth_gbps());
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, MeasureCommunicationTest, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("ranks", info.param);
                         });

}  // namespace
}  // namespace varipipe::executor
