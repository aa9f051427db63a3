#include "planner/microbatch/dp_balance.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/seed.h"

namespace varipipe::planner {
namespace {

double BruteForceMakespan(const std::vector<double>& times, uint32_t k) {
  const size_t n = times.size();
  std::vector<uint32_t> assign(n, 0);
  double best = 1e300;
  while (true) {
    std::vector<double> sums(k, 0);
    for (size_t i = 0; i < n; ++i) sums[assign[i]] += times[i];
    best = std::min(best, *std::max_element(sums.begin(), sums.end()));
    size_t i = 0;
    while (i < n && ++assign[i] == k) assign[i++] = 0;
    if (i == n) break;
  }
  return best;
}

void ExpectPartition(const ReplicaAssignment& a, size_t n, uint32_t k) {
  ASSERT_EQ(a.replicas.size(), k);
  std::vector<int> seen(n, 0);
  for (const auto& r : a.replicas) {
    for (uint32_t i : r) ++seen[i];
  }
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
}

TEST(Balance, TextbookExample) {
  // {8, 7, 6, 5, 4} into 2: KK gives {8,6} vs {7,5,4}... optimum 15 / 15.
  const std::vector<double> times = {8, 7, 6, 5, 4};
  const ReplicaAssignment a = BalanceReplicas(times, 2);
  ExpectPartition(a, times.size(), 2);
  EXPECT_LE(a.makespan, 16);
  EXPECT_DOUBLE_EQ(BruteForceMakespan(times, 2), 15);
}

TEST(Balance, MoreReplicasThanItems) {
  const std::vector<double> times = {3, 1};
  const ReplicaAssignment a = BalanceReplicas(times, 4);
  ExpectPartition(a, 2, 4);
  EXPECT_DOUBLE_EQ(a.makespan, 3);
  EXPECT_TRUE(a.replicas[2].empty());
}

// Never worse than greedy largest-first; the gap to the optimum is measured
// and printed (docs/benchmarks.md quotes it).
TEST(Balance, NeverWorseThanGreedyAndCloseToOptimal) {
  std::mt19937 rng(varipipe::testing::TestSeed("Balance.NeverWorseThanGreedyAndCloseToOptimal"));
  int cases = 0;
  int exact = 0;
  int kk_exact = 0;
  double worst = 1;
  for (int trial = 0; trial < 3000; ++trial) {
    const uint32_t k = 2 + rng() % 3;
    const size_t n = 2 + rng() % (k == 2 ? 12 : k == 3 ? 8 : 6);
    std::vector<double> times(n);
    for (double& t : times) t = 1 + (rng() % 100000) / 100.0;
    const ReplicaAssignment best = BalanceReplicas(times, k);
    const ReplicaAssignment greedy = GreedyLargestFirst(times, k);
    const ReplicaAssignment kk = KarmarkarKarp(times, k);
    ExpectPartition(best, n, k);
    ExpectPartition(kk, n, k);
    EXPECT_LE(best.makespan, greedy.makespan);
    EXPECT_LE(best.makespan, kk.makespan);
    const double optimum = BruteForceMakespan(times, k);
    EXPECT_GE(best.makespan, optimum - 1e-9);
    // Graham's bound for LPT is 4/3 - 1/(3k); the best of both stays within it.
    EXPECT_LE(best.makespan, optimum * (4.0 / 3 - 1.0 / (3 * k)) + 1e-9);
    ++cases;
    exact += best.makespan <= optimum + 1e-9;
    kk_exact += kk.makespan <= optimum + 1e-9;
    worst = std::max(worst, best.makespan / optimum);
  }
  std::printf(
      "balance vs brute force: %d cases, exact %.1f%% (KK alone %.1f%%), worst ratio %.4f\n", cases,
      100.0 * exact / cases, 100.0 * kk_exact / cases, worst);
}

TEST(Balance, Deterministic) {
  const std::vector<double> times = {5, 5, 5, 3, 3, 2, 2, 2, 1};
  const ReplicaAssignment a = BalanceReplicas(times, 3);
  const ReplicaAssignment b = BalanceReplicas(times, 3);
  EXPECT_EQ(a.replicas, b.replicas);
}

}  // namespace
}  // namespace varipipe::planner
