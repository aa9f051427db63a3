#include "planner/cost/memory_model.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/cost/analytic_model.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::planner {
namespace {

using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

// The executor's layout: fp32 parameters, gradients and AdamW moments.
TEST(ModelState, TheExecutorKeeps16BytesPerParameter) {
  const ModelStateBytes s = ModelStatePerDevice(1e9, ZeroStage::k0, 8);
  EXPECT_DOUBLE_EQ(s.parameters, 4e9);
  EXPECT_DOUBLE_EQ(s.gradients, 4e9);
  EXPECT_DOUBLE_EQ(s.optimizer, 8e9);
  EXPECT_DOUBLE_EQ(s.total(), 16e9);
}

// With N_d = 64, stages 1/2/3 keep 8 + 8/64, 4 + 12/64 and 16/64 bytes per
// parameter (the ZeRO paper's Figure 1 with the executor's layout).
TEST(ModelState, ZeroStagesShardAcrossDataParallel) {
  EXPECT_DOUBLE_EQ(ModelStatePerDevice(64, ZeroStage::k1, 64).total(), 8 * 64 + 8);
  EXPECT_DOUBLE_EQ(ModelStatePerDevice(64, ZeroStage::k2, 64).total(), 4 * 64 + 12);
  EXPECT_DOUBLE_EQ(ModelStatePerDevice(64, ZeroStage::k3, 64).total(), 16);
}

ModelDims Gpt() {
  return {.kind = ModelKind::kGpt,
          .encoder_layers = 32,
          .hidden = 4096,
          .heads = 32,
          .kv_channels = 128,
          .ffn = 16384,
          .vocab = 50432,
          .dtype_bytes = 2};
}

TEST(StageLayout, SplitsLayersAndT5Devices) {
  absl::StatusOr<StageLayout> gpt = MakeStageLayout(Gpt(), 4, 1);
  ASSERT_THAT(gpt, IsOk());
  EXPECT_EQ(gpt->encoder_layers_per_device, 8u);
  ModelDims t5 = Gpt();
  t5.kind = ModelKind::kT5;
  t5.encoder_layers = 24;
  t5.decoder_layers = 24;
  absl::StatusOr<StageLayout> l = MakeStageLayout(t5, 8, 1);
  ASSERT_THAT(l, IsOk());
  EXPECT_EQ(l->encoder_devices, 4u);
  EXPECT_EQ(l->encoder_layers_per_device, 6u);
  EXPECT_EQ(l->decoder_layers_per_device, 6u);
  EXPECT_THAT(MakeStageLayout(Gpt(), 64, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cannot fill")));
}

TEST(Available, SubtractsTheBusiestDevicesModelState) {
  absl::StatusOr<Hardware> hw = HardwarePreset("a100-40gb");
  ASSERT_THAT(hw, IsOk());
  absl::StatusOr<CostModel> model =
      BuildAnalyticCostModel(Gpt(), *hw, {.max_micro_batch_size = 4, .max_seq_len = 64});
  ASSERT_THAT(model, IsOk());
  absl::StatusOr<StageLayout> layout = MakeStageLayout(Gpt(), 4, 1);
  ASSERT_THAT(layout, IsOk());
  const double params = MaxParametersPerDevice(*model, *layout);
  // 8 layers plus the larger end: the embedding with its 64 position rows
  // (the LM head copy has the vocabulary's rows and the final LayerNorm).
  EXPECT_DOUBLE_EQ(model->Parameters(Component::kEmbedding), (50432.0 + 64) * 4096);
  EXPECT_DOUBLE_EQ(params, 8 * model->Parameters(Component::kEncoderLayer) +
                               model->Parameters(Component::kEmbedding));
  const double limit = 40.0 * (1 << 30);
  absl::StatusOr<double> available =
      AvailableActivationBytes(*model, *layout, ZeroStage::k0, 1, limit);
  ASSERT_THAT(available, IsOk());
  EXPECT_DOUBLE_EQ(*available, limit - 16 * params);
  // Pipeline 1 does not fit a 6.7B model with Adam in 40 GiB.
  absl::StatusOr<StageLayout> single = MakeStageLayout(Gpt(), 1, 1);
  ASSERT_THAT(single, IsOk());
  EXPECT_THAT(AvailableActivationBytes(*model, *single, ZeroStage::k0, 1, limit),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("model state alone")));
}

}  // namespace
}  // namespace varipipe::planner
