// The loss head is priced on the labelled tokens only (micro_batch_cost.h):
// its times and transient at the grid's equivalent point (b, n / b), its
// stored bytes at (b, s) less HeadLabelledTokenBytes per unlabelled
// position. Checked against AnalyticHeadCost at grid points; a GPT
// supervised micro-batch's head grows with its targets, not its inputs; T5
// with unpadded targets and every caller without counts are unchanged.
// kLeastHead bounds every labelled count from below (the DP's bounds); a
// prepared Batch and EvaluateStages price the head as Evaluate does.
#include <cstdint>
#include <random>
#include <vector>

#include "common/dataset/synthetic_mixture.h"
#include "gtest/gtest.h"
#include "planner/cost/analytic_model.h"
#include "planner/cost/hardware.h"
#include "planner/cost/memory_model.h"
#include "planner/cost/micro_batch_cost.h"
#include "planner/microbatch/micro_batch.h"
#include "tests/testing/paper_models.h"
#include "tests/testing/seed.h"
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

// A GPT micro-batch of one row per sample, padded to `padded`.
MicroBatchGroup Rows(uint32_t count, uint32_t padded) {
  MicroBatchGroup g;
  for (uint32_t i = 0; i < count; ++i) g.samples.push_back(i);
  g.input_len = padded;
  return g;
}

MicroBatchCost Price(const MicroBatchCostModel& m, const MicroBatchGroup& g, double labelled) {
  MicroBatchCost cost;
  EXPECT_TRUE(m.Evaluate(static_cast<uint32_t>(g.size()), g.input_len, g.target_len, nullptr,
                         labelled, &cost));
  return cost;
}

TEST(LabelledHeadCost, AnalyticHeadIsTheComponentWithEveryPositionLabelled) {
  const ModelDims d = varipipe::testing::Gpt67bDims();
  for (uint32_t tp : {1u, 2u}) {
    const TensorLink link{.gbps = 300};
    const CostValues all = AnalyticComponentCost(d, A100(), Component::kPostprocess,
                                                 Recompute::kNone, tp, 4, 512, 0, link);
    const CostValues same = AnalyticHeadCost(d, A100(), tp, 4, 512, 4 * 512, link);
    EXPECT_EQ(all, same);
    // stored = (B h + 8) b s + HeadLabelledTokenBytes * n.
    const CostValues part = AnalyticHeadCost(d, A100(), tp, 4, 512, 256, link);
    EXPECT_DOUBLE_EQ(part.stored_bytes,
                     all.stored_bytes - HeadLabelledTokenBytes(d) * (4 * 512 - 256));
    EXPECT_LT(part.forward_ms, all.forward_ms);
    EXPECT_LT(part.backward_ms, all.backward_ms);
  }
}

TEST(LabelledHeadCost, GptSupervisedHeadGrowsWithTargetsNotInputs) {
  const Fixture f = Make(varipipe::testing::Gpt67bDims());
  absl::StatusOr<MicroBatchCostModel> m =
      MicroBatchCostModel::Create(f.model, f.layout, Recompute::kNone, 1);
  ASSERT_THAT(m, IsOk());
  // Four rows padded to 1024: long inputs, targets of 64 or 32 tokens, and
  // shorter inputs with the same 64-token targets.
  const std::vector<SampleLengths> long64(4, {.input = 960, .target = 64});
  const std::vector<SampleLengths> long32(4, {.input = 992, .target = 32});
  const std::vector<SampleLengths> short64(4, {.input = 700, .target = 64});
  const MicroBatchGroup g = Rows(4, 1024);
  const uint64_t n64 = LabelledTokens(g, long64, false);
  const uint64_t n32 = LabelledTokens(g, long32, false);
  ASSERT_EQ(n64, 256u);
  ASSERT_EQ(n32, 128u);
  ASSERT_EQ(LabelledTokens(g, short64, false), n64);
  const MicroBatchCost all = Price(*m, g, MicroBatchCostModel::kEveryPosition);
  const MicroBatchCost c64 = Price(*m, g, n64);
  const MicroBatchCost c32 = Price(*m, g, n32);
  EXPECT_LT(c32.time_ms, c64.time_ms);
  EXPECT_LT(c64.time_ms, all.time_ms);
  EXPECT_LT(c32.stored_bytes, c64.stored_bytes);
  EXPECT_LT(c64.peak_bytes, all.peak_bytes);
  const MicroBatchCost s64 = Price(*m, g, LabelledTokens(g, short64, false));
  EXPECT_EQ(s64.time_ms, c64.time_ms);
  EXPECT_EQ(s64.stored_bytes, c64.stored_bytes);
  // One device: the micro-batch changes by exactly the head's change, and
  // n / b = 64 and 32 are grid lengths, so that is AnalyticHeadCost's.
  const CostValues head = AnalyticComponentCost(f.dims, A100(), Component::kPostprocess,
                                                Recompute::kNone, 1, 4, 1024, 0);
  for (const auto& [n, cost] : {std::pair{n64, c64}, std::pair{n32, c32}}) {
    const CostValues part = AnalyticHeadCost(f.dims, A100(), 1, 4, 1024, n);
    EXPECT_NEAR(all.forward_ms - cost.forward_ms, head.forward_ms - part.forward_ms,
                1e-9 * all.forward_ms);
    EXPECT_NEAR(all.backward_ms - cost.backward_ms, head.backward_ms - part.backward_ms,
                1e-9 * all.backward_ms);
    EXPECT_NEAR(all.stored_bytes - cost.stored_bytes, head.stored_bytes - part.stored_bytes,
                1e-9 * all.stored_bytes);
  }
}

TEST(LabelledHeadCost, CallersWithoutCountsAreUnchanged) {
  const Fixture f = Make(varipipe::testing::Gpt67bDims());
  absl::StatusOr<MicroBatchCostModel> m =
      MicroBatchCostModel::Create(f.model, f.layout, Recompute::kSelective, 1);
  ASSERT_THAT(m, IsOk());
  MicroBatchCostModel::Row row;
  ASSERT_TRUE(m->PrepareRow(512, 0, &row));
  MicroBatchCost plain, every, full;
  ASSERT_TRUE(m->Evaluate(row, 8, &plain));
  ASSERT_TRUE(m->Evaluate(row, 8, MicroBatchCostModel::kEveryPosition, &every));
  ASSERT_TRUE(m->Evaluate(row, 8, 8.0 * 512, &full));
  for (const MicroBatchCost& c : {every, full}) {
    EXPECT_EQ(c.time_ms, plain.time_ms);
    EXPECT_EQ(c.stored_bytes, plain.stored_bytes);
    EXPECT_EQ(c.peak_bytes, plain.peak_bytes);
  }
  // Plain language-model data labels every position but the first.
  const std::vector<SampleLengths> plain_lm(8, {.input = 512, .target = 0});
  EXPECT_EQ(LabelledTokens(Rows(8, 512), plain_lm, false), 8u * 511);
}

TEST(LabelledHeadCost, T5LabelsEveryTargetToken) {
  const Fixture f = Make(varipipe::testing::SmallT5Dims());
  absl::StatusOr<MicroBatchCostModel> m =
      MicroBatchCostModel::Create(f.model, f.layout, Recompute::kNone, 1);
  ASSERT_THAT(m, IsOk());
  MicroBatchGroup g = Rows(4, 512);
  g.target_len = 128;
  // Unpadded targets: every target position is labelled, as before.
  const std::vector<SampleLengths> full(4, {.input = 500, .target = 128});
  ASSERT_EQ(LabelledTokens(g, full, true), 4u * 128);
  const MicroBatchCost before = Price(*m, g, MicroBatchCostModel::kEveryPosition);
  const MicroBatchCost labelled = Price(*m, g, LabelledTokens(g, full, true));
  EXPECT_EQ(labelled.time_ms, before.time_ms);
  EXPECT_EQ(labelled.stored_bytes, before.stored_bytes);
  EXPECT_EQ(labelled.peak_bytes, before.peak_bytes);
  // Padded targets carry no label: the head is priced on the real ones.
  const std::vector<SampleLengths> padded(4, {.input = 500, .target = 64});
  const MicroBatchCost shorter = Price(*m, g, LabelledTokens(g, padded, true));
  EXPECT_LT(shorter.time_ms, before.time_ms);
  EXPECT_LT(shorter.stored_bytes, before.stored_bytes);
}


TEST(LabelledHeadCost, LeastHeadBoundsEveryLabelledCount) {
  std::mt19937 rng(varipipe::testing::TestSeed("LabelledHeadCost.LeastHeadBoundsEveryLabelledCount"));
  int checked = 0;
  for (const ModelDims& dims : {varipipe::testing::Gpt67bDims(), varipipe::testing::SmallT5Dims()}) {
    const Fixture f = Make(dims);
    // One device, and the head on the last of several (T5: on the only
    // decoder device, and on the last of two).
    for (const auto& [pipeline, mode] : {std::pair{1u, Recompute::kNone},
                                         std::pair{2u, Recompute::kFull},
                                         std::pair{3u, Recompute::kNone}}) {
      absl::StatusOr<StageLayout> layout = MakeStageLayout(dims, pipeline, 1);
      ASSERT_THAT(layout, IsOk());
      absl::StatusOr<MicroBatchCostModel> m = MicroBatchCostModel::Create(f.model, *layout, mode, 1);
      ASSERT_THAT(m, IsOk());
      for (int trial = 0; trial < 200; ++trial) {
        const uint32_t b = 1 + rng() % 16;
        const uint32_t input = 1 + rng() % 2048;
        const uint32_t target = dims.encoder_decoder() ? 1 + rng() % 2048 : 0;
        const uint32_t head_len = dims.encoder_decoder() ? target : input;
        MicroBatchCostModel::Row row;
        ASSERT_TRUE(m->PrepareRow(input, target, &row));
        MicroBatchCost least;
        ASSERT_TRUE(m->Evaluate(row, b, MicroBatchCostModel::kLeastHead, &least));
        MicroBatchCostModel::Batch batch;
        ASSERT_TRUE(m->PrepareBatch(row, b, &batch));
        for (double n : {0.0, 1.0, static_cast<double>(rng() % (b * head_len + 1)),
                         static_cast<double>(b) * head_len, MicroBatchCostModel::kEveryPosition}) {
          MicroBatchCost priced;
          ASSERT_TRUE(m->Evaluate(row, b, n, &priced));
          EXPECT_LE(least.time_ms, priced.time_ms * (1 + 1e-12)) << b << " x " << head_len;
          EXPECT_LE(least.stored_bytes, priced.stored_bytes * (1 + 1e-12));
          EXPECT_LE(least.peak_bytes, priced.peak_bytes * (1 + 1e-12));
          // A prepared batch gives the same cost.
          MicroBatchCost prepared;
          ASSERT_TRUE(m->Evaluate(batch, n, &prepared));
          EXPECT_EQ(prepared.time_ms, priced.time_ms);
          EXPECT_EQ(prepared.forward_ms, priced.forward_ms);
          EXPECT_EQ(prepared.stored_bytes, priced.stored_bytes);
          EXPECT_EQ(prepared.peak_bytes, priced.peak_bytes);
          EXPECT_EQ(prepared.depth_stored_bytes, priced.depth_stored_bytes);
          EXPECT_EQ(prepared.class_stored_bytes, priced.class_stored_bytes);
          EXPECT_EQ(prepared.class_transient_bytes, priced.class_transient_bytes);
          ++checked;
        }
        // The bound is attained at some count (no looser than it must be):
        // below the head's unlabelled price.
        MicroBatchCost none;
        ASSERT_TRUE(m->Evaluate(row, b, 0, &none));
        EXPECT_LE(least.time_ms, none.time_ms);
      }
    }
  }
  std::printf("checked %d labelled counts against the least head\n", checked);
}

TEST(LabelledHeadCost, StagesPriceTheHeadAtItsLabelledTokens) {
  const Fixture one = Make(varipipe::testing::Gpt67bDims());
  absl::StatusOr<StageLayout> layout = MakeStageLayout(one.dims, 4, 1);
  ASSERT_THAT(layout, IsOk());
  absl::StatusOr<MicroBatchCostModel> m =
      MicroBatchCostModel::Create(one.model, *layout, Recompute::kNone, 1);
  ASSERT_THAT(m, IsOk());
  std::vector<StageOpCost> all;
  std::vector<StageOpCost> labelled;
  ASSERT_TRUE(m->EvaluateStages(4, 1024, 0, nullptr, 1, one.dims.hidden, one.dims.dtype_bytes,
                                &all));
  ASSERT_TRUE(m->EvaluateStages(4, 1024, 0, nullptr, 256.0, 1, one.dims.hidden,
                                one.dims.dtype_bytes, &labelled));
  ASSERT_EQ(all.size(), 4u);
  // Only the last stage holds the head; it changes by the head's change.
  for (size_t s = 0; s + 1 < all.size(); ++s) {
    EXPECT_EQ(labelled[s].forward_ms, all[s].forward_ms);
    EXPECT_EQ(labelled[s].stored_bytes, all[s].stored_bytes);
  }
  MicroBatchCost c_all;
  MicroBatchCost c_256;
  ASSERT_TRUE(m->Evaluate(4, 1024, 0, nullptr, MicroBatchCostModel::kEveryPosition, &c_all));
  ASSERT_TRUE(m->Evaluate(4, 1024, 0, nullptr, 256.0, &c_256));
  EXPECT_LT(labelled[3].forward_ms + labelled[3].backward_ms,
            all[3].forward_ms + all[3].backward_ms);
  EXPECT_NEAR(all[3].stored_bytes - labelled[3].stored_bytes,
              c_all.class_stored_bytes[kLastDevice] - c_256.class_stored_bytes[kLastDevice],
              1e-9 * all[3].stored_bytes);
  EXPECT_NEAR(all[3].forward_ms - labelled[3].forward_ms, c_all.forward_ms - c_256.forward_ms,
              1e-9 * all[3].forward_ms);
}

}  // namespace
}  // namespace varipipe::planner
