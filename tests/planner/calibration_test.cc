// Online calibration (planner/cost/calibration.h) and the iteration's update
// costs (planner/cost/update_costs.h): folding reports, the scales a state
// gives per layer kind, and plans made with a calibrated planner.
#include "planner/cost/calibration.h"

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config/job_config.h"
#include "common/dataset/synthetic_mixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/cost/update_costs.h"
#include "planner/plan/plan_builder.h"
#include "planner/planner.h"
#include "tests/testing/seed.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::planner {
namespace {

using ::testing::DoubleNear;
using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;

v1::JobConfig Config(bool t5, uint32_t pp, uint32_t dp) {
  const std::string json = absl::StrCat(
      R"({"job_id": "calibration", "model": {"kind": ")", t5 ? "T5" : "GPT",
      R"(", "num_layers": 8, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 32000},
      "parallelism": {"pipeline": )",
      pp, R"(, "data": )", dp, R"(},
      "cluster": {"device_memory_limit_mib": 8192, "devices_per_node": 8},
      "data": {"format": "SYNTHETIC", "tokens_per_global_batch": 8192, "max_sequence_length": 1024},
      "planner": {"tmax_interval_ms": 0.05},
      "training": {"iterations": 1}})");
  absl::StatusOr<v1::JobConfig> config = ParseJobConfigJson(json, "test");
  EXPECT_THAT(config, IsOk());
  ApplyJobConfigDefaults(*config);
  EXPECT_THAT(ValidateJobConfig(*config, "test"), IsOk());
  return *config;
}

StageLayout Layout(bool t5, uint32_t pp) {
  v1::JobConfig c = Config(t5, pp, 1);
  absl::StatusOr<StageLayout> layout = MakeStageLayout(ModelDimsFromConfig(c.model()), pp, 1);
  EXPECT_THAT(layout, IsOk());
  return *layout;
}

MiniBatch Draw(uint64_t first, bool t5) {
  const SyntheticMixture mixture = SyntheticMixture::Flan(7);
  MiniBatch mb;
  uint64_t tokens = 0;
  for (uint64_t id = first;; ++id) {
    SampleLengths s = mixture.Sample(id);
    s.target = std::min(s.target, 256u);
    s.input = std::min(s.input, 1024u - (t5 ? 0 : s.target));
    if (tokens + s.input + s.target > 8192) break;
    tokens += s.input + s.target;
    mb.sample_ids.push_back(id);
    mb.lengths.push_back(s);
  }
  return mb;
}

TEST(FoldReport, IgnoresTheWarmUpIterationAndReportsWithoutPredictions) {
  v1::CalibrationState state;
  const PassTiming pass{.stage = 0,
                        .measured_forward_ms = 3,
                        .measured_backward_ms = 6,
                        .profiled_forward_ms = 1,
                        .profiled_backward_ms = 2};
  EXPECT_FALSE(FoldReport({.iteration = 0, .passes = {&pass, 1}}, &state));
  PassTiming unpredicted = pass;
  unpredicted.profiled_forward_ms = 0;
  EXPECT_FALSE(FoldReport({.iteration = 1, .passes = {&unpredicted, 1}}, &state));
  EXPECT_EQ(state.version(), 0u);
  EXPECT_TRUE(FoldReport({.iteration = 1, .passes = {&pass, 1}}, &state));
  EXPECT_EQ(state.version(), 1u);
  EXPECT_EQ(state.iterations(), 1u);
  ASSERT_EQ(state.stages_size(), 1);
  EXPECT_DOUBLE_EQ(state.stages(0).measured_forward_ms(), 3);
  EXPECT_DOUBLE_EQ(state.stages(0).profiled_backward_ms(), 2);
}

TEST(FoldReport, OlderReportsFadeByTheDecay) {
  v1::CalibrationState state;
  // Ratio 2 first, then ratio 4 many times: the scale converges to 4.
  PassTiming pass{.stage = 0,
                  .measured_forward_ms = 2,
                  .measured_backward_ms = 2,
                  .profiled_forward_ms = 1,
                  .profiled_backward_ms = 1};
  ASSERT_TRUE(FoldReport({.iteration = 1, .passes = {&pass, 1}}, &state));
  const StageLayout gpt = Layout(false, 1);
  EXPECT_DOUBLE_EQ(ScalesOf(state, gpt).forward[0], 2);
  pass.measured_forward_ms = 4;
  double previous = 2;
  for (uint64_t i = 2; i < 30; ++i) {
    ASSERT_TRUE(FoldReport({.iteration = i, .passes = {&pass, 1}}, &state));
    const double scale = ScalesOf(state, gpt).forward[0];
    EXPECT_GT(scale, previous) << "iteration " << i;
    EXPECT_LT(scale, 4);
    previous = scale;
  }
  EXPECT_NEAR(previous, 4, 0.01);
  EXPECT_EQ(state.version(), 29u);
}

// Randomized: measured = k x profiled per kind (noise-free) gives exactly k
// for every component of that kind, whatever the stages and passes.
TEST(ScalesOf, RecoversEachKindsFactor) {
  std::mt19937 rng(varipipe::testing::TestSeed("ScalesOf.RecoversEachKindsFactor"));
  std::uniform_real_distribution<double> factor(0.1, 20), time(0.01, 50);
  for (int round = 0; round < 200; ++round) {
    const bool t5 = round % 2 == 1;
    const uint32_t pp = 1 + rng() % 4;
    const StageLayout layout = Layout(t5, pp);
    const double enc_f = factor(rng), enc_b = factor(rng), dec_f = factor(rng), dec_b = factor(rng),
                 opt = factor(rng);
    v1::CalibrationState state;
    for (uint64_t it = 1; it < 2 + rng() % 5; ++it) {
      std::vector<PassTiming> passes;
      for (uint32_t s = 0; s < pp; ++s) {
        const bool decoder = t5 && pp > 1 && s >= layout.encoder_devices;
        // T5 on one device: both kinds share the stage; use one factor.
        const double f = decoder ? dec_f : enc_f, b = decoder ? dec_b : enc_b;
        for (int k = 0; k < 3; ++k) {
          const double pf = time(rng), pb = time(rng);
          passes.push_back({s, f * pf, b * pb, pf, pb});
        }
      }
      ASSERT_TRUE(FoldReport({.iteration = it,
                              .passes = passes,
                              .measured_optimizer_ms = opt * 2,
                              .profiled_optimizer_ms = 2},
                             &state));
    }
    const CalibrationScales scales = ScalesOf(state, layout);
    const int enc = static_cast<int>(Component::kEncoderLayer);
    const int dec = static_cast<int>(Component::kDecoderLayer);
    const int head = static_cast<int>(Component::kPostprocess);
    SCOPED_TRACE(absl::StrCat("round ", round, " t5 ", t5, " pp ", pp));
    EXPECT_NEAR(scales.forward[enc], enc_f, 1e-9 * enc_f);
    EXPECT_NEAR(scales.backward[enc], enc_b, 1e-9 * enc_b);
    EXPECT_NEAR(scales.optimizer, opt, 1e-9 * opt);
    if (t5 && pp > 1) {
      EXPECT_NEAR(scales.forward[dec], dec_f, 1e-9 * dec_f);
      EXPECT_NEAR(scales.backward[head], dec_b, 1e-9 * dec_b);
    } else {
      EXPECT_NEAR(scales.forward[dec], enc_f, 1e-9 * enc_f);
      EXPECT_NEAR(scales.backward[head], enc_b, 1e-9 * enc_b);
    }
  }
}

TEST(ScalesOf, AnEmptyStateAndNonsenseAreNeutralOrClamped) {
  const StageLayout gpt = Layout(false, 2);
  const CalibrationScales neutral = ScalesOf(v1::CalibrationState(), gpt);
  for (double s : neutral.forward) EXPECT_EQ(s, 1);
  EXPECT_EQ(neutral.optimizer, 1);
  EXPECT_THAT(neutral.Describe(false), HasSubstr("forward x1, backward x1"));
  v1::CalibrationState huge;
  v1::StageCalibration* s = huge.add_stages();
  s->set_stage(0);
  s->set_measured_forward_ms(1e12);
  s->set_profiled_forward_ms(1);
  s->set_measured_backward_ms(0);
  s->set_profiled_backward_ms(1);
  const CalibrationScales clamped = ScalesOf(huge, gpt);
  EXPECT_EQ(clamped.forward[0], kMaxScale);
  EXPECT_EQ(clamped.backward[0], 1) << "a zero measurement gives no scale";
  // A stage of another layout (stage 7 of a 2-stage job) is ignored.
  v1::CalibrationState foreign;
  foreign.add_stages()->set_stage(7);
  foreign.mutable_stages(0)->set_measured_forward_ms(5);
  foreign.mutable_stages(0)->set_profiled_forward_ms(1);
  EXPECT_EQ(ScalesOf(foreign, gpt).forward[0], 1);
}

// A planner calibrated by a factor k plans exactly as one whose profiled
// times were k times as long, and its plans record both.
TEST(CalibratedPlanner, PlansAsAModelWithScaledTimes) {
  for (bool t5 : {false, true}) {
    SCOPED_TRACE(t5 ? "T5" : "GPT");
    const v1::JobConfig config = Config(t5, 2, 2);
    absl::StatusOr<Planner> base = Planner::Create(config);
    ASSERT_THAT(base, IsOk());
    v1::CalibrationState state;
    std::vector<PassTiming> passes;
    for (uint32_t s = 0; s < 2; ++s) passes.push_back({s, 3.0, 6.0, 1.0, 2.0});
    ASSERT_TRUE(FoldReport({.iteration = 1, .passes = passes}, &state));
    const Planner calibrated = base->WithCalibration(state);
    const std::array<double, kNumComponents> three{3, 3, 3, 3, 3};
    const Planner scaled(config, base->cost_model().ScaledTimes(three, three), base->options());
    const MiniBatch mb = Draw(100, t5);
    absl::StatusOr<PlanningResult> a = calibrated.Plan(mb);
    absl::StatusOr<PlanningResult> b = scaled.Plan(mb);
    absl::StatusOr<PlanningResult> profiled = base->Plan(mb);
    ASSERT_THAT(a, IsOk());
    ASSERT_THAT(b, IsOk());
    ASSERT_THAT(profiled, IsOk());
    EXPECT_DOUBLE_EQ(a->report.predicted_makespan_ms, b->report.predicted_makespan_ms);
    EXPECT_EQ(a->report.calibration_version, 1u);
    EXPECT_EQ(a->report.schedule, b->report.schedule);
    EXPECT_EQ(a->report.micro_batches, b->report.micro_batches);
    // The calibrated plans carry the profiled (unscaled) pass times: the
    // base planner's, for the same micro-batches.
    ASSERT_EQ(a->plans.size(), b->plans.size());
    for (size_t r = 0; r < a->plans.size(); ++r) {
      EXPECT_EQ(a->plans[r].calibration_version(), 1u);
      for (int i = 0; i < a->plans[r].instructions_size(); ++i) {
        const v1::Instruction& x = a->plans[r].instructions(i);
        const v1::Instruction& y = b->plans[r].instructions(i);
        if (x.has_forward()) {
          EXPECT_GT(x.forward().profiled_ms(), 0);
          EXPECT_NEAR(3 * x.forward().profiled_ms(), y.forward().profiled_ms(),
                      1e-9 * y.forward().profiled_ms());
        }
        if (x.has_backward()) {
          EXPECT_NEAR(3 * x.backward().profiled_ms(), y.backward().profiled_ms(),
                      1e-9 * y.backward().profiled_ms());
        }
      }
    }
    // Deterministic given the state: the same plans byte for byte.
    absl::StatusOr<PlanningResult> again = base->WithCalibration(state).Plan(mb);
    ASSERT_THAT(again, IsOk());
    for (size_t r = 0; r < a->plans.size(); ++r) {
      EXPECT_EQ(SerializePlanDeterministically(a->plans[r]),
                SerializePlanDeterministically(again->plans[r]));
    }
  }
}

// The predicted iteration is the makespan plus the slowest device's
// all-reduce and optimizer step, and every rank's plan carries its own.
TEST(PredictedIteration, AddsTheSlowestDevicesUpdate) {
  const v1::JobConfig config = Config(false, 4, 2);
  absl::StatusOr<Planner> planner = Planner::Create(config);
  ASSERT_THAT(planner, IsOk());
  absl::StatusOr<PlanningResult> r = planner->Plan(Draw(0, false));
  ASSERT_THAT(r, IsOk());
  double slowest = 0;
  for (const v1::ExecutionPlan& plan : r->plans) {
    EXPECT_GT(plan.predicted_all_reduce_ms(), 0) << "rank " << plan.rank();
    EXPECT_GT(plan.predicted_optimizer_ms(), 0) << "rank " << plan.rank();
    slowest = std::max(slowest, plan.predicted_all_reduce_ms() + plan.predicted_optimizer_ms());
    EXPECT_DOUBLE_EQ(plan.predicted_iteration_ms(), r->report.predicted_iteration_ms);
  }
  EXPECT_DOUBLE_EQ(r->report.predicted_update_ms, slowest);
  EXPECT_DOUBLE_EQ(r->report.predicted_iteration_ms,
                   r->report.predicted_makespan_ms + r->report.predicted_update_ms);
}

// The overhead: rank 0's measured iteration minus the plan's prediction
// without its overhead, decayed; it converges to a constant residual
// whatever the overhead the plans already carried, and only rank 0's
// whole iteration counts.
TEST(Calibration, OverheadConvergesToTheResidualOfWholeIterations) {
  const uint32_t seed =
      varipipe::testing::TestSeed("Calibration.OverheadConvergesToTheResidualOfWholeIterations");
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> pipeline_ms(50, 150);
  constexpr double kResidual = 12.5;
  const StageLayout layout = Layout(false, 2);
  v1::CalibrationState state;
  double overhead = 0;  // what the plans carry: the state's previous estimate
  for (uint64_t it = 1; it <= 30; ++it) {
    const double pipeline = pipeline_ms(rng);
    const CalibrationReport report{.iteration = it,
                                   .passes = {},
                                   .measured_iteration_ms = pipeline + kResidual,
                                   .predicted_iteration_ms = pipeline + overhead,
                                   .predicted_overhead_ms = overhead,
                                   .plan_calibration_version = it};
    ASSERT_TRUE(FoldReport(report, &state)) << "seed " << seed;
    overhead = ScalesOf(state, layout).overhead_ms;
    EXPECT_NEAR(overhead, kResidual, 1e-9) << "iteration " << it << ", seed " << seed;
  }
  // Another rank's report (no whole iteration), or one of a plan made
  // before any calibration, leaves the overhead alone.
  const double before = state.overhead_ms();
  EXPECT_FALSE(FoldReport({.iteration = 31, .passes = {}}, &state));
  EXPECT_FALSE(FoldReport(
      {.iteration = 31, .passes = {}, .measured_iteration_ms = 900, .predicted_iteration_ms = 100},
      &state));
  EXPECT_EQ(state.overhead_ms(), before);
  // A negative residual (the simulation overestimates) is learned too, and
  // the description shows it.
  for (uint64_t it = 32; it < 60; ++it) {
    FoldReport({.iteration = it,
                .passes = {},
                .measured_iteration_ms = 90,
                .predicted_iteration_ms = 100,
                .plan_calibration_version = it},
               &state);
  }
  EXPECT_NEAR(ScalesOf(state, layout).overhead_ms, -10, 0.01);
  EXPECT_THAT(ScalesOf(state, layout).Describe(false), HasSubstr("overhead -10.0 ms"));
}

// The predicted iteration adds the calibrated overhead; plans carry it and
// it changes no decision (the same plans as without it).
TEST(PredictedIteration, AddsTheCalibratedOverheadAndChangesNoPlan) {
  const v1::JobConfig config = Config(false, 2, 1);
  absl::StatusOr<Planner> planner = Planner::Create(config);
  ASSERT_THAT(planner, IsOk());
  const MiniBatch mb = Draw(0, false);
  absl::StatusOr<PlanningResult> plain = planner->Plan(mb);
  ASSERT_THAT(plain, IsOk());
  v1::CalibrationState state;
  state.set_version(5);
  state.set_overhead_ms(40);
  state.set_overhead_weight(2);  // +20 ms
  absl::StatusOr<PlanningResult> with = planner->WithCalibration(state).Plan(mb);
  ASSERT_THAT(with, IsOk());
  EXPECT_DOUBLE_EQ(with->report.predicted_overhead_ms, 20);
  EXPECT_DOUBLE_EQ(with->report.predicted_iteration_ms, plain->report.predicted_iteration_ms + 20);
  ASSERT_EQ(with->plans.size(), plain->plans.size());
  for (size_t r = 0; r < with->plans.size(); ++r) {
    EXPECT_DOUBLE_EQ(with->plans[r].predicted_overhead_ms(), 20);
    EXPECT_EQ(with->plans[r].instructions_size(), plain->plans[r].instructions_size());
    EXPECT_DOUBLE_EQ(with->plans[r].predicted_makespan_ms(),
                     plain->plans[r].predicted_makespan_ms());
  }
  // A large negative overhead takes away at most half the prediction.
  state.set_overhead_ms(-1e9);
  absl::StatusOr<PlanningResult> negative = planner->WithCalibration(state).Plan(mb);
  ASSERT_THAT(negative, IsOk());
  EXPECT_DOUBLE_EQ(negative->report.predicted_iteration_ms,
                   plain->report.predicted_iteration_ms / 2);
}

TEST(UpdateCosts, RingAndMeasuredAllReduce) {
  const Link link{.latency_ms = 0.01, .bytes_per_ms = 1e6};
  EXPECT_EQ(RingAllReduceMs(1e6, 1, link), 0);
  // 2 (n - 1) latencies and 2 (n - 1) / n of the bytes.
  EXPECT_DOUBLE_EQ(RingAllReduceMs(4e6, 4, link), 6 * 0.01 + 1.5 * 4);
  CommunicationCosts measured;
  measured.all_reduce = {.latency_ms = 0.2, .bytes_per_ms = 2e5};
  measured.all_reduce_ranks = 2;
  // At the measured rank count the fit itself.
  EXPECT_DOUBLE_EQ(MeasuredAllReduceMs(measured, 1e6, 2), 0.2 + 5);
  // Four ranks: latency x3, bandwidth term x (3/4) / (1/2).
  EXPECT_DOUBLE_EQ(MeasuredAllReduceMs(measured, 1e6, 4), 0.6 + 7.5);
  EXPECT_EQ(MeasuredAllReduceMs(measured, 1e6, 1), 0);
}

// ZeRO stage 1 at dp = 2: the optimizer step updates half of each device's
// parameters (its time falls by half its parameter-proportional part), the
// reduce-scatter and all-gather cost what the all-reduce cost.
TEST(UpdateCosts, ZeroStageOneStepsTheShard) {
  v1::JobConfig config = Config(false, 2, 2);
  absl::StatusOr<Planner> planner = Planner::Create(config);
  ASSERT_THAT(planner, IsOk());
  const StageLayout layout = Layout(false, 2);
  const std::vector<DeviceUpdateCost> whole =
      DeviceUpdateCosts(planner->cost_model(), layout, config);
  config.mutable_training()->set_zero_stage(1);
  const std::vector<DeviceUpdateCost> sharded =
      DeviceUpdateCosts(planner->cost_model(), layout, config);
  ASSERT_EQ(whole.size(), 2u);
  ASSERT_EQ(sharded.size(), 2u);
  for (size_t d = 0; d < 2; ++d) {
    EXPECT_DOUBLE_EQ(sharded[d].all_reduce_ms, whole[d].all_reduce_ms);
    EXPECT_GT(whole[d].optimizer_ms, 0);
    EXPECT_LT(sharded[d].optimizer_ms, whole[d].optimizer_ms);
    EXPECT_GE(sharded[d].optimizer_ms, whole[d].optimizer_ms / 2);
  }
}

}  // namespace
}  // namespace varipipe::planner
