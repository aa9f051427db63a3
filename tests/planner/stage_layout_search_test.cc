#include "planner/layout/stage_layout_search.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "common/config/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/bench/synthetic_batches.h"
#include "tests/testing/paper_models.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::planner {
namespace {

using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;

double Busiest(const std::vector<uint32_t>& split, double layer_ms,
               const std::vector<double>& extra) {
  double most = 0;
  for (size_t s = 0; s < split.size(); ++s) most = std::max(most, split[s] * layer_ms + extra[s]);
  return most;
}

// The least busiest-stage work over every split, by enumeration.
double BruteForce(uint32_t layers, double layer_ms, const std::vector<double>& extra) {
  double best = std::numeric_limits<double>::infinity();
  std::vector<uint32_t> split(extra.size());
  std::function<void(size_t, uint32_t)> walk = [&](size_t s, uint32_t left) {
    if (s + 1 == split.size()) {
      split[s] = left;
      best = std::min(best, Busiest(split, layer_ms, extra));
      return;
    }
    for (uint32_t n = 1; n + (split.size() - s - 1) <= left; ++n) {
      split[s] = n;
      walk(s + 1, left - n);
    }
  };
  walk(0, layers);
  return best;
}

TEST(BalancedSplitTest, MatchesBruteForce) {
  const uint32_t seed = std::random_device()();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 300; ++trial) {
    const uint32_t stages = 1 + rng() % 5;
    const uint32_t layers = stages + rng() % 10;
    const double layer_ms = 0.5 + std::uniform_real_distribution<double>(0, 2)(rng);
    std::vector<double> extra(stages);
    for (double& e : extra)
      e = rng() % 3 == 0 ? std::uniform_real_distribution<double>(0, 4)(rng) : 0;
    const std::vector<uint32_t> split = BalancedSplit(layers, layer_ms, extra);
    ASSERT_EQ(split.size(), stages);
    uint32_t total = 0;
    for (uint32_t n : split) {
      EXPECT_GE(n, 1u);
      total += n;
    }
    EXPECT_EQ(total, layers) << "seed " << seed << " trial " << trial;
    EXPECT_NEAR(Busiest(split, layer_ms, extra), BruteForce(layers, layer_ms, extra), 1e-9)
        << "seed " << seed << " trial " << trial;
  }
}

TEST(BalancedSplitTest, WithoutExtrasItIsTheEvenSplit) {
  const double none[4] = {0, 0, 0, 0};
  EXPECT_EQ(BalancedSplit(30, 1.0, none), (std::vector<uint32_t>{8, 8, 7, 7}));
  // The LM head's stage takes fewer layers.
  const double head[4] = {0, 0, 0, 2.5};
  EXPECT_EQ(BalancedSplit(32, 1.0, head), (std::vector<uint32_t>{9, 9, 8, 6}));
}

// The zero-bubble benchmark's jobs (testing::PaperBenchmarkJob) with an
// AUTO layout; T5 with both adaptive schedules.
v1::JobConfig PaperJob(bool t5) {
  v1::JobConfig c = t5 ? testing::PaperBenchmarkJob(true, {v1::ADAPTIVE, v1::ADAPTIVE_ZERO_BUBBLE})
                       : testing::PaperBenchmarkJob(false, {v1::ADAPTIVE});
  c.mutable_parallelism()->mutable_stage_layout()->set_mode(v1::AUTO);
  return c;
}

double MeanIteration(const Planner& planner, const std::vector<MiniBatch>& batches) {
  double total = 0;
  for (const MiniBatch& mb : batches) {
    absl::StatusOr<PlanningResult> r = planner.Plan(mb);
    EXPECT_THAT(r, IsOk());
    if (r.ok()) total += r->report.predicted_iteration_ms;
  }
  return total / static_cast<double>(batches.size());
}

// T5-11B at pp = 8 on FLAN-like data (adaptive and adaptive zero-bubble
// schedules): the even split gives the encoder half the devices although it
// does most of the work; the chosen layout must be at least 15% faster on
// held-out mini-batches, and the same every time. (At most 5 of the 8
// devices can hold encoder layers: 24 decoder layers on 2 devices would
// need 48.6 GiB of model state on each, over the 40 GiB limit.)
TEST(ChooseStageLayoutTest, RebalancesT5) {
  const v1::JobConfig config = PaperJob(true);
  absl::StatusOr<Planner> planner = Planner::Create(config);
  ASSERT_THAT(planner, IsOk());
  const std::vector<MiniBatch> batches = SyntheticBatches(config, false, 12);
  const std::vector<MiniBatch> sample(batches.begin(), batches.begin() + kLayoutSampleMiniBatches);
  const std::vector<MiniBatch> held_out(batches.begin() + kLayoutSampleMiniBatches, batches.end());
  EXPECT_THAT(planner->Plan(sample.front()).status().message(), HasSubstr("AUTO"));
  absl::StatusOr<LayoutChoice> choice = ChooseStageLayout(*planner, sample);
  ASSERT_THAT(choice, IsOk());
  std::printf("%s\n", choice->Describe().c_str());
  EXPECT_EQ(choice->even.ToString(), "encoder 6+6+6+6 | decoder 6+6+6+6");
  EXPECT_FALSE(choice->chosen == choice->even);
  EXPECT_LE(choice->chosen_mean_ms, choice->even_mean_ms);
  EXPECT_EQ(choice->candidates.front().origin, "even split");
  const double even = MeanIteration(planner->WithStageLayout(choice->even), held_out);
  const double chosen = MeanIteration(planner->WithStageLayout(choice->chosen), held_out);
  std::printf("held-out mean: even %.1f ms, chosen %.1f ms (%.3fx)\n", even, chosen, chosen / even);
  EXPECT_LE(chosen, 0.85 * even);
  absl::StatusOr<LayoutChoice> again = ChooseStageLayout(*planner, sample);
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->chosen, choice->chosen);
  // Plans record the layout they were made for.
  absl::StatusOr<PlanningResult> r = planner->WithStageLayout(choice->chosen).Plan(sample[0]);
  ASSERT_THAT(r, IsOk());
  const v1::StageLayoutConfig recorded = LayerLayoutToConfig(choice->chosen);
  EXPECT_TRUE(std::equal(r->plans[0].stage_layers().begin(), r->plans[0].stage_layers().end(),
                         recorded.layers().begin(), recorded.layers().end()));
  EXPECT_EQ(r->plans[0].encoder_stages(), recorded.encoder_stages());
}

// GPT-6.7B at pp = 4: the LM head's device may shed a layer; never slower
// than the even split on the sample.
TEST(ChooseStageLayoutTest, NeverWorseThanEvenForGpt) {
  const v1::JobConfig config = PaperJob(false);
  absl::StatusOr<Planner> planner = Planner::Create(config);
  ASSERT_THAT(planner, IsOk());
  const std::vector<MiniBatch> sample = SyntheticBatches(config, true, kLayoutSampleMiniBatches);
  absl::StatusOr<LayoutChoice> choice = ChooseStageLayout(*planner, sample);
  ASSERT_THAT(choice, IsOk());
  std::printf("%s\n", choice->Describe().c_str());
  EXPECT_LE(choice->chosen_mean_ms, choice->even_mean_ms);
  EXPECT_GE(choice->candidates.size(), 2u);
}

// A listed layout one of whose stages cannot hold its own model state is
// refused when the planner is made, naming the layout and the device.
TEST(ListedStageLayoutTest, AStageThatCannotHoldItsModelStateIsNamed) {
  v1::JobConfig config = PaperJob(false);
  v1::StageLayoutConfig& layout = *config.mutable_parallelism()->mutable_stage_layout();
  layout.set_mode(v1::LISTED);
  for (uint32_t layers : {20u, 4u, 4u, 4u}) layout.add_layers(layers);
  EXPECT_THAT(Planner::Create(config).status().message(),
              HasSubstr("parallelism.stage_layout 20+4+4+4: model state alone needs"));
  EXPECT_THAT(Planner::Create(config).status().message(), HasSubstr("on pipeline device 0"));
  layout.clear_layers();
  for (uint32_t layers : {9u, 9u, 8u, 6u}) layout.add_layers(layers);
  EXPECT_THAT(Planner::Create(config), IsOk());
}

}  // namespace
}  // namespace varipipe::planner
