// The default search (planner.h, issue "the best plan by default"): every
// partition method with its setting tuned per mini-batch, every schedule.
// Invariants over random jobs and mini-batches: the makespan lower bound is
// a lower bound, pruning by it never changes the plan, the plan is never
// behind any single method or fixed setting, and the per-method summary
// names the plan and explains the rest.
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config/job_config.h"
#include "common/dataset/synthetic_mixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/method_summary.h"
#include "planner/microbatch/baseline_settings.h"
#include "planner/plan/plan_builder.h"
#include "planner/planner.h"
#include "tests/testing/search_job.h"
#include "tests/testing/seed.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::planner {
namespace {

using ::testing::ElementsAre;
using ::varipipe::testing::IsOk;

using Job = ::varipipe::testing::SearchJob;
using ::varipipe::testing::PlanBytes;

v1::JobConfig Config(const Job& job) { return varipipe::testing::SearchJobConfig(job); }

MiniBatch Draw(const SyntheticMixture& mixture, uint64_t* cursor, uint64_t tokens_budget,
               uint64_t iteration) {
  return varipipe::testing::DrawMiniBatch(mixture, cursor, tokens_budget, iteration,
                                          /*max_target=*/256);
}

std::string Name(const CandidateReport& c) {
  return absl::StrCat(c.partition_method, " ", c.setting, "/", c.schedule, "/", c.recompute);
}

TEST(DefaultSearch, ConfigDefaultsSearchEverything) {
  const v1::JobConfig config = Config({});
  EXPECT_THAT(config.planner().partition_methods(),
              ElementsAre(v1::DYNAMIC_PROGRAMMING, v1::PACKING, v1::TOKEN_BASED, v1::FIXED_SIZE,
                          v1::PADDING));
  EXPECT_THAT(config.planner().schedules(),
              ElementsAre(v1::ADAPTIVE, v1::ONE_F_ONE_B, v1::ADAPTIVE_ZERO_BUBBLE,
                          v1::ZERO_BUBBLE_H1, v1::KFKB, v1::GPIPE));
  EXPECT_EQ(config.planner().fixed_micro_batch_size(), 0u);
  EXPECT_EQ(config.planner().micro_batch_token_budget(), 0u);
  // Tuned settings: the ladders; a configured setting: only it.
  EXPECT_EQ(BaselineSettings(config, PartitionMethod::kPacking).size(), std::size(kRowLadder));
  EXPECT_EQ(BaselineSettings(config, PartitionMethod::kTokenBased).back().token_budget, 32u * 1024);
  // The DP over the samples and over rows packed up to the maximum length.
  const std::vector<BaselineSetting> dp =
      BaselineSettings(config, PartitionMethod::kDynamicProgramming);
  ASSERT_EQ(dp.size(), 2u);
  EXPECT_EQ(dp[0].packed_row_tokens, 0u);
  EXPECT_EQ(dp[1].packed_row_tokens, 1024u);
  EXPECT_EQ(dp[1].Describe(), "packed<=1024");
  EXPECT_TRUE(config.planner().dp_packed_rows());
  const v1::JobConfig unpacked = Config({.planner_extra = R"(, "dp_packed_rows": false)"});
  EXPECT_EQ(BaselineSettings(unpacked, PartitionMethod::kDynamicProgramming).size(), 1u);
  const v1::JobConfig fixed = Config(
      {.planner_extra = R"(, "fixed_micro_batch_size": 3, "micro_batch_token_budget": 777)"});
  ASSERT_EQ(BaselineSettings(fixed, PartitionMethod::kPadding).size(), 1u);
  EXPECT_EQ(BaselineSettings(fixed, PartitionMethod::kPadding)[0].rows, 3u);
  EXPECT_EQ(BaselineSettings(fixed, PartitionMethod::kTokenBased)[0].Describe(), "tokens=777");
  // Listing narrows the search.
  const v1::JobConfig listed = Config({.planner_extra = R"(, "schedules": ["GPIPE"])"});
  EXPECT_THAT(listed.planner().schedules(), ElementsAre(v1::GPIPE));
}

// Over random jobs and mini-batches: every candidate that fits has a
// makespan of at least its bound; with pruning, the plan is byte-identical to the one
// found with every candidate simulated, and every pruned candidate is indeed
// slower than the plan.
TEST(DefaultSearch, BoundIsALowerBoundAndPruningNeverChangesThePlan) {
  const uint32_t seed =
      varipipe::testing::TestSeed("DefaultSearch.BoundIsALowerBoundAndPruningNeverChangesThePlan");
  std::mt19937 rng(seed);
  int pruned = 0;
  int simulated = 0;
  for (const Job& job : {Job{.pp = 2}, Job{.pp = 4, .dp = 2, .tokens = 16384},
                         Job{.t5 = true, .pp = 2, .memory_mib = 3072},
                         Job{.t5 = true, .pp = 4, .dp = 2, .tokens = 12288}}) {
    absl::StatusOr<Planner> pruning = Planner::Create(Config(job));
    ASSERT_THAT(pruning, IsOk());
    Planner everything = *pruning;
    everything.set_options({.prune_by_bound = false});
    const SyntheticMixture mixture =
        rng() % 2 ? SyntheticMixture::Documents(rng()) : SyntheticMixture::Flan(rng());
    uint64_t cursor = 0;
    for (int iteration = 0; iteration < 3; ++iteration) {
      const MiniBatch mb = Draw(mixture, &cursor, job.tokens, iteration);
      absl::StatusOr<PlanningResult> a = pruning->Plan(mb);
      absl::StatusOr<PlanningResult> b = everything.Plan(mb);
      ASSERT_EQ(a.ok(), b.ok()) << a.status() << " / " << b.status();
      if (!a.ok()) continue;
      EXPECT_EQ(PlanBytes(*a), PlanBytes(*b)) << (job.t5 ? "T5" : "GPT") << " pp" << job.pp << " dp"
                                              << job.dp << " iteration " << iteration;
      const std::vector<CandidateReport>& ac = a->report.candidates;
      const std::vector<CandidateReport>& bc = b->report.candidates;
      ASSERT_EQ(ac.size(), bc.size());
      for (size_t k = 0; k < bc.size(); ++k) {
        ASSERT_EQ(Name(ac[k]), Name(bc[k]));
        // The memory part of the bound holds for plans that fit.
        if (bc[k].feasible) {
          ++simulated;
          EXPECT_GE(bc[k].makespan_ms, bc[k].makespan_bound_ms * (1 - 1e-9)) << Name(bc[k]);
        }
        if (ac[k].rejected_at == "bound") {
          ++pruned;
          // Pruned only when clearly slower, so that ties are simulated.
          EXPECT_GT(ac[k].makespan_bound_ms, a->report.predicted_makespan_ms * (1 + 1e-9))
              << Name(ac[k]);
          if (bc[k].feasible) {
            EXPECT_GT(bc[k].makespan_ms, a->report.predicted_makespan_ms) << Name(bc[k]);
          }
        }
      }
    }
  }
  std::printf("seed %u: %d candidates simulated without pruning, %d pruned by the bound\n", seed,
              simulated, pruned);
  EXPECT_GT(pruned, 0);  // the test exercises pruning
}

// The default search contains every single-method search and every fixed
// setting: none of them plans a mini-batch faster.
TEST(DefaultSearch, NeverBehindOneMethodOrOneSetting) {
  const uint32_t seed =
      varipipe::testing::TestSeed("DefaultSearch.NeverBehindOneMethodOrOneSetting");
  std::mt19937 rng(seed);
  const std::vector<std::string> narrowed = {
      R"(, "partition_methods": ["DYNAMIC_PROGRAMMING"])",
      R"(, "partition_methods": ["PACKING"], "fixed_micro_batch_size": 4)",
      R"(, "partition_methods": ["PACKING"], "schedules": ["ZERO_BUBBLE_H1"])",
      R"(, "partition_methods": ["TOKEN_BASED"], "micro_batch_token_budget": 4096)",
      R"(, "partition_methods": ["FIXED_SIZE", "PADDING"], "fixed_micro_batch_size": 8)",
  };
  for (const Job& base : {Job{.pp = 4, .tokens = 16384}, Job{.t5 = true, .pp = 2, .dp = 2}}) {
    absl::StatusOr<Planner> all = Planner::Create(Config(base));
    ASSERT_THAT(all, IsOk());
    const SyntheticMixture mixture =
        rng() % 2 ? SyntheticMixture::Documents(rng()) : SyntheticMixture::Flan(rng());
    uint64_t cursor = 0;
    for (int iteration = 0; iteration < 2; ++iteration) {
      const MiniBatch mb = Draw(mixture, &cursor, base.tokens, iteration);
      absl::StatusOr<PlanningResult> best = all->Plan(mb);
      ASSERT_THAT(best, IsOk());
      for (const std::string& extra : narrowed) {
        Job job = base;
        job.planner_extra = extra.c_str();
        absl::StatusOr<Planner> one = Planner::Create(Config(job));
        ASSERT_THAT(one, IsOk());
        absl::StatusOr<PlanningResult> r = one->Plan(mb);
        if (!r.ok()) continue;  // that search has no plan: nothing to beat
        EXPECT_LE(best->report.predicted_makespan_ms, r->report.predicted_makespan_ms)
            << "seed " << seed << ", " << extra << ", iteration " << iteration;
      }
    }
  }
}

// One summary per method; the plan's method is marked chosen with the
// plan's makespan, every other is no faster, and each says why.
TEST(DefaultSearch, MethodSummaryNamesThePlanAndExplainsTheRest) {
  absl::StatusOr<Planner> planner = Planner::Create(Config({.pp = 4, .tokens = 16384}));
  ASSERT_THAT(planner, IsOk());
  Planner everything = *planner;
  everything.set_options({.prune_by_bound = false});
  const SyntheticMixture mixture = SyntheticMixture::Flan(11);
  uint64_t cursor = 0;
  const MiniBatch mb = Draw(mixture, &cursor, 16384, 0);
  for (const Planner* p : {&*planner, &everything}) {
    absl::StatusOr<PlanningResult> r = p->Plan(mb);
    ASSERT_THAT(r, IsOk());
    const std::vector<MethodSummary> methods = SummarizeMethods(r->report);
    ASSERT_EQ(methods.size(), 5u);
    int chosen = 0;
    for (const MethodSummary& m : methods) {
      EXPECT_FALSE(m.why.empty()) << m.partition_method;
      if (m.outcome == MethodSummary::Outcome::kChosen) {
        ++chosen;
        EXPECT_EQ(m.partition_method, r->report.partition_method);
        EXPECT_EQ(m.best.setting, r->report.setting);
        EXPECT_EQ(m.best.makespan_ms, r->report.predicted_makespan_ms);
        EXPECT_THAT(m.why, ::testing::HasSubstr("fastest"));
      } else {
        EXPECT_GE(m.slower_by, 0) << m.partition_method << ": " << m.why;
      }
    }
    EXPECT_EQ(chosen, 1);
  }
}

// Hand-made reports: each outcome, its numbers and its reason.
TEST(DefaultSearch, MethodSummaryOutcomes) {
  const auto candidate = [](const char* method, const char* setting, bool feasible, double makespan,
                            double busiest, const char* rejected_at, double bound) {
    CandidateReport c;
    c.partition_method = method;
    c.setting = setting;
    c.schedule = "one_f_one_b";
    c.recompute = "none";
    c.feasible = feasible;
    c.makespan_ms = makespan;
    c.busiest_device_ms = busiest;
    c.rejected_at = rejected_at;
    c.reason = feasible ? "" : "why not";
    c.makespan_bound_ms = bound;
    return c;
  };
  PlanReport report;
  report.partition_method = "packing";
  report.setting = "rows=4";
  report.predicted_makespan_ms = 10;
  report.busiest_device_ms = 8;
  report.bubble_fraction = 0.2;
  report.candidates = {
      candidate("dynamic_programming", "", true, 12, 7.9, "", 9),     // more bubbles
      candidate("packing", "rows=2", true, 11, 9, "", 9),             // not the method's best
      candidate("packing", "rows=4", true, 10, 8, "", 9),             // the plan
      candidate("token_based", "tokens=1024", true, 13, 10, "", 9),   // more compute
      candidate("fixed_size", "rows=1", false, 0, 0, "bound", 12.5),  // cannot win
      candidate("fixed_size", "rows=2", false, 0, 0, "bound", 11),
      candidate("padding", "rows=1", false, 0, 0, "memory", 9),  // the explanation
      candidate("padding", "rows=2", false, 0, 0, "micro-batching", 0),
  };
  const std::vector<MethodSummary> m = SummarizeMethods(report);
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0].outcome, MethodSummary::Outcome::kSlower);
  EXPECT_NEAR(m[0].slower_by, 0.2, 1e-12);
  EXPECT_THAT(m[0].why, ::testing::HasSubstr("more pipeline bubbles"));
  EXPECT_EQ(m[1].outcome, MethodSummary::Outcome::kChosen);
  EXPECT_EQ(m[1].best.setting, "rows=4");
  // The runner-up is the closest of the others, simulated or bounded.
  EXPECT_THAT(m[1].why, ::testing::HasSubstr(
                            "every other method is at least 10.0% slower (fixed_size rows=2"));
  EXPECT_EQ(m[2].outcome, MethodSummary::Outcome::kSlower);
  EXPECT_THAT(m[2].why, ::testing::HasSubstr("more compute"));
  EXPECT_EQ(m[3].outcome, MethodSummary::Outcome::kBounded);
  EXPECT_EQ(m[3].best.setting, "rows=2");
  EXPECT_NEAR(m[3].slower_by, 0.1, 1e-12);
  EXPECT_THAT(m[3].why, ::testing::HasSubstr("cannot win"));
  EXPECT_EQ(m[4].outcome, MethodSummary::Outcome::kNoFit);
  EXPECT_EQ(m[4].best.setting, "rows=1");
  EXPECT_THAT(m[4].why, ::testing::HasSubstr("nothing fits: none: memory: why not"));
  // Without a plan, nothing is chosen and nothing is compared.
  report.partition_method.clear();
  for (const MethodSummary& s : SummarizeMethods(report)) {
    EXPECT_NE(s.outcome, MethodSummary::Outcome::kChosen) << s.partition_method;
  }
}

}  // namespace
}  // namespace varipipe::planner
