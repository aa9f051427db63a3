// LayerLayout: which transformer layers each pipeline stage holds
// (docs/configuration.md, "Stage layout"). One value for the whole job: the
// planner's memory model, stage costs and plan builder, and the executor's
// model stages, checkpoints and plan check all read the same layout.
//
// Invariants (every LayerLayout this file returns):
//   - encoder.size() == decoder.size() == stages >= 1;
//   - every stage holds at least one layer;
//   - GPT: decoder[] is all zero;
//   - T5 with one stage: that stage holds both stacks; with more stages the
//     first encoder_stages() stages hold only encoder layers and the rest
//     only decoder layers, each side at least one stage;
//   - each stack's entries sum to its layers.
// Stage s holds the layers [sum of the stack's entries before s, + its own).
// With interleaving (virtual chunks) model stage s runs on device
// s % pipeline (looped placement).
//
// The embedding sits on the first stage of each stack, the LM head on the
// last stage: a layout moves transformer layers only.
#ifndef VARIPIPE_COMMON_CONFIG_LAYER_LAYOUT_H_
#define VARIPIPE_COMMON_CONFIG_LAYER_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "varipipe/v1/config.pb.h"

namespace varipipe {

struct LayerLayout {
  std::vector<uint32_t> encoder;  // per stage: encoder layers (GPT: its layers)
  std::vector<uint32_t> decoder;  // per stage: T5 decoder layers; 0 for GPT

  uint32_t stages() const { return static_cast<uint32_t>(encoder.size()); }
  // Stages holding encoder layers (GPT: all of them; T5 with one stage: 1).
  uint32_t encoder_stages() const;
  // The first encoder (decoder) layer of stage s: the entries before it.
  uint32_t FirstEncoderLayer(uint32_t stage) const;
  uint32_t FirstDecoderLayer(uint32_t stage) const;
  // Layers of each stack on pipeline device `device` of `devices`: the sum
  // over its model stages (device, device + devices, ...).
  uint32_t DeviceEncoderLayers(uint32_t device, uint32_t devices) const;
  uint32_t DeviceDecoderLayers(uint32_t device, uint32_t devices) const;
  // Layers of each pipeline device of `devices`, its chunks together: the
  // per-device view of an interleaved layout (not a contiguous layout).
  LayerLayout PerDevice(uint32_t devices) const;
  // "3+1"; T5: "encoder 2+1+1 | decoder 4"; T5 on one stage:
  // "encoder 4 + decoder 4".
  std::string ToString() const;

  friend bool operator==(const LayerLayout&, const LayerLayout&) = default;
};

// The model's stacks, as a layout needs them.
struct LayerCounts {
  bool encoder_decoder = false;
  uint32_t encoder_layers = 0;  // GPT: its layers
  uint32_t decoder_layers = 0;  // T5 only
};
LayerCounts LayerCountsOf(const v1::ModelConfig& model);

// The even split over `stages` stages: each stack's layers as evenly as
// possible, the first stages taking the remainder; T5 gives the encoder
// round(stages x encoder share) stages, clamped to [1, stages - 1].
// InvalidArgument when a stage would hold no layer.
absl::StatusOr<LayerLayout> EvenLayerLayout(const LayerCounts& counts, uint32_t stages);

// A LISTED layout as the config states it, checked against the model and
// the stage count. Errors name `field` ("parallelism.stage_layout") and the
// entry, e.g. "parallelism.stage_layout.layers[2]: must be at least 1".
absl::StatusOr<LayerLayout> ListedLayerLayout(const v1::StageLayoutConfig& config,
                                              const LayerCounts& counts, uint32_t stages,
                                              absl::string_view field);

// The layout as a StageLayoutConfig of mode LISTED (T5 with one stage:
// mode EVEN, the only layout one stage has).
v1::StageLayoutConfig LayerLayoutToConfig(const LayerLayout& layout);

// The job's layout when its config fixes one (EVEN or LISTED) over
// pipeline x virtual_chunks stages. FailedPrecondition for AUTO, which
// the planner chooses (planner/partition/layout_search.h): the message says
// where the chosen one comes from.
absl::StatusOr<LayerLayout> ConfiguredLayerLayout(const v1::JobConfig& config);

// The mode a StageLayoutConfig means (its default resolved).
v1::StageLayoutMode EffectiveLayoutMode(const v1::StageLayoutConfig& config);

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_CONFIG_LAYER_LAYOUT_H_
