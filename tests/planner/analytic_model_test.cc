#include "planner/cost/analytic_model.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/cost/hardware.h"
#include "tests/testing/paper_models.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::planner {
namespace {

using ::varipipe::testing::Gpt67bDims;
using ::varipipe::testing::IsOk;

ModelDims T5Small() {
  return {.kind = ModelKind::kT5,
          .encoder_layers = 4,
          .decoder_layers = 4,
          .hidden = 512,
          .heads = 8,
          .kv_channels = 64,
          .ffn = 2048,
          .vocab = 32128,
          .dtype_bytes = 2};
}

// With A = h and f = 4h the FLOPs are Megatron's 24 b s h^2 + 4 b s^2 h.
TEST(AnalyticModel, FlopsMatchMegatronsFormula) {
  const ModelDims d = Gpt67bDims();
  const double b = 4, s = 1024, h = 4096;
  EXPECT_DOUBLE_EQ(EncoderLayerForwardFlops(d, b, s, 1), 24 * b * s * h * h + 4 * b * s * s * h);
  EXPECT_DOUBLE_EQ(EncoderLayerForwardFlops(d, b, s, 2),
                   (24 * b * s * h * h + 4 * b * s * s * h) / 2);
}

// Korthikanti et al., section 4: s b h (34 + 5 a s / h) without
// recomputation, 34 s b h with selective, 2 s b h with full (16-bit).
TEST(AnalyticModel, ActivationMemoryMatchesKorthikanti) {
  const ModelDims d = Gpt67bDims();
  const double b = 2, s = 2048, h = 4096, a = 32;
  EXPECT_DOUBLE_EQ(EncoderLayerStoredBytes(d, Recompute::kNone, b, s, 1),
                   s * b * h * (34 + 5 * a * s / h));
  EXPECT_DOUBLE_EQ(EncoderLayerStoredBytes(d, Recompute::kSelective, b, s, 1), 34 * s * b * h);
  EXPECT_DOUBLE_EQ(EncoderLayerStoredBytes(d, Recompute::kFull, b, s, 1), 2 * s * b * h);
  // Tensor parallel t: s b h (10 + 24 / t + 5 a s / (h t)).
  EXPECT_DOUBLE_EQ(EncoderLayerStoredBytes(d, Recompute::kNone, b, s, 4),
                   s * b * h * (10 + 24.0 / 4 + 5 * a * s / (h * 4)));
}

TEST(AnalyticModel, DecoderLayerAddsCrossAttention) {
  const ModelDims d = T5Small();
  EXPECT_GT(DecoderLayerForwardFlops(d, 4, 64, 512, 1), EncoderLayerForwardFlops(d, 4, 64, 1));
  EXPECT_GT(DecoderLayerForwardFlops(d, 4, 64, 1024, 1),
            DecoderLayerForwardFlops(d, 4, 64, 512, 1));
  EXPECT_GT(DecoderLayerStoredBytes(d, Recompute::kNone, 4, 64, 512, 1),
            EncoderLayerStoredBytes(d, Recompute::kNone, 4, 64, 1));
}

TEST(AnalyticModel, ParametersOfGpt67bAddUp) {
  const ModelDims d = Gpt67bDims();
  const double total = 32 * ComponentParameters(d, Component::kEncoderLayer, 1, 2048) +
                       ComponentParameters(d, Component::kEmbedding, 1, 2048);
  EXPECT_NEAR(total / 1e9, 6.65, 0.1);
}

TEST(AnalyticModel, RecomputationTradesTimeForMemory) {
  absl::StatusOr<Hardware> hw = HardwarePreset("a100-40gb");
  ASSERT_THAT(hw, IsOk());
  const ModelDims d = Gpt67bDims();
  const CostValues none =
      AnalyticComponentCost(d, *hw, Component::kEncoderLayer, Recompute::kNone, 1, 4, 1024, 0);
  const CostValues selective =
      AnalyticComponentCost(d, *hw, Component::kEncoderLayer, Recompute::kSelective, 1, 4, 1024, 0);
  const CostValues full =
      AnalyticComponentCost(d, *hw, Component::kEncoderLayer, Recompute::kFull, 1, 4, 1024, 0);
  EXPECT_DOUBLE_EQ(none.forward_ms, full.forward_ms);
  EXPECT_LT(none.backward_ms, selective.backward_ms);
  EXPECT_LT(selective.backward_ms, full.backward_ms);
  EXPECT_GT(none.stored_bytes, selective.stored_bytes);
  EXPECT_GT(selective.stored_bytes, full.stored_bytes);
  EXPECT_GE(none.peak_bytes, none.stored_bytes);
  // Backward is about twice the forward without recomputation.
  EXPECT_NEAR(none.backward_ms / none.forward_ms, 2.0, 0.1);
}

TEST(AnalyticModel, PresetsAreOrderedBySpeed) {
  const ModelDims d = Gpt67bDims();
  double previous = 1e300;
  for (const char* name : {"a100-40gb", "a100-80gb", "h100-80gb", "h200"}) {
    absl::StatusOr<Hardware> hw = HardwarePreset(name);
    ASSERT_THAT(hw, IsOk()) << name;
    const double t =
        AnalyticComponentCost(d, *hw, Component::kEncoderLayer, Recompute::kNone, 1, 8, 2048, 0)
            .forward_ms;
    EXPECT_LE(t, previous) << name;
    previous = t;
  }
  EXPECT_FALSE(HardwarePreset("tpu").ok());
  EXPECT_TRUE(HardwarePreset("H100-80GB").ok());  // case-insensitive
}

// A 4096-token forward pass of one GPT-6.7B layer on an A100 takes about
// 11 ms: 24 b s h^2 + 4 b s^2 h = 1.8 TFLOP at ~55% of 312 TFLOP/s.
TEST(AnalyticModel, MagnitudeIsPlausible) {
  absl::StatusOr<Hardware> hw = HardwarePreset("a100-40gb");
  ASSERT_THAT(hw, IsOk());
  const CostValues v = AnalyticComponentCost(Gpt67bDims(), *hw, Component::kEncoderLayer,
                                             Recompute::kNone, 1, 2, 2048, 0);
  EXPECT_GT(v.forward_ms, 9.0);
  EXPECT_LT(v.forward_ms, 16.0);
}

TEST(AnalyticModel, GridReproducesTheFormulaAtGridPoints) {
  absl::StatusOr<Hardware> hw = HardwarePreset("h100-80gb");
  ASSERT_THAT(hw, IsOk());
  const ModelDims d = T5Small();
  AnalyticGridOptions options{.max_micro_batch_size = 64, .max_seq_len = 512};
  absl::StatusOr<CostModel> model = BuildAnalyticCostModel(d, *hw, options);
  ASSERT_THAT(model, IsOk());
  EXPECT_THAT(model->CheckUsable(ModelKind::kT5, 1), IsOk());
  const ProfileGrid* dec = model->Grid(Component::kDecoderLayer, Recompute::kSelective, 1);
  ASSERT_NE(dec, nullptr);
  for (uint32_t b : {1u, 8u, 64u}) {
    for (uint32_t s : {8u, 128u, 512u}) {
      for (uint32_t e : {16u, 512u}) {
        CostValues v;
        ASSERT_TRUE(dec->Lookup(b, s, e, &v));
        EXPECT_EQ(v, AnalyticComponentCost(d, *hw, Component::kDecoderLayer, Recompute::kSelective,
                                           1, b, s, e));
      }
    }
  }
  CostValues v;
  EXPECT_FALSE(dec->Lookup(65, 8, 16, &v));  // beyond the grid
}

}  // namespace
}  // namespace varipipe::planner
