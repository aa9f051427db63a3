// The planner's search (planner/planner.h): the shared-bound fast path
// against the per-pair path, byte-identical plans for any thread count,
// per-device memory, the depth budget's transient accounting, and reports of
// failed searches.
#include <array>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config/job_config.h"
#include "common/dataset/synthetic_mixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/cost/analytic_model.h"
#include "planner/cost/hardware.h"
#include "planner/cost/memory_model.h"
#include "planner/microbatch/dp_partition.h"
#include "planner/microbatch/micro_batching.h"
#include "planner/plan/plan_builder.h"
#include "planner/plan/validator.h"
#include "planner/planner.h"
#include "tests/testing/paper_models.h"
#include "tests/testing/search_job.h"
#include "tests/testing/seed.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::planner {
namespace {

using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

using ::varipipe::testing::DrawMiniBatch;
using ::varipipe::testing::PlanBytes;
using ::varipipe::testing::SearchJob;

// The DP with the adaptive and 1F1B schedules: the search these tests are
// about (default_search_test covers the default search).
constexpr char kDpSearch[] =
    R"(, "partition_methods": ["DYNAMIC_PROGRAMMING"], "schedules": ["ADAPTIVE", "ONE_F_ONE_B"])";

using Job = SearchJob;

// The job with the DP search (the test jobs set no planner fields).
v1::JobConfig Config(Job job) {
  job.planner_extra = kDpSearch;
  return varipipe::testing::SearchJobConfig(job);
}

MiniBatch Draw(const SyntheticMixture& mixture, uint64_t* cursor, uint64_t tokens_budget,
               uint64_t iteration) {
  return DrawMiniBatch(mixture, cursor, tokens_budget, iteration);
}

std::vector<std::string> Bytes(const PlanningResult& r) { return PlanBytes(r); }

// planner.threads changes where the per-replica work runs, never the plans.
TEST(PlannerSearch, PlansAreByteIdenticalForAnyThreadCount) {
  std::mt19937 rng(
      varipipe::testing::TestSeed("PlannerSearch.PlansAreByteIdenticalForAnyThreadCount"));
  // The last job has over 1,024 samples per mini-batch: the DP's run cap
  // from a quick solve and a lower bound, and its parallel run tables.
  for (const Job& job :
       {Job{.pp = 4, .dp = 4, .tokens = 32768}, Job{.t5 = true, .pp = 4, .dp = 3, .tokens = 24576},
        Job{.pp = 4, .dp = 16, .tokens = 262144}}) {
    absl::StatusOr<Planner> one = Planner::Create(Config(job));
    ASSERT_THAT(one, IsOk());
    // Two threads also solve tmax candidates ahead of the DP's search.
    std::vector<Planner> more(2, *one);
    more[0].set_options({.threads = 2});
    more[1].set_options({.threads = 3});
    const bool large = job.tokens > 100000;
    const SyntheticMixture mixture =
        large || rng() % 2 ? SyntheticMixture::Documents(rng()) : SyntheticMixture::Flan(rng());
    uint64_t cursor = 0;
    for (int iteration = 0; iteration < (large ? 2 : 4); ++iteration) {
      const MiniBatch mb = Draw(mixture, &cursor, job.tokens, iteration);
      if (large) {
        EXPECT_GT(mb.lengths.size(), 1024u);
      }
      absl::StatusOr<PlanningResult> a = one->Plan(mb);
      ASSERT_THAT(a, IsOk());
      for (const Planner& planner : more) {
        absl::StatusOr<PlanningResult> b = planner.Plan(mb);
        ASSERT_THAT(b, IsOk());
        EXPECT_EQ(b->report.threads, planner.options().threads);
        EXPECT_EQ(Bytes(*a), Bytes(*b)) << (job.t5 ? "T5" : "GPT") << " iteration " << iteration
                                        << ", " << planner.options().threads << " threads";
        ASSERT_EQ(a->report.candidates.size(), b->report.candidates.size());
        for (size_t k = 0; k < a->report.candidates.size(); ++k) {
          EXPECT_EQ(a->report.candidates[k].makespan_ms, b->report.candidates[k].makespan_ms);
          EXPECT_EQ(a->report.candidates[k].dp_objective_ms,
                    b->report.candidates[k].dp_objective_ms);
          EXPECT_EQ(a->report.candidates[k].reason, b->report.candidates[k].reason);
        }
      }
    }
  }
}

// The shared bound only skips pairs: every pair the fast path solves has the
// per-pair path's partition, and whenever the per-pair path's winner comes
// from a pair the fast path solved, both emit the same plans.
TEST(PlannerSearch, FastPathAgreesWithThePerPairPath) {
  std::mt19937 rng(varipipe::testing::TestSeed("PlannerSearch.FastPathAgreesWithThePerPairPath"));
  int compared = 0;
  int same_plans = 0;
  for (const Job& job : {Job{.pp = 4, .memory_mib = 3072}, Job{.pp = 2, .dp = 2, .tokens = 16384},
                         Job{.t5 = true, .pp = 4, .memory_mib = 3072}}) {
    absl::StatusOr<Planner> fast = Planner::Create(Config(job));
    ASSERT_THAT(fast, IsOk());
    // Every candidate with a partition simulated in both (pruning by the
    // makespan bound depends on the order candidates fit in).
    fast->set_options({.prune_by_bound = false});
    Planner per_pair = *fast;
    per_pair.set_options({.share_micro_batching_bound = false, .prune_by_bound = false});
    const SyntheticMixture mixture =
        rng() % 2 ? SyntheticMixture::Documents(rng()) : SyntheticMixture::Flan(rng());
    uint64_t cursor = 0;
    for (int iteration = 0; iteration < 6; ++iteration) {
      const MiniBatch mb = Draw(mixture, &cursor, job.tokens, iteration);
      absl::StatusOr<PlanningResult> a = fast->Plan(mb);
      absl::StatusOr<PlanningResult> b = per_pair.Plan(mb);
      ASSERT_EQ(a.ok(), b.ok());
      if (!a.ok()) continue;
      ++compared;
      const std::vector<CandidateReport>& fc = a->report.candidates;
      const std::vector<CandidateReport>& pc = b->report.candidates;
      ASSERT_EQ(fc.size(), pc.size());
      for (size_t k = 0; k < fc.size(); ++k) {
        if (!fc[k].feasible && fc[k].rejected_at == "micro-batching") continue;
        // Solved in both: the same partition, hence the same simulation.
        EXPECT_EQ(fc[k].micro_batches, pc[k].micro_batches) << k;
        EXPECT_EQ(fc[k].makespan_ms, pc[k].makespan_ms) << k;
        EXPECT_EQ(fc[k].feasible, pc[k].feasible) << k;
      }
      // The per-pair path sees a superset of candidates.
      EXPECT_LE(b->report.predicted_iteration_ms, a->report.predicted_iteration_ms);
      if (b->report.predicted_iteration_ms == a->report.predicted_iteration_ms) {
        EXPECT_EQ(Bytes(*a), Bytes(*b));
        ++same_plans;
      }
    }
  }
  EXPECT_GE(compared, 12);
  std::printf("same plans in %d of %d mini-batches\n", same_plans, compared);
}

// Each device's budget is its own room: the rooms follow each device's own
// model state, and every rank's simulated peak stays within its own room.
TEST(PlannerSearch, EachDeviceGetsItsOwnRoom) {
  const Job job{.t5 = true, .pp = 4, .memory_mib = 2048};
  const v1::JobConfig config = Config(job);
  absl::StatusOr<Planner> planner = Planner::Create(config);
  ASSERT_THAT(planner, IsOk());
  const ModelDims dims = ModelDimsFromConfig(config.model());
  absl::StatusOr<StageLayout> layout = MakeStageLayout(dims, job.pp, 1);
  ASSERT_THAT(layout, IsOk());
  const std::vector<double> params = ParametersPerDevice(planner->cost_model(), *layout);
  // Under a 16-bit dtype each device also keeps its compute-dtype weight copy.
  const std::vector<double> copies = ComputeCopyBytesPerDevice(*layout);
  absl::StatusOr<std::vector<double>> rooms = AvailableActivationBytesPerDevice(
      planner->cost_model(), *layout, ZeroStage::k0, 1, 2048.0 * (1 << 20));
  ASSERT_THAT(rooms, IsOk());
  ASSERT_EQ(rooms->size(), 4u);
  for (size_t d = 0; d < 4; ++d) {
    EXPECT_DOUBLE_EQ((*rooms)[d], 2048.0 * (1 << 20) -
                                      ModelStatePerDevice(params[d], ZeroStage::k0, 1).total() -
                                      copies[d])
        << d;
  }
  // The busiest device's room is the common budget.
  EXPECT_DOUBLE_EQ(*std::min_element(rooms->begin(), rooms->end()),
                   *AvailableActivationBytes(planner->cost_model(), *layout, ZeroStage::k0, 1,
                                             2048.0 * (1 << 20)));
  const SyntheticMixture mixture = SyntheticMixture::Flan(11);
  uint64_t cursor = 0;
  for (int iteration = 0; iteration < 4; ++iteration) {
    absl::StatusOr<PlanningResult> r = planner->Plan(Draw(mixture, &cursor, job.tokens, iteration));
    ASSERT_THAT(r, IsOk());
    ASSERT_EQ(r->report.memory_limit_per_rank.size(), 4u);
    for (size_t rank = 0; rank < 4; ++rank) {
      EXPECT_DOUBLE_EQ(r->report.memory_limit_per_rank[rank], (*rooms)[rank]);
      EXPECT_LE(r->report.peak_bytes[rank], (*rooms)[rank]) << rank;
    }
  }
}

// training.zero_stage 1 at dp = 2: every device's predicted model state
// falls by half its optimizer state (the share the other replica holds), and
// each rank's activation room grows by exactly that.
TEST(PlannerSearch, ZeroStageOneFreesHalfTheOptimizerStateAtDp2) {
  const Job job{.t5 = false, .pp = 2, .dp = 2, .memory_mib = 2048};
  const v1::JobConfig replicated = Config(job);
  v1::JobConfig sharded = replicated;
  sharded.mutable_training()->set_zero_stage(1);
  ASSERT_THAT(ValidateJobConfig(sharded, "test"), IsOk());
  absl::StatusOr<Planner> plain = Planner::Create(replicated);
  absl::StatusOr<Planner> zero1 = Planner::Create(sharded);
  ASSERT_THAT(plain, IsOk());
  ASSERT_THAT(zero1, IsOk());
  const ModelDims dims = ModelDimsFromConfig(replicated.model());
  absl::StatusOr<StageLayout> layout = MakeStageLayout(dims, job.pp, 1);
  ASSERT_THAT(layout, IsOk());
  const std::vector<double> params = ParametersPerDevice(plain->cost_model(), *layout);
  const SyntheticMixture mixture = SyntheticMixture::Flan(5);
  uint64_t cursor = 0;
  const MiniBatch mb = Draw(mixture, &cursor, job.tokens, 0);
  absl::StatusOr<PlanningResult> a = plain->Plan(mb);
  absl::StatusOr<PlanningResult> b = zero1->Plan(mb);
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  ASSERT_EQ(a->report.memory_limit_per_rank.size(), 4u);
  ASSERT_EQ(b->report.memory_limit_per_rank.size(), 4u);
  for (size_t rank = 0; rank < 4; ++rank) {
    const double p = params[rank % job.pp];
    const ModelStateBytes s0 = ModelStatePerDevice(p, ZeroStage::k0, 2);
    const ModelStateBytes s1 = ModelStatePerDevice(p, ZeroStage::k1, 2);
    EXPECT_DOUBLE_EQ(s1.parameters, s0.parameters);
    EXPECT_DOUBLE_EQ(s1.gradients, s0.gradients);
    EXPECT_DOUBLE_EQ(s1.optimizer, s0.optimizer / 2);
    EXPECT_NEAR(b->report.memory_limit_per_rank[rank] - a->report.memory_limit_per_rank[rank],
                s0.optimizer / 2, 1e-6 * s0.optimizer)
        << "rank " << rank;
  }
}

// With more room on some devices, per-device budgets never predict a slower
// iteration than the common budget on the same partitions' candidates, and
// the validator checks each rank against its own limit.
TEST(PlannerSearch, PerDeviceBudgetIsNeverWorseThanTheCommonOne) {
  const Job job{.t5 = true, .pp = 4, .memory_mib = 1536};
  absl::StatusOr<Planner> own = Planner::Create(Config(job));
  ASSERT_THAT(own, IsOk());
  Planner common = *own;
  common.set_options({.share_micro_batching_bound = false, .per_device_memory = false});
  Planner own_all = *own;
  own_all.set_options({.share_micro_batching_bound = false});
  const SyntheticMixture mixture = SyntheticMixture::Flan(5);
  uint64_t cursor = 0;
  for (int iteration = 0; iteration < 4; ++iteration) {
    const MiniBatch mb = Draw(mixture, &cursor, job.tokens, iteration);
    absl::StatusOr<PlanningResult> a = own_all.Plan(mb);
    absl::StatusOr<PlanningResult> b = common.Plan(mb);
    if (!b.ok()) {
      EXPECT_THAT(b, StatusIs(absl::StatusCode::kResourceExhausted));
      continue;
    }
    ASSERT_THAT(a, IsOk());
    // Larger rooms admit every partition the common budget admits (before
    // simulation); the simulated choice may differ, but rarely loses much.
    EXPECT_LE(a->report.predicted_iteration_ms, b->report.predicted_iteration_ms * 1.05);
  }
}

TEST(PlannerSearch, ValidatorChecksEachRankAgainstItsOwnLimit) {
  absl::StatusOr<Planner> planner = Planner::Create(Config({.pp = 2}));
  ASSERT_THAT(planner, IsOk());
  const SyntheticMixture mixture = SyntheticMixture::Flan(3);
  uint64_t cursor = 0;
  absl::StatusOr<PlanningResult> r = planner->Plan(Draw(mixture, &cursor, 8192, 0));
  ASSERT_THAT(r, IsOk());
  const std::vector<double> peaks = {100, 200};
  EXPECT_THAT(ValidatePlans(r->plans, peaks, std::vector<double>{150, 250}, 2), IsOk());
  EXPECT_THAT(ValidatePlans(r->plans, peaks, std::vector<double>{250, 150}, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 1")));
}

// Under the pipeline-depth budget device d holds up to c - d micro-batches
// and runs one op's transient on top: the DP keeps (c - d) * max stored +
// max transient within each device's room (planner/microbatch/dp_partition.h,
// DpBudget).
TEST(PlannerSearch, DepthBudgetLeavesRoomForTheTransient) {
  std::mt19937 rng(
      varipipe::testing::TestSeed("PlannerSearch.DepthBudgetLeavesRoomForTheTransient"));
  const ModelDims dims{.kind = ModelKind::kGpt,
                       .encoder_layers = 8,
                       .hidden = 1024,
                       .heads = 16,
                       .kv_channels = 64,
                       .ffn = 4096,
                       .vocab = 50000,
                       .dtype_bytes = 2};
  absl::StatusOr<CostModel> model = BuildAnalyticCostModel(
      dims, *HardwarePreset("a100-40gb"), {.max_micro_batch_size = 512, .max_seq_len = 2048});
  ASSERT_THAT(model, IsOk());
  absl::StatusOr<StageLayout> layout = MakeStageLayout(dims, 4, 1);
  ASSERT_THAT(layout, IsOk());
  int tightened = 0;
  int solved_trials = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const Recompute mode = static_cast<Recompute>(trial % 3);
    absl::StatusOr<MicroBatchCostModel> cost =
        MicroBatchCostModel::Create(*model, *layout, mode, 1);
    ASSERT_THAT(cost, IsOk());
    std::vector<SampleLengths> samples;
    std::uniform_int_distribution<uint32_t> length(1, 2048);
    for (int i = 0; i < 60; ++i) samples.push_back({length(rng), 0});
    std::vector<uint32_t> order(samples.size());
    for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](uint32_t a, uint32_t b) { return samples[a].input < samples[b].input; });
    MicroBatchCost longest;
    ASSERT_TRUE(cost->Evaluate(1, 2048, 0, &longest));
    // Rooms from barely four longest samples' stored activation upwards.
    const double room =
        4 * longest.stored_bytes * std::uniform_real_distribution<double>(1.0, 3.0)(rng);
    const DpProblem problem{.samples = samples,
                            .order = order,
                            .policy = {.encoder_decoder = false, .multiple = 8},
                            .cost = &*cost,
                            // An objective that favours large micro-batches
                            // (the layout still has 4 devices).
                            .pipeline_stages = 2,
                            .peak_limit_bytes = room,
                            .tmax_interval_ms = 0.05};
    const DpBudget budget{.stored_limit_bytes = room / 4, .depth = 4};
    std::vector<absl::StatusOr<DpSolution>> solved =
        SolveMicroBatchDpBudgets(problem, std::span<const DpBudget>(&budget, 1));
    if (!solved[0].ok()) continue;
    std::array<double, 3> stored{};
    std::array<double, 3> transient{};
    for (const MicroBatchCost& c : solved[0]->costs) {
      for (int k = 0; k < 3; ++k) {
        stored[k] = std::max(stored[k], c.class_stored_bytes[k]);
        transient[k] = std::max(transient[k], c.class_transient_bytes[k]);
      }
      EXPECT_LE(c.depth_stored_bytes, 4 * solved[0]->stored_limit_bytes * (1 + 1e-12));
    }
    // Device 0 holds 4 micro-batches under 1F1B, the last device 1.
    EXPECT_EQ(cost->ClassDepths()[kFirstDevice], 4);
    EXPECT_EQ(cost->ClassDepths()[kLastDevice], 1);
    for (int k = 0; k < 3; ++k) {
      EXPECT_LE(cost->ClassDepths()[k] * stored[k] + transient[k], room * (1 + 1e-12))
          << "trial " << trial << " class " << k;
    }
    tightened += solved[0]->stored_limit_bytes < room / 4;
    ++solved_trials;
  }
  EXPECT_GT(tightened, 0);  // the test exercises the tightening
  EXPECT_GT(solved_trials, tightened);
}

// A failed search still reports every candidate and why it was rejected.
TEST(PlannerSearch, FailedPlanReportsEveryCandidate) {
  absl::StatusOr<Planner> planner = Planner::Create(Config({.pp = 2, .memory_mib = 160}));
  ASSERT_THAT(planner, IsOk());
  const SyntheticMixture mixture = SyntheticMixture::Flan(9);
  uint64_t cursor = 0;
  PlanReport report;
  absl::StatusOr<PlanningResult> r = planner->Plan(Draw(mixture, &cursor, 8192, 0), false, &report);
  ASSERT_THAT(r, StatusIs(absl::StatusCode::kResourceExhausted));
  // 2 DP settings (over the samples and over packed rows) x 3 recompute
  // modes x 2 schedules.
  ASSERT_EQ(report.candidates.size(), 12u);
  for (const CandidateReport& c : report.candidates) {
    EXPECT_FALSE(c.feasible);
    EXPECT_FALSE(c.rejected_at.empty()) << c.schedule << "/" << c.recompute;
    EXPECT_FALSE(c.reason.empty()) << c.schedule << "/" << c.recompute;
  }
}

TEST(DocumentsMixture, ShortSamplesWithALongTail) {
  const SyntheticMixture mixture = SyntheticMixture::Documents(2024);
  uint64_t cursor = 0;
  std::vector<size_t> per_batch;
  for (int b = 0; b < 20; ++b) {
    uint64_t tokens = 0;
    size_t samples = 0;
    while (true) {
      SampleLengths s = mixture.Sample(cursor);
      s.target = std::min(s.target, 2048u);
      s.input = std::min(s.input, 2048u - s.target);
      if (tokens + s.input + s.target > 65536) break;
      tokens += s.input + s.target;
      ++samples;
      ++cursor;
    }
    per_batch.push_back(samples);
  }
  double mean = 0;
  for (size_t s : per_batch) mean += static_cast<double>(s) / per_batch.size();
  EXPECT_GT(mean, 300);
  EXPECT_LT(mean, 420);
  std::vector<uint32_t> lengths;
  for (uint64_t i = 0; i < 20000; ++i) {
    const SampleLengths s = mixture.Sample(i);
    lengths.push_back(s.input + s.target);
  }
  std::sort(lengths.begin(), lengths.end());
  EXPECT_LT(lengths[lengths.size() / 2], 120u);            // most are short
  EXPECT_GT(lengths[lengths.size() * 995 / 1000], 2048u);  // the tail reaches the maximum
}

// The 1F1B question (GPT-6.7B, pp = 8, 8,192 tokens, 36,000 MiB per device,
// the explicit attention kernel): a mini-batch with one 8,149-token sample
// among short ones. With selective recomputation that sample's micro-batch
// alone keeps 5.8 GiB on device 0 (more than room / 8) and peaks at 99% of
// its activation room in its backward, which recomputes the 32 x 8,192^2
// attention scores of a layer (the executor's measured peak includes them:
// measured_memory_test's Selective1F1B case). 1F1B holds the other
// in-flight micro-batches beside it, so no 1F1B plan with selective
// recomputation fits: the pipeline-depth partition refuses the sample (each
// micro-batch within room / 8) and the whole-device partition's 1F1B
// schedule simulates over the room. A planner that counts peaks only in
// forward passes would accept such plans.
TEST(PlannerSearch, OneFOneBWithSelectiveRecomputationCannotHoldALongSample) {
  v1::JobConfig config =
      varipipe::testing::PaperBenchmarkJob(false, {v1::ONE_F_ONE_B, v1::ADAPTIVE});
  config.mutable_parallelism()->set_pipeline(8);
  // 36,000 MiB beside the fp32 state and the bf16 weight copy (device 0's
  // four layers: 1,536 MiB).
  constexpr double kLimitMib = 36000 + 1536;
  config.mutable_cluster()->set_device_memory_limit_mib(kLimitMib);
  config.mutable_data()->set_max_sequence_length(8192);
  config.mutable_planner()->clear_partition_methods();
  config.mutable_planner()->add_partition_methods(v1::DYNAMIC_PROGRAMMING);
  config.mutable_planner()->set_dp_packed_rows(false);
  ASSERT_THAT(ValidateJobConfig(config, "test"), IsOk());
  MiniBatch mb;
  mb.sample_ids.push_back(0);
  mb.lengths.push_back({8149, 43});
  for (uint64_t i = 1; i <= 200; ++i) {
    mb.sample_ids.push_back(i);
    mb.lengths.push_back({static_cast<uint32_t>(150 + 37 * i % 200), 20});
  }
  absl::StatusOr<Planner> planner = Planner::Create(config);
  ASSERT_THAT(planner, IsOk());
  absl::StatusOr<PlanningResult> r = planner->Plan(mb);
  ASSERT_THAT(r, IsOk());
  int refused = 0;
  for (const CandidateReport& c : r->report.candidates) {
    // The partition one recompute mode per iteration makes (not the long
    // sample alone under its own mode: setting "lone" or "lone+depth").
    if (c.schedule != "one_f_one_b" || c.recompute != "selective" || !c.setting.empty()) continue;
    SCOPED_TRACE(c.budget);
    EXPECT_FALSE(c.feasible) << c.reason;
    EXPECT_THAT(c.rejected_at, c.budget == "pipeline-depth" ? "micro-batching" : "memory");
    refused += !c.feasible;
  }
  EXPECT_EQ(refused, 2);  // both partitions
  // The long sample alone, on the busiest device.
  absl::StatusOr<StageLayout> layout = JobStageLayout(config);
  ASSERT_THAT(layout, IsOk());
  absl::StatusOr<MicroBatchCostModel> cost =
      MicroBatchCostModel::Create(planner->cost_model(), *layout, Recompute::kSelective, 1);
  ASSERT_THAT(cost, IsOk());
  absl::StatusOr<std::vector<double>> rooms = AvailableActivationBytesPerDevice(
      planner->cost_model(), *layout, ZeroStage::k0, 1, kLimitMib * (1 << 20));
  ASSERT_THAT(rooms, IsOk());
  cost->SetDeviceRoom(*rooms, (*rooms)[0]);
  MicroBatchCost alone;
  ASSERT_TRUE(cost->Evaluate(1, 8192, 0, &alone));
  std::printf(
      "one 8,192-token micro-batch, selective recomputation: stored %.0f MiB, peak %.0f MiB of a "
      "%.0f MiB room on device 0; the plan: %s/%s, %.0f ms\n",
      alone.stored_bytes / (1 << 20), alone.peak_bytes / (1 << 20), (*rooms)[0] / (1 << 20),
      r->report.schedule.c_str(), r->report.recompute.c_str(), r->report.predicted_makespan_ms);
  EXPECT_GT(alone.stored_bytes, (*rooms)[0] / 8);
  EXPECT_GT(alone.peak_bytes, 0.9 * (*rooms)[0]);
}

}  // namespace
}  // namespace varipipe::planner
