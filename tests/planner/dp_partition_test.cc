// The micro-batching DP against brute force over every consecutive
// partition, on random mini-batches and random analytic cost models. Each
// run's loss head is priced at its labelled tokens: the samples' loss
// tokens (GPT: the targets), a FLAN-like mix whose long inputs carry no
// labels, or explicit counts (DpProblem::labelled, as packed rows pass).
#include "planner/microbatch/dp_partition.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/cost/analytic_model.h"
#include "planner/cost/hardware.h"
#include "planner/microbatch/sample_order.h"
#include "tests/testing/seed.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::planner {
namespace {

using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

constexpr double kInf = std::numeric_limits<double>::infinity();

struct RandomCase {
  ModelDims dims;
  CostModel model;
  StageLayout layout;
  std::vector<SampleLengths> samples;
  LengthPolicy policy;
  uint32_t data_parallel = 1;
};

// Where the labelled counts of a case come from.
enum class Labels {
  kLossTokens,  // LossTokens of each sample (DpProblem::labelled empty)
  kFlanLike,    // long unlabelled inputs, short targets (T5: short targets)
  kExplicit,    // random counts in [0, sequence], DpProblem::labelled
};

RandomCase MakeCase(std::mt19937& rng, bool t5, int n, Labels labels = Labels::kLossTokens) {
  RandomCase c;
  const uint32_t heads = 1u << (rng() % 4);
  c.dims = {.kind = t5 ? ModelKind::kT5 : ModelKind::kGpt,
            .encoder_layers = 2 + static_cast<uint32_t>(rng() % 6),
            .decoder_layers = t5 ? 2 + static_cast<uint32_t>(rng() % 6) : 0,
            .hidden = heads * (16u << (rng() % 3)),
            .heads = heads,
            .kv_channels = 16u << (rng() % 3),
            .ffn = 64u << (rng() % 4),
            .vocab = 1000 + static_cast<uint32_t>(rng() % 30000),
            .dtype_bytes = 2};
  Hardware hw{"random",
              50 + static_cast<double>(rng() % 900),
              20,
              500 + static_cast<double>(rng() % 4000),
              80,
              0.2 + (rng() % 60) / 100.0,
              static_cast<double>(16 + rng() % 2000),
              static_cast<double>(rng() % 50)};
  absl::StatusOr<CostModel> model =
      BuildAnalyticCostModel(c.dims, hw, {.max_micro_batch_size = 16, .max_seq_len = 512});
  EXPECT_THAT(model, IsOk());
  c.model = *std::move(model);
  const uint32_t pipeline =
      t5 ? 1 + rng() % 4 : 1 + rng() % std::min<uint32_t>(4, c.dims.encoder_layers);
  absl::StatusOr<StageLayout> layout = MakeStageLayout(c.dims, pipeline, 1);
  EXPECT_THAT(layout, IsOk());
  c.layout = *layout;
  c.policy = {.encoder_decoder = t5, .multiple = 1u << (rng() % 4)};
  c.data_parallel = 1 + rng() % 4;
  for (int i = 0; i < n; ++i) {
    // Lengths up to the grid's maximum (after rounding).
    if (labels == Labels::kFlanLike) {
      // Inputs of 64-400 tokens, targets of 1-24: most positions unlabelled.
      const uint32_t target = 1 + static_cast<uint32_t>(rng() % 24);
      const uint32_t input = 64 + static_cast<uint32_t>(rng() % (t5 ? 337 : 337 - target));
      c.samples.push_back({input, target});
    } else if (t5) {
      c.samples.push_back(
          {1 + static_cast<uint32_t>(rng() % 400), 1 + static_cast<uint32_t>(rng() % 200)});
    } else {
      const uint32_t total = 2 + static_cast<uint32_t>(rng() % 400);
      const uint32_t target = 1 + static_cast<uint32_t>(rng() % (total - 1));
      c.samples.push_back({total - target, target});
    }
  }
  return c;
}

struct BruteResult {
  double objective = kInf;
};

// The labelled tokens of `position` as the DP reads them.
uint64_t LabelledOf(const DpProblem& p, uint32_t position) {
  return p.labelled.empty() ? LossTokens(p.samples[position], p.policy.encoder_decoder)
                            : p.labelled[position];
}

BruteResult BruteForce(const DpProblem& p) {
  const size_t n = p.order.size();
  BruteResult best;
  for (uint64_t mask = 0; mask < (uint64_t{1} << (n - 1)); ++mask) {
    double max_t = 0;
    double sum_t = 0;
    bool feasible = true;
    size_t begin = 0;
    for (size_t end = 1; end <= n && feasible; ++end) {
      if (end < n && !(mask & (uint64_t{1} << (end - 1)))) continue;
      MicroBatchGroup g;
      g.samples.assign(p.order.begin() + begin, p.order.begin() + end);
      PadToLongest(p.samples, p.policy, g);
      uint64_t labelled = 0;
      for (uint32_t position : g.samples) labelled += LabelledOf(p, position);
      MicroBatchCost cost;
      feasible =
          p.cost->Evaluate(static_cast<uint32_t>(g.size()), g.input_len, g.target_len, nullptr,
                           static_cast<double>(labelled), &cost) &&
          cost.stored_bytes <= p.stored_limit_bytes && cost.peak_bytes <= p.peak_limit_bytes;
      max_t = std::max(max_t, cost.time_ms);
      sum_t += cost.time_ms;
      begin = end;
    }
    if (!feasible) continue;
    best.objective = std::min(best.objective, PipelineObjective(max_t, sum_t, p.pipeline_stages,
                                                                p.virtual_chunks, p.data_parallel));
  }
  return best;
}

// Checks a solution: a partition of the order into consecutive runs, within
// the memory limits, whose objective is what the solver claims.
void ExpectValidSolution(const DpProblem& p, const DpSolution& s) {
  std::vector<uint32_t> flat;
  double max_t = 0;
  double sum_t = 0;
  for (size_t g = 0; g < s.groups.size(); ++g) {
    flat.insert(flat.end(), s.groups[g].samples.begin(), s.groups[g].samples.end());
    // Each cost is the group's, its head at its labelled tokens.
    uint64_t labelled = 0;
    for (uint32_t position : s.groups[g].samples) labelled += LabelledOf(p, position);
    MicroBatchCost own;
    ASSERT_TRUE(p.cost->Evaluate(static_cast<uint32_t>(s.groups[g].size()), s.groups[g].input_len,
                                 s.groups[g].target_len, nullptr, static_cast<double>(labelled),
                                 &own));
    EXPECT_EQ(own.time_ms, s.costs[g].time_ms);
    EXPECT_EQ(own.stored_bytes, s.costs[g].stored_bytes);
    EXPECT_LE(s.costs[g].stored_bytes, p.stored_limit_bytes);
    EXPECT_LE(s.costs[g].peak_bytes, p.peak_limit_bytes);
    max_t = std::max(max_t, s.costs[g].time_ms);
    sum_t += s.costs[g].time_ms;
  }
  EXPECT_EQ(flat, std::vector<uint32_t>(p.order.begin(), p.order.end()));
  EXPECT_NEAR(s.objective_ms,
              PipelineObjective(max_t, sum_t, p.pipeline_stages, p.virtual_chunks, p.data_parallel),
              1e-9 * s.objective_ms);
}

std::string LabelsName(Labels labels) {
  switch (labels) {
    case Labels::kLossTokens:
      return "LossTokens";
    case Labels::kFlanLike:
      return "FlanLike";
    case Labels::kExplicit:
      return "ExplicitCounts";
  }
  return "";
}

class DpAgainstBruteForce : public ::testing::TestWithParam<std::tuple<bool, Labels>> {};

TEST_P(DpAgainstBruteForce, FindsTheOptimum) {
  const auto [t5, labels] = GetParam();
  const std::string name =
      absl::StrCat("DpAgainstBruteForce/", t5 ? "T5" : "GPT", LabelsName(labels));
  std::mt19937 rng(varipipe::testing::TestSeed(name.c_str()));
  int compared = 0;
  int infeasible = 0;
  // Optima whose partition differs from the one found with every position
  // labelled (the head's price changes the choice).
  int changed = 0;
  for (int trial = 0; trial < 1500; ++trial) {
    SCOPED_TRACE(::testing::Message() << "trial " << trial);
    RandomCase c = MakeCase(rng, t5, 1 + static_cast<int>(rng() % 12), labels);
    std::vector<uint64_t> explicit_labelled;
    if (labels == Labels::kExplicit) {
      for (const SampleLengths& s : c.samples) {
        const uint32_t positions = t5 ? s.target : s.input + s.target;
        // Some unlabelled, some fully labelled, the rest anywhere between.
        const uint32_t pick = rng() % 4;
        explicit_labelled.push_back(pick == 0   ? 0
                                    : pick == 1 ? positions
                                                : rng() % (positions + 1));
      }
    }
    absl::StatusOr<MicroBatchCostModel> cost =
        MicroBatchCostModel::Create(c.model, c.layout, static_cast<Recompute>(rng() % 3), 1);
    ASSERT_THAT(cost, IsOk());
    const std::vector<uint32_t> order = OrderSamples(
        c.samples, c.policy, t5 && rng() % 2 ? SampleOrder::kTwoDTour : SampleOrder::kLengthSort);
    // A memory limit somewhere between one small and one huge micro-batch.
    MicroBatchCost small, large;
    ASSERT_TRUE(cost->Evaluate(1, 8, 8, &small));
    ASSERT_TRUE(cost->Evaluate(16, 512, t5 ? 512 : 0, &large));
    const double limit = small.peak_bytes + (large.peak_bytes - small.peak_bytes) *
                                                std::pow((rng() % 1000) / 1000.0, 3);
    DpProblem p{.samples = c.samples,
                .order = order,
                .policy = c.policy,
                .cost = &*cost,
                .pipeline_stages = c.layout.devices,
                .virtual_chunks = 1,
                .data_parallel = c.data_parallel,
                .stored_limit_bytes = limit * 0.8,
                .peak_limit_bytes = limit,
                .tmax_interval_ms = 0};
    p.labelled = explicit_labelled;
    const BruteResult brute = BruteForce(p);
    absl::StatusOr<DpSolution> dp = SolveMicroBatchDp(p);
    if (brute.objective == kInf) {
      EXPECT_THAT(dp, StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("sample")));
      ++infeasible;
      continue;
    }
    ASSERT_THAT(dp, IsOk());
    EXPECT_NEAR(dp->objective_ms, brute.objective, 1e-9 * brute.objective);
    ExpectValidSolution(p, *dp);
    ++compared;
    {
      // The same problem with every position labelled.
      std::vector<uint64_t> every;
      for (const SampleLengths& s : c.samples) {
        every.push_back(uint64_t{2} * (t5 ? 512 : 1024));  // >= any padded run's positions
      }
      DpProblem all = p;
      all.labelled = every;
      absl::StatusOr<DpSolution> unlabelled = SolveMicroBatchDp(all);
      if (unlabelled.ok() && !unlabelled->pruned) {
        std::vector<std::vector<uint32_t>> a;
        std::vector<std::vector<uint32_t>> b;
        for (const MicroBatchGroup& g : dp->groups) a.push_back(g.samples);
        for (const MicroBatchGroup& g : unlabelled->groups) b.push_back(g.samples);
        changed += a != b;
        // Labels only lower the head's price.
        EXPECT_LE(dp->objective_ms, unlabelled->objective_ms * (1 + 1e-12));
      }
    }

    // A cutoff above the optimum still finds it; at the optimum nothing
    // strictly better exists, so the pair is pruned with a valid lower bound.
    p.objective_cutoff_ms = brute.objective * 1.01;
    absl::StatusOr<DpSolution> cut = SolveMicroBatchDp(p);
    ASSERT_THAT(cut, IsOk());
    ASSERT_FALSE(cut->pruned);
    EXPECT_NEAR(cut->objective_ms, brute.objective, 1e-9 * brute.objective);
    p.objective_cutoff_ms = brute.objective;
    absl::StatusOr<DpSolution> none = SolveMicroBatchDp(p);
    ASSERT_THAT(none, IsOk());
    EXPECT_TRUE(none->pruned);
    EXPECT_LE(none->lower_bound_ms, brute.objective * (1 + 1e-12));
    p.objective_cutoff_ms = std::numeric_limits<double>::infinity();

    // Bucketing: within (c - 1) * w of the optimum.
    p.tmax_interval_ms = brute.objective * (rng() % 100) / 1000.0;
    absl::StatusOr<DpSolution> bucketed = SolveMicroBatchDp(p);
    ASSERT_THAT(bucketed, IsOk());
    EXPECT_LE(
        bucketed->objective_ms,
        brute.objective + (p.pipeline_stages - 1) * p.tmax_interval_ms + 1e-9 * brute.objective);
    EXPECT_GE(bucketed->objective_ms, brute.objective * (1 - 1e-9));
    ExpectValidSolution(p, *bucketed);
  }
  std::printf(
      "compared %d optimal partitions with brute force; %d cases infeasible; %d partitions "
      "differ from pricing every position\n",
      compared, infeasible, changed);
  EXPECT_GT(compared, 600);
  if (labels != Labels::kLossTokens || !t5) EXPECT_GT(changed, 0);
}

INSTANTIATE_TEST_SUITE_P(Models, DpAgainstBruteForce,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(Labels::kLossTokens,
                                                              Labels::kFlanLike,
                                                              Labels::kExplicit)),
                         [](const auto& info) {
                           return absl::StrCat(std::get<0>(info.param) ? "T5" : "GPT",
                                               LabelsName(std::get<1>(info.param)));
                         });

// Everything a solution reports, to compare solves exactly.
std::string Describe(const absl::StatusOr<DpSolution>& s) {
  if (!s.ok()) return std::string(s.status().message());
  std::string out = absl::StrFormat(
      "obj %.17g max %.17g sum %.17g eval %d/%d pruned %d lb %.17g "
      "limit %.17g:",
      s->objective_ms, s->max_time_ms, s->sum_time_ms, s->tmax_evaluated, s->tmax_candidates,
      s->pruned, s->lower_bound_ms, s->stored_limit_bytes);
  for (const MicroBatchGroup& g : s->groups) {
    absl::StrAppend(&out, " [", absl::StrJoin(g.samples, ","), "]");
  }
  return out;
}

// Threads (the run table, the overlapped unconstrained DP, tmax candidates
// solved ahead) and a reused workspace never change a solution: large
// batches (quick run cap) and small ones, both budget kinds, a shared
// cutoff, two recompute modes in a row on one workspace.
TEST(MicroBatchDp, SameSolutionsForAnyThreadCountAndWorkspace) {
  std::mt19937 rng(
      varipipe::testing::TestSeed("MicroBatchDp.SameSolutionsForAnyThreadCountAndWorkspace"));
  int compared = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const bool t5 = trial % 2 == 1;
    RandomCase c = MakeCase(rng, t5, trial % 3 == 0 ? 300 : 1500);
    const std::vector<uint32_t> order = OrderSamples(c.samples, c.policy, SampleOrder::kLengthSort);
    const double factor = 1 + rng() % 6;
    std::vector<std::string> first;
    for (int variant = 0; variant < 3; ++variant) {
      DpWorkspace workspace;
      std::vector<std::string> described;
      for (Recompute mode : {Recompute::kNone, Recompute::kFull}) {
        absl::StatusOr<MicroBatchCostModel> cost =
            MicroBatchCostModel::Create(c.model, c.layout, mode, 1);
        ASSERT_THAT(cost, IsOk());
        double stored = 0;
        double peak = 0;
        for (const SampleLengths& s : c.samples) {
          MicroBatchCost one;
          ASSERT_TRUE(cost->Evaluate(1,
                                     RoundUpLength(SequenceLength(s, c.policy), c.policy.multiple),
                                     t5 ? RoundUpLength(s.target, c.policy.multiple) : 0, &one));
          stored = std::max(stored, one.depth_stored_bytes);
          peak = std::max(peak, one.peak_bytes);
        }
        const uint32_t depth = c.layout.devices;
        DpProblem p{.samples = c.samples,
                    .order = order,
                    .policy = c.policy,
                    .cost = &*cost,
                    .pipeline_stages = depth,
                    .data_parallel = c.data_parallel,
                    .peak_limit_bytes = peak * factor,
                    .tmax_interval_ms = trial % 4 == 0 ? 0.0 : 0.01,
                    .threads = variant + 1,
                    .workspace = variant == 0 ? nullptr : &workspace};
        double shared = kInf;
        const DpBudget budgets[] = {
            {.stored_limit_bytes = stored * factor / depth, .depth = depth, .cutoff = &shared},
            {.stored_limit_bytes = peak * factor, .depth = 1, .cutoff = nullptr}};
        for (const absl::StatusOr<DpSolution>& s : SolveMicroBatchDpBudgets(p, budgets)) {
          described.push_back(Describe(s));
        }
      }
      if (variant == 0) {
        first = described;
      } else {
        EXPECT_EQ(described, first) << "trial " << trial << ", " << variant + 1 << " threads";
        ++compared;
      }
    }
  }
  std::printf("compared %d solves with 2 and 3 threads against one thread\n", compared);
}

TEST(MicroBatchDp, NamesTheSampleThatFitsNowhere) {
  std::mt19937 rng(7);
  RandomCase c = MakeCase(rng, false, 5);
  c.samples = {{10, 5}, {20, 5}, {30, 5}, {300, 100}, {15, 5}};
  absl::StatusOr<MicroBatchCostModel> cost =
      MicroBatchCostModel::Create(c.model, c.layout, Recompute::kNone, 1);
  ASSERT_THAT(cost, IsOk());
  MicroBatchCost one;
  ASSERT_TRUE(cost->Evaluate(1, 104, 0, &one));
  const std::vector<uint32_t> order = OrderSamples(c.samples, c.policy, SampleOrder::kLengthSort);
  DpProblem p{.samples = c.samples,
              .order = order,
              .policy = c.policy,
              .cost = &*cost,
              .pipeline_stages = 1,
              .stored_limit_bytes = one.stored_bytes * 2,
              .peak_limit_bytes = one.peak_bytes * 2};
  EXPECT_THAT(SolveMicroBatchDp(p),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("sample 3 (input 300, target 100 tokens) does not fit")));
}

TEST(MicroBatchDp, RejectsAnEmptyMiniBatch) {
  std::mt19937 rng(7);
  RandomCase c = MakeCase(rng, false, 1);
  absl::StatusOr<MicroBatchCostModel> cost =
      MicroBatchCostModel::Create(c.model, c.layout, Recompute::kNone, 1);
  ASSERT_THAT(cost, IsOk());
  DpProblem p{.samples = c.samples,
              .order = {},
              .policy = c.policy,
              .cost = &*cost,
              .stored_limit_bytes = 1e30,
              .peak_limit_bytes = 1e30};
  EXPECT_THAT(SolveMicroBatchDp(p),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty mini-batch")));
}

}  // namespace
}  // namespace varipipe::planner
