#include "planner/cost/memory_model.h"

#include <algorithm>
#include <vector>

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

// A listed layout moves layers between devices: each device's parameters
// follow its own layers, and the busiest device bounds the room.
TEST(StageLayout, FollowsAListedLayout) {
  absl::StatusOr<Hardware> hw = HardwarePreset("a100-40gb");
  ASSERT_THAT(hw, IsOk());
  absl::StatusOr<CostModel> model =
      BuildAnalyticCostModel(Gpt(), *hw, {.max_micro_batch_size = 4, .max_seq_len = 64});
  ASSERT_THAT(model, IsOk());
  const LayerLayout listed{.encoder = {7, 9, 9, 7}, .decoder = {0, 0, 0, 0}};
  absl::StatusOr<StageLayout> layout = MakeStageLayout(Gpt(), 4, 1, &listed);
  ASSERT_THAT(layout, IsOk());
  EXPECT_EQ(layout->encoder_layers_per_device, 9u);
  EXPECT_EQ(layout->StageEncoderLayers(3, 4), 7u);
  const double layer = model->Parameters(Component::kEncoderLayer);
  const std::vector<double> params = ParametersPerDevice(*model, *layout);
  ASSERT_EQ(params.size(), 4u);
  EXPECT_DOUBLE_EQ(params[0], 7 * layer + model->Parameters(Component::kEmbedding));
  EXPECT_DOUBLE_EQ(params[1], 9 * layer);
  EXPECT_DOUBLE_EQ(params[3], 7 * layer + model->Parameters(Component::kPostprocess));
  EXPECT_DOUBLE_EQ(MaxParametersPerDevice(*model, *layout),
                   std::max({params[0], params[1], params[3]}));
  // Interleaved chunks: a device holds its chunks' layers together.
  const LayerLayout chunks{.encoder = {5, 3, 3, 5, 4, 4, 4, 4},
                           .decoder = std::vector<uint32_t>(8, 0)};
  absl::StatusOr<StageLayout> interleaved = MakeStageLayout(Gpt(), 4, 2, &chunks);
  ASSERT_THAT(interleaved, IsOk());
  EXPECT_EQ(interleaved->DeviceEncoderLayers(0), 9u);
  EXPECT_EQ(interleaved->StageEncoderLayers(5, 8), 4u);
  EXPECT_EQ(interleaved->StageEncoderLayers(1, 4), 7u);  // without interleaving: device 1
  // A layout that does not cover the model is refused, naming it.
  const LayerLayout short_one{.encoder = {8, 8, 8, 7}, .decoder = {0, 0, 0, 0}};
  EXPECT_THAT(MakeStageLayout(Gpt(), 4, 1, &short_one),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stage layout 8+8+8+7")));
  // T5: the first decoder device holds the decoder's embedding.
  ModelDims t5 = Gpt();
  t5.kind = ModelKind::kT5;
  t5.encoder_layers = 4;
  t5.decoder_layers = 2;
  const LayerLayout t5_listed{.encoder = {2, 1, 1, 0}, .decoder = {0, 0, 0, 2}};
  absl::StatusOr<StageLayout> t5_layout = MakeStageLayout(t5, 4, 1, &t5_listed);
  ASSERT_THAT(t5_layout, IsOk());
  EXPECT_EQ(t5_layout->encoder_devices, 3u);
  EXPECT_EQ(t5_layout->decoder_layers_per_device, 2u);
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
  // Less each device's bf16 copy of its linear weights: the last device's
  // holds the head's [V, h] too (the first's embedding is no linear layer),
  // which makes the last device the busiest.
  const double layers_copy = 2 * 8 * LinearParameters(Gpt(), Component::kEncoderLayer, 1);
  const double head_copy = 2 * 50432.0 * 4096;
  EXPECT_DOUBLE_EQ(ComputeCopyBytesPerDevice(*layout)[0], layers_copy);
  EXPECT_DOUBLE_EQ(ComputeCopyBytesPerDevice(*layout)[3], layers_copy + head_copy);
  const double last = ParametersPerDevice(*model, *layout)[3];
  EXPECT_GT(16 * last + layers_copy + head_copy, 16 * params + layers_copy);
  EXPECT_DOUBLE_EQ(*available, limit - 16 * last - layers_copy - head_copy);
  // Pipeline 1 does not fit a 6.7B model with Adam in 40 GiB.
  absl::StatusOr<StageLayout> single = MakeStageLayout(Gpt(), 1, 1);
  ASSERT_THAT(single, IsOk());
  EXPECT_THAT(AvailableActivationBytes(*model, *single, ZeroStage::k0, 1, limit),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("model state alone")));
}

// Under a 16-bit dtype each device keeps one compute-dtype copy of its
// linear layers' weights and biases (the last device also the head's
// weight, tied or not) beside the fp32 state; none in fp32.
TEST(Available, ComputeDtypeCopyOfTheLinearWeights) {
  const ModelDims bf16 = Gpt();
  ModelDims fp32 = Gpt();
  fp32.dtype_bytes = 4;
  const double h = bf16.hidden;
  // A MEGATRON layer less its two LayerNorms; the head [V, h].
  const double layer = ComponentParameters(bf16, Component::kEncoderLayer, 1, 0);
  EXPECT_DOUBLE_EQ(LinearParameters(bf16, Component::kEncoderLayer, 1), layer - 4 * h);
  EXPECT_DOUBLE_EQ(LinearParameters(bf16, Component::kPostprocess, 1), 50432.0 * h);
  EXPECT_DOUBLE_EQ(LinearParameters(bf16, Component::kEmbedding, 1), 0);
  EXPECT_DOUBLE_EQ(LinearParameters(bf16, Component::kPostprocess, 2), 25216.0 * h);
  absl::StatusOr<StageLayout> layout = MakeStageLayout(bf16, 4, 1);
  ASSERT_THAT(layout, IsOk());
  const std::vector<double> copies = ComputeCopyBytesPerDevice(*layout);
  ASSERT_EQ(copies.size(), 4u);
  for (int d = 0; d < 3; ++d) EXPECT_DOUBLE_EQ(copies[d], 2 * 8 * (layer - 4 * h));
  EXPECT_DOUBLE_EQ(copies[3], 2 * (8 * (layer - 4 * h) + 50432.0 * h));
  absl::StatusOr<StageLayout> single = MakeStageLayout(fp32, 4, 1);
  ASSERT_THAT(single, IsOk());
  for (double c : ComputeCopyBytesPerDevice(*single)) EXPECT_EQ(c, 0);
  // The room of each device is less its copy.
  absl::StatusOr<Hardware> hw = HardwarePreset("a100-80gb");
  ASSERT_THAT(hw, IsOk());
  absl::StatusOr<CostModel> model =
      BuildAnalyticCostModel(bf16, *hw, {.max_micro_batch_size = 4, .max_seq_len = 64});
  ASSERT_THAT(model, IsOk());
  const double limit = 80.0 * (1 << 30);
  absl::StatusOr<std::vector<double>> rooms =
      AvailableActivationBytesPerDevice(*model, *layout, ZeroStage::k0, 1, limit);
  ASSERT_THAT(rooms, IsOk());
  const std::vector<double> params = ParametersPerDevice(*model, *layout);
  for (int d = 0; d < 4; ++d) {
    EXPECT_DOUBLE_EQ((*rooms)[d], limit - 16 * params[d] - copies[d]) << d;
  }
  // LLAMA with a tied head: the last device's copy still holds the head.
  ModelDims llama = bf16;
  llama.architecture = Architecture::kLlama;
  llama.tied_embeddings = true;
  absl::StatusOr<StageLayout> tied = MakeStageLayout(llama, 2, 1);
  ASSERT_THAT(tied, IsOk());
  const double llama_layer = LinearParameters(llama, Component::kEncoderLayer, 1);
  EXPECT_DOUBLE_EQ(llama_layer, ComponentParameters(llama, Component::kEncoderLayer, 1, 0) - 2 * h);
  EXPECT_DOUBLE_EQ(ComputeCopyBytesPerDevice(*tied)[1], 2 * (16 * llama_layer + 50432.0 * h));
}

}  // namespace
}  // namespace varipipe::planner
