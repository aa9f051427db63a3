// Packed rows priced per sample (model.packed_attention PER_SAMPLE,
// micro_batch_cost.h): a layer's cost at the row length, minus the attention
// core over the whole rows, plus each sample's own core. Checked against the
// analytic model's own components at grid points, under every recompute
// mode, for GPT and T5; and end to end, the planner's packing plans record
// the kernel they were priced with and are predicted no slower per sample
// than under the block-diagonal mask.
#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "common/config/job_config.h"
#include "common/dataset/synthetic_mixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/cost/analytic_model.h"
#include "planner/cost/hardware.h"
#include "planner/cost/memory_model.h"
#include "planner/cost/micro_batch_cost.h"
#include "planner/planner.h"
#include "tests/testing/paper_models.h"
#include "tests/testing/search_job.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::planner {
namespace {

using ::varipipe::testing::IsOk;

Hardware A100() {
  absl::StatusOr<Hardware> hw = HardwarePreset("a100-80gb");
  EXPECT_THAT(hw, IsOk());
  return *hw;
}

struct Fixture {
  ModelDims dims;
  CostModel model;
  StageLayout layout;
};

Fixture Make(ModelDims dims) {
  absl::StatusOr<CostModel> model =
      BuildAnalyticCostModel(dims, A100(), {.max_micro_batch_size = 16, .max_seq_len = 2048});
  EXPECT_THAT(model, IsOk());
  absl::StatusOr<StageLayout> layout = MakeStageLayout(dims, 1, 1);
  EXPECT_THAT(layout, IsOk());
  return {dims, *std::move(model), *std::move(layout)};
}

CostValues Core(const ModelDims& d, double b, double s) {
  return AnalyticComponentCost(d, A100(), Component::kAttentionCore, Recompute::kNone, 1, b, s, 0);
}

// Expected change of one layer from the whole rows' core to the samples'.
struct Delta {
  double forward = 0, backward = 0, stored = 0;
};
void AddCore(const ModelDims& d, Recompute mode, uint32_t rows, double full,
             const std::vector<double>& lengths, Delta* delta) {
  CostValues sum;
  for (double l : lengths) {
    const CostValues one = Core(d, 1, l);
    sum.forward_ms += one.forward_ms;
    sum.backward_ms += one.backward_ms;
    sum.stored_bytes += one.stored_bytes;
  }
  const CostValues whole = Core(d, rows, full);
  const double forward = sum.forward_ms - whole.forward_ms;
  delta->forward += forward;
  delta->backward += sum.backward_ms - whole.backward_ms;
  if (mode == Recompute::kNone) {
    delta->stored += sum.stored_bytes - whole.stored_bytes;
  } else {
    delta->backward += forward;  // the core's forward runs again; nothing kept
  }
}

TEST(PackedAttentionCost, GptLayersMovePerSampleByTheCoreDifference) {
  const Fixture f = Make(varipipe::testing::Gpt67bDims());
  // Two rows of 2,048 tokens: 1024 + 512 + 256 + 256 and 2048 (grid points,
  // so the grid reproduces the formulas).
  const PackedSamples packed{.rows = 2,
                             .samples = {{1024, 0}, {512, 0}, {256, 0}, {256, 0}, {2048, 0}}};
  for (Recompute mode : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    SCOPED_TRACE(RecomputeName(mode));
    absl::StatusOr<MicroBatchCostModel> cost =
        MicroBatchCostModel::Create(f.model, f.layout, mode, 1);
    ASSERT_THAT(cost, IsOk());
    ASSERT_TRUE(cost->prices_per_sample_attention());
    MicroBatchCost row, per_sample;
    ASSERT_TRUE(cost->Evaluate(2, 2048, 0, &row));
    ASSERT_TRUE(cost->Evaluate(2, 2048, 0, &packed, &per_sample));
    Delta d;
    AddCore(f.dims, mode, 2, 2048, {1024, 512, 256, 256, 2048}, &d);
    const double layers = f.dims.encoder_layers;
    EXPECT_NEAR(per_sample.forward_ms, row.forward_ms + layers * d.forward, 1e-9 * row.time_ms);
    EXPECT_NEAR(per_sample.backward_ms, row.backward_ms + layers * d.backward, 1e-9 * row.time_ms);
    // Under recomputation (explicit kernel) the rows' dense causal masks,
    // bool [2, 1, 2048, 2048] per layer, are not kept by the samples.
    const double masks = mode == Recompute::kNone ? 0.0 : 2.0 * 2048 * 2048;
    EXPECT_NEAR(per_sample.stored_bytes, row.stored_bytes + layers * (d.stored - masks),
                1e-9 * row.stored_bytes);
    // The rows' core's share of the transient becomes the largest sample's (never more).
    EXPECT_LE(per_sample.peak_bytes - per_sample.stored_bytes, row.peak_bytes - row.stored_bytes);
    // Attention over 1,024^2 + 512^2 + 2 x 256^2 + 2,048^2 scores instead of
    // 2 x 2,048^2: cheaper, and (explicit kernel) smaller.
    EXPECT_LT(per_sample.time_ms, row.time_ms);
    EXPECT_LT(per_sample.stored_bytes, row.stored_bytes);
    EXPECT_LT(per_sample.peak_bytes, row.peak_bytes);
  }
}

TEST(PackedAttentionCost, OneSampleFillingEachRowCostsWhatTheRowDoes) {
  const Fixture f = Make(varipipe::testing::Gpt67bDims());
  absl::StatusOr<MicroBatchCostModel> cost =
      MicroBatchCostModel::Create(f.model, f.layout, Recompute::kNone, 1);
  ASSERT_THAT(cost, IsOk());
  // b = 1: the row's core and the sample's are the same grid point.
  const PackedSamples packed{.rows = 1, .samples = {{1024, 0}}};
  MicroBatchCost row, per_sample;
  ASSERT_TRUE(cost->Evaluate(1, 1024, 0, &row));
  ASSERT_TRUE(cost->Evaluate(1, 1024, 0, &packed, &per_sample));
  EXPECT_DOUBLE_EQ(per_sample.time_ms, row.time_ms);
  EXPECT_DOUBLE_EQ(per_sample.stored_bytes, row.stored_bytes);
  EXPECT_DOUBLE_EQ(per_sample.peak_bytes, row.peak_bytes);
}

TEST(PackedAttentionCost, T5DecoderLayersPriceSelfAndCrossAttentionPerSample) {
  Fixture f = Make(varipipe::testing::SmallT5Dims());
  // One row: inputs 256 + 256 = 512, targets 64 + 64 = 128; cross-attention
  // over 256 x 64 per sample is priced as a 128 x 128 square.
  const PackedSamples packed{.rows = 1, .samples = {{256, 64}, {256, 64}}};
  absl::StatusOr<MicroBatchCostModel> cost =
      MicroBatchCostModel::Create(f.model, f.layout, Recompute::kNone, 1);
  ASSERT_THAT(cost, IsOk());
  MicroBatchCost row, per_sample;
  ASSERT_TRUE(cost->Evaluate(1, 512, 128, &row));
  ASSERT_TRUE(cost->Evaluate(1, 512, 128, &packed, &per_sample));
  Delta encoder, decoder;
  AddCore(f.dims, Recompute::kNone, 1, 512, {256, 256}, &encoder);
  AddCore(f.dims, Recompute::kNone, 1, 128, {64, 64}, &decoder);
  AddCore(f.dims, Recompute::kNone, 1, std::sqrt(512.0 * 128), {128, 128}, &decoder);
  // One device holds both stacks.
  const double want = row.time_ms + 4 * (encoder.forward + encoder.backward) +
                      4 * (decoder.forward + decoder.backward);
  EXPECT_NEAR(per_sample.time_ms, want, 1e-9 * row.time_ms);
  EXPECT_NEAR(per_sample.stored_bytes, row.stored_bytes + 4 * (encoder.stored + decoder.stored),
              1e-9 * row.stored_bytes);
  // Fewer scores kept. (Time need not drop: at these short lengths each
  // sample's kernel launches can outweigh the smaller products.)
  EXPECT_LT(per_sample.stored_bytes, row.stored_bytes);
}

// On the fused kernel in a 2-byte dtype the executor runs a packed row's
// attention as one variable-length call per layer (docs/executor.md): the
// samples' cores are priced as one launch over the same score area, not one
// launch each; T5V11 (a position bias: no variable-length kernel) keeps one
// launch per sample in its self-attention.
TEST(PackedAttentionCost, FusedKernelPricesPackedRowsAsOneLaunch) {
  ModelDims dims = varipipe::testing::Gpt67bDims();
  dims.attention_kernel = AttentionKernel::kFused;
  ASSERT_EQ(dims.dtype_bytes, 2u);
  const Fixture f = Make(dims);
  // One row of 2,048 tokens: sixteen samples of 128, so one launch over
  // 16 x 128^2 scores is a 512 x 512 square.
  PackedSamples packed{.rows = 1, .samples = {}};
  for (int i = 0; i < 16; ++i) packed.samples.push_back({128, 0});
  absl::StatusOr<MicroBatchCostModel> cost =
      MicroBatchCostModel::Create(f.model, f.layout, Recompute::kNone, 1);
  ASSERT_THAT(cost, IsOk());
  MicroBatchCost row, varlen;
  ASSERT_TRUE(cost->Evaluate(1, 2048, 0, &row));
  ASSERT_TRUE(cost->Evaluate(1, 2048, 0, &packed, &varlen));
  const CostValues launch = Core(dims, 1, 512);
  const CostValues whole = Core(dims, 1, 2048);
  const double layers = dims.encoder_layers;
  EXPECT_NEAR(varlen.forward_ms, row.forward_ms + layers * (launch.forward_ms - whole.forward_ms),
              1e-9 * row.time_ms);
  EXPECT_NEAR(varlen.backward_ms,
              row.backward_ms + layers * (launch.backward_ms - whole.backward_ms),
              1e-9 * row.time_ms);
  // Sixteen launches cost more than one over the same scores.
  Delta per_launch;
  AddCore(dims, Recompute::kNone, 1, 2048, std::vector<double>(16, 128), &per_launch);
  EXPECT_LT(varlen.forward_ms, row.forward_ms + layers * per_launch.forward);
  // Stored bytes: the samples' log-sum-exps either way.
  EXPECT_NEAR(varlen.stored_bytes, row.stored_bytes + layers * per_launch.stored,
              1e-9 * row.stored_bytes);

  // T5V11 on the same kernel: self-attention (a position bias) one launch
  // per sample, cross-attention one launch.
  ModelDims t5v11 = varipipe::testing::SmallT5Dims();
  t5v11.architecture = Architecture::kT5V11;
  t5v11.relative_attention_buckets = 32;
  t5v11.attention_kernel = AttentionKernel::kFused;
  const Fixture g = Make(t5v11);
  absl::StatusOr<MicroBatchCostModel> biased =
      MicroBatchCostModel::Create(g.model, g.layout, Recompute::kNone, 1);
  ASSERT_THAT(biased, IsOk());
  // Four samples of 256 inputs and 64 targets in one row.
  const PackedSamples t5_packed{.rows = 1,
                                .samples = {{256, 64}, {256, 64}, {256, 64}, {256, 64}}};
  MicroBatchCost t5_row, t5_per_sample;
  ASSERT_TRUE(biased->Evaluate(1, 1024, 256, &t5_row));
  ASSERT_TRUE(biased->Evaluate(1, 1024, 256, &t5_packed, &t5_per_sample));
  Delta encoder;
  AddCore(t5v11, Recompute::kNone, 1, 1024, {256, 256, 256, 256}, &encoder);
  Delta decoder;
  AddCore(t5v11, Recompute::kNone, 1, 256, {64, 64, 64, 64}, &decoder);
  // Cross-attention's four 128 x 128 squares as one launch of side 256.
  const CostValues cross_launch = Core(t5v11, 1, 256);
  const CostValues cross_whole = Core(t5v11, 1, std::sqrt(1024.0 * 256));
  decoder.forward += cross_launch.forward_ms - cross_whole.forward_ms;
  decoder.backward += cross_launch.backward_ms - cross_whole.backward_ms;
  EXPECT_NEAR(t5_per_sample.time_ms,
              t5_row.time_ms + t5v11.encoder_layers * (encoder.forward + encoder.backward) +
                  t5v11.decoder_layers * (decoder.forward + decoder.backward),
              1e-9 * t5_row.time_ms);
}

TEST(PackedAttentionCost, WithoutACoreGridPackedRowsCostTheirPaddedLength) {
  Fixture f = Make(varipipe::testing::Gpt67bDims());
  CostModel without;
  for (const auto& [key, grid] : f.model.grids()) {
    if (key.component == Component::kAttentionCore) continue;
    ASSERT_THAT(without.SetGrid(key.component, key.recompute, key.tensor_parallel, grid), IsOk());
  }
  absl::StatusOr<MicroBatchCostModel> cost =
      MicroBatchCostModel::Create(without, f.layout, Recompute::kNone, 1);
  ASSERT_THAT(cost, IsOk());
  EXPECT_FALSE(cost->prices_per_sample_attention());
  const PackedSamples packed{.rows = 1, .samples = {{512, 0}, {512, 0}}};
  MicroBatchCost row, per_sample;
  ASSERT_TRUE(cost->Evaluate(1, 1024, 0, &row));
  ASSERT_TRUE(cost->Evaluate(1, 1024, 0, &packed, &per_sample));
  EXPECT_DOUBLE_EQ(per_sample.time_ms, row.time_ms);
  EXPECT_DOUBLE_EQ(per_sample.stored_bytes, row.stored_bytes);
}

// End to end: the paper models' packing-only jobs planned both ways on
// documents-like samples (up to 2,048 tokens). The plans' packed
// micro-batches record the kernel they were priced with, and per-sample
// attention is predicted faster.
TEST(PackedAttentionCost, PackingPlansRecordTheirKernelAndPerSampleIsFaster) {
  for (bool t5 : {false, true}) {
    SCOPED_TRACE(t5 ? "T5" : "GPT");
    const SyntheticMixture mixture = SyntheticMixture::Documents(11);
    MiniBatch mb;
    uint64_t tokens = 0;
    for (uint64_t i = 0;; ++i) {
      SampleLengths s = mixture.Sample(i);
      s.target = std::min(s.target, t5 ? 512u : 2048u);
      s.input = std::min(s.input, t5 ? 2048u : 2048u - s.target);
      if (tokens + s.input + s.target > 65536) break;
      tokens += s.input + s.target;
      mb.sample_ids.push_back(i);
      mb.lengths.push_back(s);
    }
    double predicted[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
      v1::JobConfig config =
          varipipe::testing::PaperBenchmarkJob(t5, {v1::ONE_F_ONE_B, v1::ADAPTIVE});
      config.mutable_planner()->clear_partition_methods();
      config.mutable_planner()->add_partition_methods(v1::PACKING);
      const v1::PackedAttention kernel = k == 0 ? v1::PER_SAMPLE : v1::BLOCK_DIAGONAL_MASK;
      config.mutable_model()->set_packed_attention(kernel);
      absl::StatusOr<Planner> planner = Planner::Create(config);
      ASSERT_THAT(planner, IsOk());
      absl::StatusOr<PlanningResult> r = planner->Plan(mb);
      ASSERT_THAT(r, IsOk());
      int packed = 0;
      for (const v1::ExecutionPlan& plan : r->plans) {
        for (const v1::MicroBatch& m : plan.micro_batches()) {
          // A sample too long for the least recomputation beside others
          // may run alone, unpacked, under its own mode
          // (planner.uniform_recompute false).
          if (m.row_starts().empty()) {
            EXPECT_EQ(m.sample_ids_size(), 1);
            continue;
          }
          EXPECT_EQ(m.packed_attention(), kernel);
          ++packed;
        }
      }
      EXPECT_GT(packed, 0);
      predicted[k] = r->report.predicted_makespan_ms;
    }
    std::printf("%s packing: predicted makespan %.1f ms per sample, %.1f ms under the mask\n",
                t5 ? "T5-11B" : "GPT-6.7B", predicted[0], predicted[1]);
    EXPECT_LT(predicted[0], predicted[1]);
  }
}

// FASTEST_PER_MICRO_BATCH (the default): every packed micro-batch records
// the kernel it was priced with, never FASTEST itself, as PerSampleIsFaster
// decides. On the small search job's short FLAN-like samples the launches
// per sample outweigh what they save, so the mask is chosen; on the paper
// GPT's documents-like samples per sample is. Where every micro-batch
// chose the same kernel, the plan is that kernel's plan.
TEST(PackedAttentionCost, FastestRecordsTheKernelEachMicroBatchWasPricedWith) {
  struct Case {
    const char* name;
    v1::JobConfig config;
    MiniBatch mb;
  };
  std::vector<Case> cases;
  {
    v1::JobConfig config = varipipe::testing::SearchJobConfig(
        {.pp = 2, .tokens = 16384, .planner_extra = R"(, "partition_methods": ["PACKING"])"});
    const SyntheticMixture mixture = SyntheticMixture::Flan(5);
    uint64_t cursor = 0;
    cases.push_back({"small GPT, FLAN-like", config,
                     varipipe::testing::DrawMiniBatch(mixture, &cursor, 16384, 0, 256)});
  }
  {
    v1::JobConfig config = varipipe::testing::PaperBenchmarkJob(false, {v1::ONE_F_ONE_B});
    config.mutable_planner()->clear_partition_methods();
    config.mutable_planner()->add_partition_methods(v1::PACKING);
    const SyntheticMixture mixture = SyntheticMixture::Documents(5);
    MiniBatch mb;
    uint64_t tokens = 0;
    for (uint64_t i = 0;; ++i) {
      SampleLengths s = mixture.Sample(i);
      s.target = std::min(s.target, 2048u);
      s.input = std::min(s.input, 2048u - s.target);
      if (tokens + s.input + s.target > 65536) break;
      tokens += s.input + s.target;
      mb.sample_ids.push_back(i);
      mb.lengths.push_back(s);
    }
    cases.push_back({"GPT-6.7B, documents-like", config, mb});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::map<v1::PackedAttention, double> makespan;
    std::map<v1::PackedAttention, int> recorded;
    for (v1::PackedAttention kernel :
         {v1::FASTEST_PER_MICRO_BATCH, v1::PER_SAMPLE, v1::BLOCK_DIAGONAL_MASK}) {
      v1::JobConfig config = c.config;
      config.mutable_model()->set_packed_attention(kernel);
      absl::StatusOr<Planner> planner = Planner::Create(config);
      ASSERT_THAT(planner, IsOk());
      absl::StatusOr<PlanningResult> r = planner->Plan(c.mb);
      ASSERT_THAT(r, IsOk());
      makespan[kernel] = r->report.predicted_makespan_ms;
      if (kernel != v1::FASTEST_PER_MICRO_BATCH) continue;
      for (const v1::ExecutionPlan& plan : r->plans) {
        for (const v1::MicroBatch& m : plan.micro_batches()) {
          ASSERT_TRUE(m.packed_attention() == v1::PER_SAMPLE ||
                      m.packed_attention() == v1::BLOCK_DIAGONAL_MASK);
          ++recorded[m.packed_attention()];
        }
      }
    }
    std::printf(
        "%s: %d micro-batches per sample, %d under the mask; makespan %.2f ms (per sample "
        "%.2f, mask %.2f)\n",
        c.name, recorded[v1::PER_SAMPLE], recorded[v1::BLOCK_DIAGONAL_MASK],
        makespan[v1::FASTEST_PER_MICRO_BATCH], makespan[v1::PER_SAMPLE],
        makespan[v1::BLOCK_DIAGONAL_MASK]);
    if (recorded[v1::BLOCK_DIAGONAL_MASK] == 0) {
      EXPECT_DOUBLE_EQ(makespan[v1::FASTEST_PER_MICRO_BATCH], makespan[v1::PER_SAMPLE]);
    }
    if (recorded[v1::PER_SAMPLE] == 0) {
      EXPECT_DOUBLE_EQ(makespan[v1::FASTEST_PER_MICRO_BATCH], makespan[v1::BLOCK_DIAGONAL_MASK]);
    }
    EXPECT_LE(makespan[v1::FASTEST_PER_MICRO_BATCH],
              std::max(makespan[v1::PER_SAMPLE], makespan[v1::BLOCK_DIAGONAL_MASK]));
  }
}

}  // namespace
}  // namespace varipipe::planner
