#include "planner/microbatch/sample_order.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/seed.h"

namespace varipipe::planner {
namespace {

using ::testing::ElementsAre;

TEST(SampleOrder, DecoderOnlySortsBySequenceLength) {
  const std::vector<SampleLengths> s = {{10, 5}, {30, 1}, {14, 1}, {2, 2}};
  EXPECT_THAT(OrderSamples(s, {.encoder_decoder = false}, SampleOrder::kLengthSort),
              ElementsAre(1, 0, 2, 3));
  // The 2-D tour falls back to sorting for decoder-only models.
  EXPECT_THAT(OrderSamples(s, {.encoder_decoder = false}, SampleOrder::kTwoDTour),
              ElementsAre(1, 0, 2, 3));
}

TEST(SampleOrder, EncoderDecoderSortsLexicographically) {
  const std::vector<SampleLengths> s = {{10, 5}, {30, 1}, {10, 9}, {2, 2}, {10, 5}};
  EXPECT_THAT(OrderSamples(s, {.encoder_decoder = true}, SampleOrder::kLengthSort),
              ElementsAre(1, 2, 0, 4, 3));
}

std::vector<SampleLengths> Clustered(std::mt19937& rng, int n) {
  // Inputs and targets that are not correlated: lexicographic order jumps
  // between short and long targets.
  std::vector<SampleLengths> s;
  for (int i = 0; i < n; ++i) {
    s.push_back({static_cast<uint32_t>(50 + rng() % 1000),
                 static_cast<uint32_t>(rng() % 2 ? 5 + rng() % 10 : 400 + rng() % 100)});
  }
  return s;
}

TEST(SampleOrder, TwoDTourIsADeterministicPermutationAndShorter) {
  std::mt19937 rng(12345);  // fixed: the path-length comparison is data-dependent
  const std::vector<SampleLengths> s = Clustered(rng, 300);
  const LengthPolicy policy{.encoder_decoder = true};
  const std::vector<uint32_t> tour = OrderSamples(s, policy, SampleOrder::kTwoDTour);
  std::vector<uint32_t> sorted = tour;
  std::sort(sorted.begin(), sorted.end());
  std::vector<uint32_t> all(s.size());
  std::iota(all.begin(), all.end(), 0u);
  EXPECT_EQ(sorted, all);
  EXPECT_EQ(tour, OrderSamples(s, policy, SampleOrder::kTwoDTour));
  const std::vector<uint32_t> lexicographic = OrderSamples(s, policy, SampleOrder::kLengthSort);
  EXPECT_LT(OrderPathLength(s, tour), OrderPathLength(s, lexicographic) / 2)
      << "tour " << OrderPathLength(s, tour) << " vs sort " << OrderPathLength(s, lexicographic);
}

TEST(SampleOrder, RandomInputsGivePermutations) {
  std::mt19937 rng(varipipe::testing::TestSeed("SampleOrder.RandomInputsGivePermutations"));
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<SampleLengths> s(1 + rng() % 100);
    for (SampleLengths& x : s)
      x = {static_cast<uint32_t>(1 + rng() % 3000), static_cast<uint32_t>(1 + rng() % 300)};
    std::vector<uint32_t> tour = OrderSamples(s, {.encoder_decoder = true}, SampleOrder::kTwoDTour);
    std::sort(tour.begin(), tour.end());
    for (uint32_t i = 0; i < s.size(); ++i) ASSERT_EQ(tour[i], i);
  }
}

}  // namespace
}  // namespace varipipe::planner
