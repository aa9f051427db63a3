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

// Transients independent of the stored activation (T5's recomputed
// attention scores: a long micro-batch's transient dwarfs a short one's) and
// a limit per device: the simulated peak stays within each device's limit
// whenever every micro-batch fits alone.
TEST(Adaptive, NeverExceedsPerDeviceLimitsWithUnevenTransients) {
  const uint64_t seed =
      varipipe::testing::TestSeed("Adaptive.NeverExceedsPerDeviceLimitsWithUnevenTransients");
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int trial = 0; trial < 500; ++trial) {
    const uint32_t c = 1 + rng() % 8;
    const uint32_t m = 1 + rng() % 24;
    StageCostTable costs(c, std::vector<StageOpCost>(m));
    std::vector<double> limits(c, 0);
    for (uint32_t d = 0; d < c; ++d) {
      for (uint32_t k = 0; k < m; ++k) {
        const double stored = 10 + 100 * u(rng);
        const double transient = rng() % 3 == 0 ? 300 * u(rng) : 10 * u(rng);
        costs[d][k] = {1 + u(rng), 2 + u(rng), stored, stored + transient, 0, 0};
        limits[d] = std::max(limits[d], stored + transient);
      }
      limits[d] *= 1 + 3 * u(rng);
    }
    const PipelineShape shape{c, 1, m};
    absl::StatusOr<DeviceOrder> order = AdaptiveSchedule(shape, costs, Identity(m), limits);
    ASSERT_THAT(order, IsOk());
    ASSERT_EQ(CheckScheduleCoverage(shape, *order), "");
    const SimulationResult r = Simulate(shape, *order, costs, ClusterNetwork{});
    ASSERT_TRUE(r.completed) << r.deadlock;
    for (uint32_t d = 0; d < c; ++d) {
      EXPECT_LE(r.peak_bytes[d], limits[d] * (1 + 1e-12))
          << "seed " << seed << " trial " << trial << " c=" << c << " m=" << m << " d=" << d;
    }
  }
}

// A micro-batch whose transient is large (the last one here) does not hold
// back micro-batches admitted before it: the two short ones run together,
// the long one alone, and the limit still holds.
TEST(Adaptive, ReservesOnlyTheTransientsOfHeldMicroBatches) {
  // Two devices, the same costs on each: stored 1 each, transients 0, 0
  // and 5; limit 6.
  StageCostTable costs(2, std::vector<StageOpCost>(3));
  for (std::vector<StageOpCost>& stage : costs) {
    stage[0] = {1, 2, 1, 1, 0, 0};
    stage[1] = {1, 2, 1, 1, 0, 0};
    stage[2] = {1, 2, 1, 6, 0, 0};
  }
  const PipelineShape shape{2, 1, 3};
  absl::StatusOr<DeviceOrder> order = AdaptiveSchedule(shape, costs, Identity(3), 6.0);
  ASSERT_THAT(order, IsOk());
  const SimulationResult r = Simulate(shape, *order, costs, ClusterNetwork{});
  ASSERT_TRUE(r.completed);
  EXPECT_EQ(r.peak_in_flight[0], 2u) << FormatDeviceOrder(*order);
  for (double peak : r.peak_bytes) EXPECT_LE(peak, 6.0);
  // On device 0 the long one is admitted only once nothing else is held
  // (1 + 1 + 5 > 6).
  const std::vector<Op>& ops = (*order)[0];
  const auto position = [&](OpKind kind, uint32_t mb) {
    return std::find_if(ops.begin(), ops.end(),
                        [&](const Op& op) { return op.kind == kind && op.micro_batch == mb; }) -
           ops.begin();
  };
  EXPECT_LT(position(OpKind::kForward, 1), position(OpKind::kBackward, 0));
  EXPECT_GT(position(OpKind::kForward, 2), position(OpKind::kBackward, 1));
  EXPECT_GT(position(OpKind::kForward, 2), position(OpKind::kBackward, 0));
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
