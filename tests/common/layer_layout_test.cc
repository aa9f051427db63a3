#include "common/config/layer_layout.h"

#include <algorithm>
#include <cstdint>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace varipipe {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

constexpr LayerCounts kGpt{.encoder_layers = 4};
constexpr LayerCounts kT5{.encoder_decoder = true, .encoder_layers = 4, .decoder_layers = 2};

v1::StageLayoutConfig Listed(std::initializer_list<uint32_t> layers, uint32_t encoder_stages) {
  v1::StageLayoutConfig config;
  config.set_mode(v1::LISTED);
  for (uint32_t l : layers) config.add_layers(l);
  config.set_encoder_stages(encoder_stages);
  return config;
}

TEST(EvenLayerLayoutTest, SplitsEvenlyAndCoversEveryLayer) {
  for (uint32_t layers = 1; layers <= 40; ++layers) {
    for (uint32_t stages = 1; stages <= layers; ++stages) {
      absl::StatusOr<LayerLayout> layout = EvenLayerLayout({.encoder_layers = layers}, stages);
      ASSERT_THAT(layout, IsOk()) << layers << " layers, " << stages << " stages";
      ASSERT_EQ(layout->stages(), stages);
      uint32_t next = 0;
      for (uint32_t s = 0; s < stages; ++s) {
        ASSERT_EQ(layout->FirstEncoderLayer(s), next) << layers << " layers, stage " << s;
        next += layout->encoder[s];
        EXPECT_EQ(layout->decoder[s], 0u);
      }
      EXPECT_EQ(next, layers);
      const auto [smallest, largest] =
          std::minmax_element(layout->encoder.begin(), layout->encoder.end());
      EXPECT_EQ(*largest, (layers + stages - 1) / stages);
      EXPECT_LE(*largest - *smallest, 1u);
      EXPECT_EQ(layout->encoder.front(), *largest);  // the first stages take the remainder
    }
  }
}

TEST(EvenLayerLayoutTest, T5SplitsStagesByLayerShare) {
  absl::StatusOr<LayerLayout> layout =
      EvenLayerLayout({.encoder_decoder = true, .encoder_layers = 24, .decoder_layers = 24}, 8);
  ASSERT_THAT(layout, IsOk());
  EXPECT_EQ(layout->encoder_stages(), 4u);
  EXPECT_EQ(layout->ToString(), "encoder 6+6+6+6 | decoder 6+6+6+6");
  absl::StatusOr<LayerLayout> single = EvenLayerLayout(kT5, 1);
  ASSERT_THAT(single, IsOk());
  EXPECT_EQ(single->ToString(), "encoder 4 + decoder 2");
  EXPECT_THAT(EvenLayerLayout({.encoder_layers = 3}, 4),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("3 layers cannot fill 4")));
}

TEST(ListedLayerLayoutTest, AcceptsUnevenLayouts) {
  absl::StatusOr<LayerLayout> gpt = ListedLayerLayout(Listed({3, 1}, 0), kGpt, 2, "f");
  ASSERT_THAT(gpt, IsOk());
  EXPECT_THAT(gpt->encoder, ElementsAre(3, 1));
  EXPECT_EQ(gpt->ToString(), "3+1");
  absl::StatusOr<LayerLayout> t5 = ListedLayerLayout(Listed({2, 1, 1, 2}, 3), kT5, 4, "f");
  ASSERT_THAT(t5, IsOk());
  EXPECT_THAT(t5->encoder, ElementsAre(2, 1, 1, 0));
  EXPECT_THAT(t5->decoder, ElementsAre(0, 0, 0, 2));
  EXPECT_EQ(t5->encoder_stages(), 3u);
  EXPECT_EQ(t5->FirstEncoderLayer(2), 3u);
  EXPECT_EQ(t5->ToString(), "encoder 2+1+1 | decoder 2");
  // Round trip through the config form every plan records.
  const v1::StageLayoutConfig config = LayerLayoutToConfig(*t5);
  EXPECT_THAT(ListedLayerLayout(config, kT5, 4, "f"), IsOk());
  EXPECT_EQ(*ListedLayerLayout(config, kT5, 4, "f"), *t5);
}

TEST(ListedLayerLayoutTest, NamesTheEntryThatIsWrong) {
  EXPECT_THAT(ListedLayerLayout(Listed({4, 0}, 0), kGpt, 2, "parallelism.stage_layout"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("parallelism.stage_layout.layers[1]: stage 1 holds no layer")));
  EXPECT_THAT(ListedLayerLayout(Listed({3, 2}, 0), kGpt, 2, "f"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("f.layers: 3+2 = 5 layers, but model.num_layers is 4")));
  EXPECT_THAT(ListedLayerLayout(Listed({4}, 0), kGpt, 2, "f"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("has 1 entries but the pipeline has 2 stages")));
  EXPECT_THAT(ListedLayerLayout(Listed({2, 2}, 1), kGpt, 2, "f"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("only T5")));
  EXPECT_THAT(
      ListedLayerLayout(Listed({2, 1, 1, 2}, 4), kT5, 4, "f"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("f.encoder_stages: must be 1 to 3")));
  EXPECT_THAT(ListedLayerLayout(Listed({2, 1, 1, 2}, 2), kT5, 4, "f"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the 2 encoder stages hold 2+1 = 3 layers, but model.num_layers "
                                 "is 4")));
  EXPECT_THAT(ListedLayerLayout(Listed({6}, 0), kT5, 1, "f"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one stage holds both")));
}

TEST(LayerLayoutTest, DevicesSumTheirInterleavedChunks) {
  // Four chunks over two devices: device 0 holds stages 0 and 2.
  const LayerLayout layout{.encoder = {1, 2, 3, 4}, .decoder = {0, 0, 0, 0}};
  EXPECT_EQ(layout.DeviceEncoderLayers(0, 2), 4u);
  EXPECT_EQ(layout.DeviceEncoderLayers(1, 2), 6u);
  EXPECT_THAT(layout.PerDevice(2).encoder, ElementsAre(4, 6));
}

TEST(ConfiguredLayerLayoutTest, ResolvesEachMode) {
  v1::JobConfig config;
  config.mutable_model()->set_num_layers(4);
  config.mutable_parallelism()->set_pipeline(2);
  absl::StatusOr<LayerLayout> even = ConfiguredLayerLayout(config);
  ASSERT_THAT(even, IsOk());
  EXPECT_EQ(even->ToString(), "2+2");
  *config.mutable_parallelism()->mutable_stage_layout() = Listed({1, 3}, 0);
  config.mutable_parallelism()->mutable_stage_layout()->clear_mode();  // layers imply EXPLICIT
  absl::StatusOr<LayerLayout> given = ConfiguredLayerLayout(config);
  ASSERT_THAT(given, IsOk());
  EXPECT_EQ(given->ToString(), "1+3");
  config.mutable_parallelism()->mutable_stage_layout()->Clear();
  config.mutable_parallelism()->mutable_stage_layout()->set_mode(v1::AUTO);
  EXPECT_THAT(ConfiguredLayerLayout(config),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("planner chooses")));
}

}  // namespace
}  // namespace varipipe
