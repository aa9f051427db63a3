#include "planner/microbatch/baselines.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/microbatch/padding_stats.h"
#include "tests/testing/seed.h"

namespace varipipe::planner {
namespace {

using ::testing::ElementsAre;

const LengthPolicy kGpt{.encoder_decoder = false, .multiple = 1};
const LengthPolicy kT5{.encoder_decoder = true, .multiple = 1};

TEST(Baselines, PaddingKeepsTheOriginalOrder) {
  const std::vector<SampleLengths> samples = {{10, 0}, {30, 0}, {20, 0}, {5, 0}, {40, 0}};
  const auto groups = PartitionPadding(samples, kGpt, 2);
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_THAT(groups[0].samples, ElementsAre(0, 1));
  EXPECT_EQ(groups[0].input_len, 30u);
  EXPECT_THAT(groups[1].samples, ElementsAre(2, 3));
  EXPECT_EQ(groups[1].input_len, 20u);
  EXPECT_THAT(groups[2].samples, ElementsAre(4));
  EXPECT_EQ(groups[2].input_len, 40u);
  // Real 105 tokens; computed 2*30 + 2*20 + 1*40 = 140.
  const PaddingStats stats = ComputePaddingStats(samples, groups, kGpt);
  EXPECT_EQ(stats.real_input_tokens, 105u);
  EXPECT_EQ(stats.computed_input_tokens, 140u);
  EXPECT_DOUBLE_EQ(stats.Efficiency(), 105.0 / 140.0);
}

TEST(Baselines, FixedSizeSortsByLength) {
  const std::vector<SampleLengths> samples = {{10, 0}, {30, 0}, {20, 0}, {5, 0}, {40, 0}};
  const auto groups = PartitionFixedSize(samples, kGpt, 2);
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_THAT(groups[0].samples, ElementsAre(4, 1));
  EXPECT_THAT(groups[1].samples, ElementsAre(2, 0));
  EXPECT_THAT(groups[2].samples, ElementsAre(3));
  // Computed 2*40 + 2*20 + 5 = 125.
  EXPECT_EQ(ComputePaddingStats(samples, groups, kGpt).computed_input_tokens, 125u);
}

TEST(Baselines, DecoderOnlySequenceIsInputPlusTarget) {
  const std::vector<SampleLengths> samples = {{10, 3}, {7, 1}};
  const LengthPolicy policy{.encoder_decoder = false, .multiple = 8};
  const auto groups = PartitionFixedSize(samples, policy, 4);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].input_len, 16u);  // 13 rounded up to 16
  EXPECT_EQ(groups[0].target_len, 0u);
  const PaddingStats stats = ComputePaddingStats(samples, groups, policy);
  EXPECT_EQ(stats.real_input_tokens, 21u);
  EXPECT_EQ(stats.computed_input_tokens, 32u);
  EXPECT_EQ(stats.real_target_tokens, 0u);
}

TEST(Baselines, EncoderDecoderPadsSidesSeparately) {
  const std::vector<SampleLengths> samples = {{100, 4}, {50, 20}, {60, 2}};
  const auto groups = PartitionFixedSize(samples, kT5, 3);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].input_len, 100u);
  EXPECT_EQ(groups[0].target_len, 20u);
  const PaddingStats stats = ComputePaddingStats(samples, groups, kT5);
  EXPECT_DOUBLE_EQ(stats.InputEfficiency(), 210.0 / 300.0);
  EXPECT_DOUBLE_EQ(stats.TargetEfficiency(), 26.0 / 60.0);
  EXPECT_DOUBLE_EQ(stats.Efficiency(), 236.0 / 360.0);
}

TEST(Baselines, TokenBasedRespectsTheBudget) {
  // Sorted: 40, 30, 20, 10, 5 with budget 64: [40] (adding 30 costs 2*40 = 80),
  // [30, 20] (2*30 = 60; adding 10 costs 3*30 = 90), [10, 5].
  const std::vector<SampleLengths> samples = {{10, 0}, {30, 0}, {20, 0}, {5, 0}, {40, 0}};
  const auto groups = PartitionTokenBased(samples, kGpt, 64);
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_THAT(groups[0].samples, ElementsAre(4));
  EXPECT_THAT(groups[1].samples, ElementsAre(1, 2));
  EXPECT_THAT(groups[2].samples, ElementsAre(0, 3));
}

TEST(Baselines, TokenBasedGivesAnOversizedSampleItsOwnMicroBatch) {
  const std::vector<SampleLengths> samples = {{500, 0}, {10, 0}, {10, 0}};
  const auto groups = PartitionTokenBased(samples, kGpt, 100);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_THAT(groups[0].samples, ElementsAre(0));
  EXPECT_THAT(groups[1].samples, ElementsAre(1, 2));
}

TEST(Baselines, PackingFillsSequencesFirstFitDecreasing) {
  // Max length 100: sorted 60, 50, 40, 30, 20 -> bins [60, 40], [50, 30, 20].
  const std::vector<SampleLengths> samples = {{40, 0}, {60, 0}, {20, 0}, {50, 0}, {30, 0}};
  const LengthPolicy policy{.encoder_decoder = false, .multiple = 8};
  const auto groups = PartitionPacking(samples, policy, 100, 0, 1);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_THAT(groups[0].samples, ElementsAre(1, 0));
  EXPECT_THAT(groups[1].samples, ElementsAre(3, 4, 2));
  EXPECT_EQ(groups[0].size(), 1u);       // one packed row
  EXPECT_EQ(groups[0].input_len, 104u);  // the maximum length, rounded
  // Two sequences per micro-batch: one micro-batch of two rows.
  const auto pairs = PartitionPacking(samples, policy, 100, 0, 2);
  ASSERT_EQ(pairs.size(), 1u);
  EXPECT_EQ(pairs[0].size(), 2u);
  EXPECT_THAT(pairs[0].row_starts, ElementsAre(0, 2));
  // Real 200 tokens over 2 rows x 104.
  EXPECT_DOUBLE_EQ(ComputePaddingStats(samples, pairs, policy).Efficiency(), 200.0 / 208.0);
}

TEST(Baselines, PackingEncoderDecoderRespectsBothMaxima) {
  // Targets limit the packing: max target 10.
  const std::vector<SampleLengths> samples = {{30, 6}, {20, 6}, {10, 3}};
  const LengthPolicy policy{.encoder_decoder = true, .multiple = 1};
  const auto groups = PartitionPacking(samples, policy, 100, 10, 8);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_THAT(groups[0].row_starts, ElementsAre(0, 2));  // [30+10], [20]
  EXPECT_THAT(groups[0].samples, ElementsAre(0, 2, 1));
  const PaddingStats stats = ComputePaddingStats(samples, groups, policy);
  EXPECT_DOUBLE_EQ(stats.InputEfficiency(), 60.0 / 200.0);
  EXPECT_DOUBLE_EQ(stats.TargetEfficiency(), 15.0 / 20.0);
}

// Invariants over random inputs: every sample exactly once, groups non-empty,
// padded lengths are the rounded maxima, token-based groups within budget
// unless they hold a single sample.
TEST(Baselines, RandomizedInvariants) {
  const uint32_t seed = varipipe::testing::TestSeed("Baselines.RandomizedInvariants");
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 500; ++trial) {
    const bool t5 = trial % 2 == 1;
    const LengthPolicy policy{.encoder_decoder = t5,
                              .multiple = static_cast<uint32_t>(1 + rng() % 16)};
    std::vector<SampleLengths> samples(1 + rng() % 200);
    for (SampleLengths& s : samples) {
      s = {static_cast<uint32_t>(1 + rng() % 2048), static_cast<uint32_t>(1 + rng() % 256)};
    }
    const uint32_t size = 1 + rng() % 16;
    const uint64_t budget = 1 + rng() % 20000;
    for (const auto& groups :
         {PartitionPadding(samples, policy, size), PartitionFixedSize(samples, policy, size),
          PartitionTokenBased(samples, policy, budget)}) {
      std::vector<int> seen(samples.size(), 0);
      for (const MicroBatchGroup& group : groups) {
        ASSERT_FALSE(group.samples.empty());
        uint32_t longest = 0;
        uint32_t longest_target = 0;
        for (uint32_t index : group.samples) {
          ASSERT_LT(index, samples.size());
          ++seen[index];
          longest = std::max(longest, SequenceLength(samples[index], policy));
          longest_target = std::max(longest_target, samples[index].target);
        }
        EXPECT_EQ(group.input_len, RoundUpLength(longest, policy.multiple));
        EXPECT_EQ(group.target_len, t5 ? RoundUpLength(longest_target, policy.multiple) : 0u);
      }
      EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
    }
    for (const MicroBatchGroup& group : PartitionTokenBased(samples, policy, budget)) {
      if (group.size() > 1) {
        EXPECT_LE(group.ComputedTokens(), budget);
      }
    }
  }
}

}  // namespace
}  // namespace varipipe::planner
