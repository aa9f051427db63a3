#include "planner/microbatch/micro_batching.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/cost/analytic_model.h"
#include "planner/cost/hardware.h"
#include "planner/microbatch/dp_partition.h"
#include "tests/testing/paper_models.h"
#include "tests/testing/seed.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::planner {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

ModelDims SmallGpt() {
  return {.kind = ModelKind::kGpt,
          .encoder_layers = 8,
          .hidden = 1024,
          .heads = 16,
          .kv_channels = 64,
          .ffn = 4096,
          .vocab = 32000,
          .dtype_bytes = 2};
}

CostModel Model(const ModelDims& dims) {
  absl::StatusOr<CostModel> model = BuildAnalyticCostModel(
      dims, *HardwarePreset("a100-40gb"), {.max_micro_batch_size = 256, .max_seq_len = 2048});
  EXPECT_THAT(model, IsOk());
  return *std::move(model);
}

MicroBatchingOptions Options(const ModelDims& dims, double memory_gib) {
  MicroBatchingOptions o;
  o.dims = dims;
  o.pipeline = 4;
  o.data_parallel = 2;
  o.device_memory_limit_bytes = memory_gib * (1 << 30);
  o.max_input_len = 2048;
  o.max_target_len = dims.encoder_decoder() ? 512 : 0;
  o.tmax_interval_ms = 0;
  return o;
}

std::vector<SampleLengths> Batch() {
  std::vector<SampleLengths> s;
  for (int i = 0; i < 40; ++i) s.push_back({static_cast<uint32_t>(20 + 37 * i % 900), 10});
  s.push_back({1900, 100});
  return s;
}

TEST(MicroBatching, ChoosesTheFastestFeasiblePairAndExplains) {
  const ModelDims dims = SmallGpt();
  const CostModel model = Model(dims);
  absl::StatusOr<MicroBatchingResult> r = PlanMicroBatches(Batch(), model, Options(dims, 6));
  ASSERT_THAT(r, IsOk());
  ASSERT_GE(r->chosen, 0);
  EXPECT_EQ(r->candidates.size(), 6u);  // 3 recompute modes x 2 budgets
  // Pairs the search pruned really are no faster: solve them without a
  // cutoff.
  const MicroBatchingOptions o = Options(dims, 6);
  const StageLayout layout = *MakeStageLayout(dims, o.pipeline, 1);
  const LengthPolicy policy{.encoder_decoder = false, .multiple = o.length_multiple};
  const std::vector<SampleLengths> batch = Batch();
  const std::vector<uint32_t> order = OrderSamples(batch, policy, SampleOrder::kLengthSort);
  int pruned = 0;
  for (const MicroBatchingCandidate& c : r->candidates) {
    if (!c.status.ok()) continue;
    if (!c.pruned) {
      EXPECT_GE(c.objective_ms, r->best().objective_ms);
      continue;
    }
    ++pruned;
    const MicroBatchCostModel cost = *MicroBatchCostModel::Create(model, layout, c.recompute, 1);
    DpProblem p{.samples = batch,
                .order = order,
                .policy = policy,
                .cost = &cost,
                .pipeline_stages = o.pipeline,
                .data_parallel = o.data_parallel,
                .stored_limit_bytes = c.stored_limit_bytes,
                .peak_limit_bytes = c.peak_limit_bytes,
                .tmax_interval_ms = 0};
    absl::StatusOr<DpSolution> exact = SolveMicroBatchDp(p);
    ASSERT_THAT(exact, IsOk());
    EXPECT_GE(exact->objective_ms, r->best().objective_ms * (1 - 1e-12));
    EXPECT_LE(c.objective_ms, exact->objective_ms * (1 + 1e-12));  // a true lower bound
  }
  EXPECT_GT(pruned, 0);
  EXPECT_THAT(r->reason, HasSubstr("chose recompute"));
  // Every sample in exactly one micro-batch; replicas cover every group.
  size_t samples = 0;
  for (const auto& g : r->best().groups) samples += g.samples.size();
  EXPECT_EQ(samples, Batch().size());
  size_t assigned = 0;
  for (const auto& rep : r->replicas.replicas) assigned += rep.size();
  EXPECT_EQ(assigned, r->best().groups.size());
  EXPECT_GT(r->padding.Efficiency(), 0.8);
}

// Under memory pressure the depth budget (available / c) needs
// recomputation while the whole-device budget does not; the planner must
// not stop at the first mode that fits.
TEST(MicroBatching, ComparesBudgetsInsteadOfTakingTheFirstFit) {
  const ModelDims dims = SmallGpt();
  const CostModel model = Model(dims);
  MicroBatchingOptions o = Options(dims, 2.2);
  absl::StatusOr<MicroBatchingResult> r = PlanMicroBatches(Batch(), model, o);
  ASSERT_THAT(r, IsOk());
  const MicroBatchingCandidate* none_depth = nullptr;
  const MicroBatchingCandidate* none_whole = nullptr;
  for (const MicroBatchingCandidate& c : r->candidates) {
    if (c.recompute == Recompute::kNone && c.budget == MemoryBudget::kPipelineDepth)
      none_depth = &c;
    if (c.recompute == Recompute::kNone && c.budget == MemoryBudget::kWholeDevice) none_whole = &c;
  }
  ASSERT_NE(none_depth, nullptr);
  ASSERT_NE(none_whole, nullptr);
  EXPECT_FALSE(none_depth->status.ok()) << "expected memory pressure; raise nothing else";
  ASSERT_THAT(none_whole->status, IsOk());
  EXPECT_EQ(r->best().recompute, Recompute::kNone);
  EXPECT_EQ(r->best().budget, MemoryBudget::kWholeDevice);
  EXPECT_THAT(r->reason, HasSubstr("infeasible"));
}

TEST(MicroBatching, BadSamplesAreNamed) {
  const ModelDims dims = SmallGpt();
  const CostModel model = Model(dims);
  const MicroBatchingOptions o = Options(dims, 8);
  EXPECT_THAT(PlanMicroBatches({}, model, o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no samples")));
  std::vector<SampleLengths> s = {{10, 2}, {0, 0}};
  EXPECT_THAT(PlanMicroBatches(s, model, o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("sample at position 1 has zero length")));
  // With the mini-batch's sample ids, errors name the sample by its id.
  const std::vector<uint64_t> ids = {4711, 81234};
  MicroBatchingOptions named = o;
  named.sample_ids = ids;
  EXPECT_THAT(PlanMicroBatches(s, model, named),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("sample 81234 (position 1 of the mini-batch) has zero length")));
  s = {{10, 2}, {3000, 10}};
  EXPECT_THAT(PlanMicroBatches(s, model, o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("sample at position 1 (3010 tokens"), HasSubstr("2048"),
                             HasSubstr("truncate_long_samples"))));
  MicroBatchingOptions truncating = o;
  truncating.truncate = true;
  absl::StatusOr<MicroBatchingResult> r = PlanMicroBatches(s, model, truncating);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->truncated, std::vector<uint32_t>{1});
  EXPECT_EQ(r->samples[1].input + r->samples[1].target, 2048u);
  EXPECT_EQ(r->samples[1].target, 10u);
}

TEST(MicroBatching, TooLittleMemoryNamesTheSampleOrTruncates) {
  const ModelDims dims = SmallGpt();
  const CostModel model = Model(dims);
  MicroBatchingOptions o = Options(dims, 0.95);  // barely more than the model state
  // and the bf16 weight copy
  absl::StatusOr<StageLayout> layout = MakeStageLayout(dims, o.pipeline, 1);
  ASSERT_THAT(layout, IsOk());
  const std::vector<double> copies = ComputeCopyBytesPerDevice(*layout);
  o.device_memory_limit_bytes += *std::max_element(copies.begin(), copies.end());
  o.recompute_modes = {Recompute::kNone};
  const std::vector<SampleLengths> s = {{100, 10}, {2000, 40}};
  EXPECT_THAT(
      PlanMicroBatches(s, model, o),
      StatusIs(absl::StatusCode::kResourceExhausted,
               AllOf(HasSubstr("sample 1 (input 2000, target 40 tokens)"), HasSubstr("limits"))));
  o.truncate = true;
  absl::StatusOr<MicroBatchingResult> r = PlanMicroBatches(s, model, o);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->truncated, std::vector<uint32_t>{1});
  EXPECT_LT(r->samples[1].input, 2000u);
  o.device_memory_limit_bytes = 0.1 * (1 << 30);
  EXPECT_THAT(PlanMicroBatches(s, model, o),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("model state alone")));
}

TEST(MicroBatching, BaselinesAreCostedWithTheSameObjective) {
  const ModelDims dims = SmallGpt();
  const CostModel model = Model(dims);
  double dp_objective = 0;
  for (PartitionMethod m :
       {PartitionMethod::kDynamicProgramming, PartitionMethod::kTokenBased,
        PartitionMethod::kFixedSize, PartitionMethod::kPacking, PartitionMethod::kPadding}) {
    MicroBatchingOptions o = Options(dims, 16);
    o.method = m;
    o.fixed_micro_batch_size = 4;
    o.micro_batch_token_budget = 4096;
    absl::StatusOr<MicroBatchingResult> r = PlanMicroBatches(Batch(), model, o);
    ASSERT_THAT(r, IsOk()) << PartitionMethodName(m);
    if (m == PartitionMethod::kDynamicProgramming) {
      dp_objective = r->best().objective_ms;
    } else {
      // The DP optimises over consecutive runs of the sorted order; the
      // baselines are feasible partitions too, so none may beat it by more
      // than rounding (packing and padding use other orders and can differ).
      if (m == PartitionMethod::kTokenBased || m == PartitionMethod::kFixedSize) {
        EXPECT_GE(r->best().objective_ms, dp_objective * (1 - 1e-9)) << PartitionMethodName(m);
      }
    }
  }
}

TEST(MicroBatching, T5UsesBothLengths) {
  const ModelDims dims = varipipe::testing::SmallT5Dims();
  const CostModel model = Model(dims);
  MicroBatchingOptions o = Options(dims, 16);
  o.order = SampleOrder::kTwoDTour;
  std::vector<SampleLengths> s;
  for (int i = 0; i < 50; ++i) {
    s.push_back(
        {static_cast<uint32_t>(30 + 53 * i % 1500), static_cast<uint32_t>(2 + 17 * i % 300)});
  }
  absl::StatusOr<MicroBatchingResult> r = PlanMicroBatches(s, model, o);
  ASSERT_THAT(r, IsOk());
  EXPECT_GT(r->padding.InputEfficiency(), 0.5);
  EXPECT_GT(r->padding.TargetEfficiency(), 0.3);
  for (const MicroBatchGroup& g : r->best().groups) EXPECT_GT(g.target_len, 0u);
}

// The DP over packed rows (packed_row_tokens): over random mini-batches of
// GPT and T5, every solved pair covers each sample exactly once, every row
// stays within the row limits and its micro-batch's padded lengths, rows of
// one sample are unpacked (no row_starts unless some row holds several), and
// short samples share rows.
TEST(MicroBatching, PackedRowsCoverEverySampleOnceWithinTheirRows) {
  const uint32_t seed = varipipe::testing::TestSeed("PackedRowsCoverEverySampleOnce");
  std::mt19937 rng(seed);
  for (bool t5 : {false, true}) {
    const ModelDims dims = t5 ? varipipe::testing::SmallT5Dims() : SmallGpt();
    const CostModel model = Model(dims);
    for (int trial = 0; trial < 10; ++trial) {
      std::vector<SampleLengths> batch;
      const int n = 20 + static_cast<int>(rng() % 60);
      for (int i = 0; i < n; ++i) {
        // Mostly short samples, a few long ones.
        const uint32_t input = rng() % 4 == 0 ? 200 + rng() % 1700 : 8 + rng() % 200;
        const uint32_t target = t5 ? 1 + rng() % 200 : 1 + rng() % 40;
        batch.push_back({std::min<uint32_t>(input, 2048 - (t5 ? 0 : target)), target});
      }
      MicroBatchingOptions o = Options(dims, 16);
      o.packed_row_tokens = 2048;
      absl::StatusOr<MicroBatchingResult> r = PlanMicroBatches(batch, model, o);
      ASSERT_THAT(r, IsOk()) << "seed " << seed << " trial " << trial;
      EXPECT_LT(r->packed_rows.size(), batch.size());  // short samples share rows
      const LengthPolicy policy{.encoder_decoder = t5, .multiple = o.length_multiple};
      for (const MicroBatchingCandidate& c : r->candidates) {
        if (!c.solved()) continue;
        std::vector<int> seen(batch.size(), 0);
        for (const MicroBatchGroup& g : c.groups) {
          std::vector<uint32_t> starts = g.row_starts;
          if (starts.empty()) {
            for (uint32_t i = 0; i < g.samples.size(); ++i) starts.push_back(i);
          }
          bool several = false;
          for (size_t row = 0; row < starts.size(); ++row) {
            const size_t end = row + 1 < starts.size() ? starts[row + 1] : g.samples.size();
            uint64_t input = 0, target = 0;
            for (size_t k = starts[row]; k < end; ++k) {
              const SampleLengths& s = r->samples[g.samples[k]];
              input += SequenceLength(s, policy);
              target += t5 ? s.target : 0;
              ++seen[g.samples[k]];
            }
            several |= end - starts[row] > 1;
            EXPECT_LE(input, g.input_len);
            EXPECT_LE(input, 2048u);
            if (t5) {
              EXPECT_LE(target, g.target_len);
              EXPECT_LE(target, 512u);
            }
          }
          EXPECT_EQ(!g.row_starts.empty(), several) << "seed " << seed;
        }
        for (size_t i = 0; i < seen.size(); ++i) {
          ASSERT_EQ(seen[i], 1) << "sample " << i << ", seed " << seed << " trial " << trial;
        }
      }
    }
  }
}

}  // namespace
}  // namespace varipipe::planner
