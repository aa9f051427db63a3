#include "common/dataset/synthetic_mixture.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace varipipe {
namespace {

TEST(SyntheticMixture, SameSeedSameSamplesInAnyOrder) {
  const SyntheticMixture a = SyntheticMixture::Flan(7);
  const SyntheticMixture b = SyntheticMixture::Flan(7);
  for (uint64_t i = 0; i < 1000; ++i) EXPECT_EQ(a.Sample(i), b.Sample(i)) << "sample " << i;
  // Order of calls does not matter: samples are pure functions of the index.
  for (uint64_t i = 1000; i-- > 0;) EXPECT_EQ(a.Sample(i), b.Sample(i)) << "sample " << i;
}

TEST(SyntheticMixture, DifferentSeedsDiffer) {
  const SyntheticMixture a = SyntheticMixture::Flan(1);
  const SyntheticMixture b = SyntheticMixture::Flan(2);
  int same = 0;
  for (uint64_t i = 0; i < 1000; ++i) same += a.Sample(i) == b.Sample(i);
  EXPECT_LT(same, 100);
}

// The default mixture's shape: task frequencies follow the weights, most
// inputs are short with a heavy tail, and targets are mostly short.
TEST(SyntheticMixture, FlanShapeMatchesItsDocumentation) {
  const SyntheticMixture mixture = SyntheticMixture::Flan(1234);
  constexpr int kSamples = 200000;
  std::vector<int> per_task(mixture.tasks().size(), 0);
  std::vector<uint32_t> inputs;
  std::vector<uint32_t> targets;
  for (uint64_t i = 0; i < kSamples; ++i) {
    ++per_task[mixture.TaskOf(i)];
    const SampleLengths s = mixture.Sample(i);
    ASSERT_GE(s.input, 1u);
    ASSERT_GE(s.target, 1u);
    inputs.push_back(s.input);
    targets.push_back(s.target);
  }
  for (size_t t = 0; t < per_task.size(); ++t) {
    const double frequency = static_cast<double>(per_task[t]) / kSamples;
    EXPECT_NEAR(frequency, mixture.tasks()[t].weight, 0.01) << mixture.tasks()[t].name;
  }
  std::sort(inputs.begin(), inputs.end());
  std::sort(targets.begin(), targets.end());
  const auto quantile = [](const std::vector<uint32_t>& v, double q) {
    return v[static_cast<size_t>(q * (v.size() - 1))];
  };
  EXPECT_GT(quantile(inputs, 0.5), 50u);
  EXPECT_LT(quantile(inputs, 0.5), 300u);
  EXPECT_GT(quantile(inputs, 0.99), 2000u);  // heavy tail
  EXPECT_LT(quantile(targets, 0.5), 30u);
}

// The long-tail mixture (docs/datasets.md, "Long-tail mixture"): sequences
// (input + target, as decoder-only models train) with a median under 2,048
// tokens and a tail to 64k.
TEST(SyntheticMixture, LongTailHasAShortMedianAndATailTo64k) {
  const SyntheticMixture mixture = SyntheticMixture::Named("long_tail", 99);
  ASSERT_EQ(mixture.tasks().size(), 4u);
  constexpr int kSamples = 200000;
  std::vector<uint32_t> sequences;
  for (uint64_t i = 0; i < kSamples; ++i) {
    const SampleLengths s = mixture.Sample(i);
    ASSERT_GE(s.input, 1u);
    ASSERT_GE(s.target, 1u);
    sequences.push_back(s.input + s.target);
  }
  std::sort(sequences.begin(), sequences.end());
  const auto fraction_above = [&](uint32_t n) {
    return static_cast<double>(sequences.end() -
                               std::upper_bound(sequences.begin(), sequences.end(), n)) /
           kSamples;
  };
  const uint32_t median = sequences[kSamples / 2];
  EXPECT_GT(median, 1000u);
  EXPECT_LT(median, 2048u);
  EXPECT_NEAR(fraction_above(8192), 0.11, 0.02);
  EXPECT_NEAR(fraction_above(16384), 0.045, 0.01);
  EXPECT_NEAR(fraction_above(32768), 0.015, 0.005);
  // The tail reaches 64k: a few samples in a thousand are cut there.
  EXPECT_GT(fraction_above(65536), 0.0003);
  EXPECT_LT(fraction_above(65536), 0.003);
}

TEST(SyntheticMixture, CustomTaskWithZeroSigmaIsConstant) {
  const SyntheticMixture mixture({{"fixed", 1.0, 100, 0.0, 10, 0.0}}, 3);
  for (uint64_t i = 0; i < 100; ++i) EXPECT_EQ(mixture.Sample(i), (SampleLengths{100, 10}));
}

}  // namespace
}  // namespace varipipe
