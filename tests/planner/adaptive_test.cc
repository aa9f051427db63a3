#include "planner/schedule/adaptive.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/schedule/static_schedules.h"
#include "planner/sim/order_search.h"
#include "planner/sim/simulator.h"
#include "tests/testing/seed.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::planner {
namespace {

using ::varipipe::testing::IsOk;

// Per micro-batch time factors, the same on every stage; stored activation
// proportional to time (bigger micro-batches take longer and store more).
StageCostTable Costs(uint32_t stages, const std::vector<double>& factor) {
  StageCostTable costs(stages, std::vector<StageOpCost>(factor.size()));
  for (auto& stage : costs) {
    for (size_t m = 0; m < factor.size(); ++m) {
      stage[m] = {1.0 * factor[m], 2.0 * factor[m], 100 * factor[m], 130 * factor[m], 0, 0};
    }
  }
  return costs;
}

std::vector<uint32_t> Identity(uint32_t m) {
  std::vector<uint32_t> v(m);
  std::iota(v.begin(), v.end(), 0u);
  return v;
}

TEST(Adaptive, NeverExceedsTheMemoryLimit) {
  std::mt19937 rng(varipipe::testing::TestSeed("Adaptive.NeverExceedsTheMemoryLimit"));
  std::uniform_real_distribution<double> f(0.2, 3.0);
  for (int trial = 0; trial < 500; ++trial) {
    const uint32_t c = 1 + rng() % 8;
    const uint32_t m = 1 + rng() % 24;
    std::vector<double> factor(m);
    for (double& x : factor) x = f(rng);
    const StageCostTable costs = Costs(c, factor);
    // Between "one micro-batch fits" and "everything fits".
    const double largest = 130 * *std::max_element(factor.begin(), factor.end());
    const double limit = largest * (1 + (rng() % 100) / 10.0);
    const PipelineShape shape{c, 1, m};
    absl::StatusOr<DeviceOrder> order = AdaptiveSchedule(shape, costs, Identity(m), limit);
    ASSERT_THAT(order, IsOk());
    ASSERT_EQ(CheckScheduleCoverage(shape, *order), "");
    const SimulationResult r = Simulate(shape, *order, costs, ClusterNetwork{});
    ASSERT_TRUE(r.completed) << r.deadlock << "\n" << FormatDeviceOrder(*order);
    for (uint32_t d = 0; d < c; ++d) {
      EXPECT_LE(r.peak_bytes[d], limit + 1e-9) << "c=" << c << " m=" << m << " d=" << d;
    }
  }
}

TEST(Adaptive, TightMemoryStillCompletesOneMicroBatchAtATime) {
  const std::vector<double> factor(6, 1.0);
  const StageCostTable costs = Costs(4, factor);
  const PipelineShape shape{4, 1, 6};
  absl::StatusOr<DeviceOrder> order = AdaptiveSchedule(shape, costs, Identity(6), 130);
  ASSERT_THAT(order, IsOk());
  const SimulationResult r = Simulate(shape, *order, costs, ClusterNetwork{});
  ASSERT_TRUE(r.completed);
  for (uint32_t in_flight : r.peak_in_flight) EXPECT_EQ(in_flight, 1u);
}

// DynaPipe Fig. 7: per-micro-batch times perturbed by zero-mean Gaussian
// noise; with abundant memory the adaptive schedule's makespan grows less
// than 1F1B's. Means over many trials, 4/8/16 stages.
TEST(Adaptive, BeatsOneFOneBUnderTimeVariation) {
  std::mt19937 rng(varipipe::testing::TestSeed("Adaptive.BeatsOneFOneBUnderTimeVariation"));
  for (uint32_t c : {4u, 8u, 16u}) {
    const uint32_t m = 2 * c;
    for (double sigma : {0.0, 0.4, 0.8}) {
      double adaptive_sum = 0;
      double ofob_sum = 0;
      const int trials = 40;
      for (int t = 0; t < trials; ++t) {
        std::normal_distribution<double> noise(0, sigma);
        std::vector<double> factor(m);
        for (double& x : factor) x = std::max(0.05, 1 + noise(rng));
        const StageCostTable costs = Costs(c, factor);
        const PipelineShape shape{c, 1, m};
        const ClusterNetwork net{};
        const SimulationResult ofob = Simulate(shape, *OneFOneBSchedule(shape), costs, net);
        const SimulationResult adaptive =
            Simulate(shape, *AdaptiveSchedule(shape, costs, Identity(m), 1e18), costs, net);
        ASSERT_TRUE(ofob.completed && adaptive.completed);
        ofob_sum += ofob.makespan_ms;
        adaptive_sum += adaptive.makespan_ms;
      }
      std::printf("stages %2u sigma %.1f: mean makespan 1F1B %.2f, adaptive %.2f (%.3fx)\n", c,
                  sigma, ofob_sum / trials, adaptive_sum / trials, adaptive_sum / ofob_sum);
      if (sigma > 0) {
        EXPECT_LT(adaptive_sum, ofob_sum) << "stages " << c << " sigma " << sigma;
      } else {
        EXPECT_LE(adaptive_sum, ofob_sum * 1.0001);
      }
    }
  }
}

TEST(Clustering, GroupsByValueDeterministically) {
  const std::vector<double> v = {1, 1.1, 10, 10.5, 0.9, 30, 31, 9.8};
  const std::vector<int> labels = ClusterByValue(v, 3);
  EXPECT_EQ(labels, (std::vector<int>{0, 0, 1, 1, 0, 2, 2, 1}));
  EXPECT_EQ(ClusterByValue(v, 3), labels);
}

TEST(OrderSearch, PicksAFittingOrderNoSlowerThanTheGivenOne) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> f(0.2, 3.0);
  for (int trial = 0; trial < 50; ++trial) {
    const uint32_t c = 2 + rng() % 6;
    const uint32_t m = c + rng() % 20;
    std::vector<double> factor(m);
    for (double& x : factor) x = f(rng);
    const StageCostTable costs = Costs(c, factor);
    const double limit = 130 * 3.0 * (1 + rng() % 4);
    const PipelineShape shape{c, 1, m};
    absl::StatusOr<AdaptiveSearchResult> best =
        SearchAdaptiveOrder(shape, costs, factor, limit, ClusterNetwork{});
    ASSERT_THAT(best, IsOk());
    EXPECT_TRUE(best->fits_memory);
    EXPECT_GE(best->orders_tried, 2);
    const SimulationResult given = Simulate(
        shape, *AdaptiveSchedule(shape, costs, Identity(m), limit), costs, ClusterNetwork{});
    EXPECT_LE(best->simulation.makespan_ms, given.makespan_ms + 1e-9);
    std::vector<uint32_t> sorted = best->injection_order;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, Identity(m));
  }
}

}  // namespace
}  // namespace varipipe::planner
