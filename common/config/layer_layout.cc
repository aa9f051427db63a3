#include "common/config/layer_layout.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace varipipe {
namespace {

// `layers` over `stages` stages, the first taking the remainder.
std::vector<uint32_t> EvenSplit(uint32_t layers, uint32_t stages) {
  std::vector<uint32_t> out(stages);
  for (uint32_t i = 0; i < stages; ++i) out[i] = layers / stages + (i < layers % stages ? 1 : 0);
  return out;
}

uint32_t Sum(const std::vector<uint32_t>& v, uint32_t end) {
  return std::accumulate(v.begin(), v.begin() + std::min<size_t>(end, v.size()), uint32_t{0});
}

}  // namespace

uint32_t LayerLayout::encoder_stages() const {
  uint32_t n = 0;
  for (uint32_t e : encoder) n += e > 0 ? 1 : 0;
  return n;
}

uint32_t LayerLayout::FirstEncoderLayer(uint32_t stage) const { return Sum(encoder, stage); }
uint32_t LayerLayout::FirstDecoderLayer(uint32_t stage) const { return Sum(decoder, stage); }

uint32_t LayerLayout::DeviceEncoderLayers(uint32_t device, uint32_t devices) const {
  uint32_t n = 0;
  for (uint32_t s = device; s < stages(); s += devices) n += encoder[s];
  return n;
}

uint32_t LayerLayout::DeviceDecoderLayers(uint32_t device, uint32_t devices) const {
  uint32_t n = 0;
  for (uint32_t s = device; s < stages(); s += devices) n += decoder[s];
  return n;
}

LayerLayout LayerLayout::PerDevice(uint32_t devices) const {
  if (devices == 0 || devices >= stages()) return *this;
  LayerLayout out;
  for (uint32_t d = 0; d < devices; ++d) {
    out.encoder.push_back(DeviceEncoderLayers(d, devices));
    out.decoder.push_back(DeviceDecoderLayers(d, devices));
  }
  return out;
}

std::string LayerLayout::ToString() const {
  const bool t5 = std::any_of(decoder.begin(), decoder.end(), [](uint32_t d) { return d > 0; });
  if (!t5) return absl::StrJoin(encoder, "+");
  if (stages() == 1) return absl::StrCat("encoder ", encoder[0], " + decoder ", decoder[0]);
  const uint32_t e = encoder_stages();
  return absl::StrCat("encoder ", absl::StrJoin(encoder.begin(), encoder.begin() + e, "+"),
                      " | decoder ", absl::StrJoin(decoder.begin() + e, decoder.end(), "+"));
}

LayerCounts LayerCountsOf(const v1::ModelConfig& model) {
  LayerCounts c;
  c.encoder_decoder = model.kind() == v1::T5;
  c.encoder_layers = model.num_layers();
  c.decoder_layers = c.encoder_decoder ? model.num_decoder_layers() : 0;
  return c;
}

absl::StatusOr<LayerLayout> EvenLayerLayout(const LayerCounts& counts, uint32_t stages) {
  if (stages == 0) return absl::InvalidArgumentError("the pipeline needs at least one stage");
  LayerLayout layout;
  if (!counts.encoder_decoder) {
    if (counts.encoder_layers < stages) {
      return absl::InvalidArgumentError(
          absl::StrCat(counts.encoder_layers, " layers cannot fill ", stages, " pipeline stages"));
    }
    layout.encoder = EvenSplit(counts.encoder_layers, stages);
    layout.decoder.assign(stages, 0);
    return layout;
  }
  if (stages == 1) {
    layout.encoder = {counts.encoder_layers};
    layout.decoder = {counts.decoder_layers};
    return layout;
  }
  // Stages in proportion to the layer counts, at least one each.
  const double share = static_cast<double>(counts.encoder_layers) /
                       (static_cast<double>(counts.encoder_layers) + counts.decoder_layers);
  const uint32_t encoder_stages =
      std::clamp<uint32_t>(static_cast<uint32_t>(share * stages + 0.5), 1, stages - 1);
  const uint32_t decoder_stages = stages - encoder_stages;
  if (counts.encoder_layers < encoder_stages || counts.decoder_layers < decoder_stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("T5 with ", counts.encoder_layers, " encoder and ", counts.decoder_layers,
                     " decoder layers cannot fill ", encoder_stages, " encoder and ",
                     decoder_stages, " decoder stages"));
  }
  layout.encoder = EvenSplit(counts.encoder_layers, encoder_stages);
  layout.encoder.resize(stages, 0);
  layout.decoder.assign(encoder_stages, 0);
  const std::vector<uint32_t> decoder = EvenSplit(counts.decoder_layers, decoder_stages);
  layout.decoder.insert(layout.decoder.end(), decoder.begin(), decoder.end());
  return layout;
}

absl::StatusOr<LayerLayout> ListedLayerLayout(const v1::StageLayoutConfig& config,
                                              const LayerCounts& counts, uint32_t stages,
                                              absl::string_view field) {
  const auto& layers = config.layers();
  if (static_cast<uint32_t>(layers.size()) != stages) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".layers: has ", layers.size(), " entries but the pipeline has ", stages,
        " stages (parallelism.pipeline x parallelism.virtual_chunks); give one per stage"));
  }
  for (int i = 0; i < layers.size(); ++i) {
    if (layers[i] == 0) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".layers[", i, "]: stage ", i,
                                                     " holds no layer; every stage ",
                                                     "needs at least 1"));
    }
  }
  LayerLayout layout;
  const std::vector<uint32_t> given(layers.begin(), layers.end());
  if (!counts.encoder_decoder) {
    if (config.encoder_stages() != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".encoder_stages: only T5 has encoder stages (got ",
                       config.encoder_stages(), ")"));
    }
    const uint32_t sum = Sum(given, stages);
    if (sum != counts.encoder_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".layers: ", absl::StrJoin(given, "+"), " = ", sum,
                       " layers, but model.num_layers is ", counts.encoder_layers));
    }
    layout.encoder = given;
    layout.decoder.assign(stages, 0);
    return layout;
  }
  if (stages == 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".layers: a T5 pipeline of one stage holds both stacks; leave ", field, " out"));
  }
  const uint32_t e = config.encoder_stages();
  if (e < 1 || e >= stages) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".encoder_stages: must be 1 to ", stages - 1,
        " (the stages holding encoder layers; the rest hold decoder layers), got ", e));
  }
  const uint32_t encoder_sum = Sum(given, e);
  const uint32_t decoder_sum = Sum(given, stages) - encoder_sum;
  if (encoder_sum != counts.encoder_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".layers: the ", e, " encoder stages hold ",
                     absl::StrJoin(given.begin(), given.begin() + e, "+"), " = ", encoder_sum,
                     " layers, but model.num_layers is ", counts.encoder_layers));
  }
  if (decoder_sum != counts.decoder_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".layers: the ", stages - e, " decoder stages hold ",
                     absl::StrJoin(given.begin() + e, given.end(), "+"), " = ", decoder_sum,
                     " layers, but model.num_decoder_layers is ", counts.decoder_layers));
  }
  layout.encoder.assign(stages, 0);
  layout.decoder.assign(stages, 0);
  for (uint32_t s = 0; s < stages; ++s) (s < e ? layout.encoder : layout.decoder)[s] = given[s];
  return layout;
}

v1::StageLayoutConfig LayerLayoutToConfig(const LayerLayout& layout) {
  v1::StageLayoutConfig config;
  const bool t5 =
      std::any_of(layout.decoder.begin(), layout.decoder.end(), [](uint32_t d) { return d > 0; });
  if (t5 && layout.stages() == 1) {
    config.set_mode(v1::EVEN);
    return config;
  }
  config.set_mode(v1::LISTED);
  for (uint32_t s = 0; s < layout.stages(); ++s) {
    config.add_layers(layout.encoder[s] + layout.decoder[s]);
  }
  if (t5) config.set_encoder_stages(layout.encoder_stages());
  return config;
}

v1::StageLayoutMode EffectiveLayoutMode(const v1::StageLayoutConfig& config) {
  if (config.mode() != v1::STAGE_LAYOUT_MODE_UNSPECIFIED) return config.mode();
  return config.layers().empty() ? v1::EVEN : v1::LISTED;
}

absl::StatusOr<LayerLayout> ConfiguredLayerLayout(const v1::JobConfig& config) {
  const v1::ParallelismConfig& p = config.parallelism();
  const uint32_t stages =
      std::max<uint32_t>(1, p.pipeline()) * std::max<uint32_t>(1, p.virtual_chunks());
  const LayerCounts counts = LayerCountsOf(config.model());
  switch (EffectiveLayoutMode(p.stage_layout())) {
    case v1::LISTED:
      return ListedLayerLayout(p.stage_layout(), counts, stages, "parallelism.stage_layout");
    case v1::AUTO:
      return absl::FailedPreconditionError(
          "parallelism.stage_layout.mode is AUTO: the planner chooses the layout (the planner "
          "daemon records it in the instruction store, and every plan carries it)");
    default:
      return EvenLayerLayout(counts, stages);
  }
}

}  // namespace varipipe
