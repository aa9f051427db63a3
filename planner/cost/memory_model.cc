#include "planner/cost/memory_model.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace varipipe::planner {

ModelStateBytes ModelStatePerDevice(double parameter_count, ZeroStage zero,
                                    uint32_t data_parallel) {
  const double dp = std::max<uint32_t>(1, data_parallel);
  ModelStateBytes bytes;
  bytes.parameters = parameter_count * 4;
  bytes.gradients = parameter_count * 4;
  bytes.optimizer = parameter_count * 8;
  if (zero >= ZeroStage::k1) bytes.optimizer /= dp;
  if (zero >= ZeroStage::k2) bytes.gradients /= dp;
  if (zero >= ZeroStage::k3) bytes.parameters /= dp;
  return bytes;
}

uint32_t LayersOnStage(uint32_t layers, uint32_t stages, uint32_t index) {
  return layers / stages + (index < layers % stages ? 1 : 0);
}

absl::StatusOr<StageLayout> MakeStageLayout(const ModelDims& dims, uint32_t pipeline,
                                            uint32_t virtual_chunks) {
  if (pipeline == 0 || virtual_chunks == 0) {
    return absl::InvalidArgumentError("pipeline degree and virtual chunks must be at least 1");
  }
  StageLayout layout;
  layout.devices = pipeline;
  layout.virtual_chunks = virtual_chunks;
  layout.encoder_decoder = dims.encoder_decoder();
  layout.encoder_layers = dims.encoder_layers;
  layout.decoder_layers = dims.encoder_decoder() ? dims.decoder_layers : 0;
  const auto ceil_div = [](uint32_t a, uint32_t b) { return (a + b - 1) / b; };
  layout.tied_embedding_replica = dims.tied_embeddings && pipeline * virtual_chunks > 1;
  if (dims.t5v11()) {
    layout.shared_word_embedding = true;
    layout.encoder_device_parameters = static_cast<double>(dims.relative_bias_parameters());
    layout.decoder_device_parameters = static_cast<double>(dims.relative_bias_parameters());
    layout.last_encoder_device_parameters = dims.hidden;
    layout.position_bias_split_bytes = 4.0 * dims.heads;  // fp32, from the fp32 table
    layout.position_bias_replicated_bytes = 8;            // int64 bucket ids
    layout.position_bias_fused = dims.attention_kernel == AttentionKernel::kFused;
  }
  if (!dims.encoder_decoder()) {
    if (dims.encoder_layers < pipeline * virtual_chunks) {
      return absl::InvalidArgumentError(absl::StrCat(dims.encoder_layers, " layers cannot fill ",
                                                     pipeline * virtual_chunks, " stages"));
    }
    layout.encoder_devices = pipeline;
    layout.encoder_layers_per_device = ceil_div(dims.encoder_layers, pipeline);
    return layout;
  }
  if (pipeline == 1) {
    layout.encoder_devices = 1;
    layout.encoder_layers_per_device = dims.encoder_layers;
    layout.decoder_layers_per_device = dims.decoder_layers;
    return layout;
  }
  // Split devices in proportion to the layer counts, at least one each.
  const double share = static_cast<double>(dims.encoder_layers) /
                       (static_cast<double>(dims.encoder_layers) + dims.decoder_layers);
  layout.encoder_devices =
      std::clamp<uint32_t>(static_cast<uint32_t>(share * pipeline + 0.5), 1, pipeline - 1);
  const uint32_t decoder_devices = pipeline - layout.encoder_devices;
  if (dims.encoder_layers < layout.encoder_devices || dims.decoder_layers < decoder_devices) {
    return absl::InvalidArgumentError(
        absl::StrCat("T5 with ", dims.encoder_layers, " encoder and ", dims.decoder_layers,
                     " decoder layers cannot fill ", layout.encoder_devices, " encoder and ",
                     decoder_devices, " decoder devices"));
  }
  layout.encoder_layers_per_device = ceil_div(dims.encoder_layers, layout.encoder_devices);
  layout.decoder_layers_per_device = ceil_div(dims.decoder_layers, decoder_devices);
  return layout;
}

double ModelParameters(const CostModel& model, const StageLayout& layout) {
  const double emb = model.Parameters(Component::kEmbedding);
  // MEGATRON T5 has an embedding per stack; T5V11 shares one.
  const double embeddings = layout.encoder_decoder && !layout.shared_word_embedding ? 2 : 1;
  return layout.encoder_layers * model.Parameters(Component::kEncoderLayer) +
         layout.decoder_layers * model.Parameters(Component::kDecoderLayer) + embeddings * emb +
         model.Parameters(Component::kPostprocess) + layout.encoder_device_parameters +
         (layout.encoder_decoder ? layout.decoder_device_parameters : 0.0) +
         layout.last_encoder_device_parameters;
}

double MaxParametersPerDevice(const CostModel& model, const StageLayout& layout) {
  const double enc = model.Parameters(Component::kEncoderLayer);
  const double dec = model.Parameters(Component::kDecoderLayer);
  const double emb = model.Parameters(Component::kEmbedding);
  const double post = model.Parameters(Component::kPostprocess);
  const double encoder_extra = layout.encoder_device_parameters;
  const double decoder_extra = layout.encoder_decoder ? layout.decoder_device_parameters : 0.0;
  const double last_encoder = layout.last_encoder_device_parameters;
  if (layout.shared_device()) {
    return layout.encoder_layers_per_device * enc + layout.decoder_layers_per_device * dec +
           (layout.shared_word_embedding ? 1 : 2) * emb + post + encoder_extra + decoder_extra +
           last_encoder;
  }
  if (!layout.encoder_decoder) {
    const double layers = layout.encoder_layers_per_device * enc + encoder_extra;
    if (layout.devices == 1) return layers + emb + post + last_encoder;
    return layers + std::max(emb, post + last_encoder + (layout.tied_embedding_replica ? emb : 0));
  }
  const double encoder_device =
      layout.encoder_layers_per_device * enc + encoder_extra +
      (layout.encoder_devices == 1 ? emb + last_encoder : std::max(emb, last_encoder));
  const uint32_t decoder_devices = layout.devices - layout.encoder_devices;
  const double decoder_device = layout.decoder_layers_per_device * dec + decoder_extra +
                                (decoder_devices == 1 ? emb + post : std::max(emb, post));
  return std::max(encoder_device, decoder_device);
}

absl::StatusOr<double> AvailableActivationBytes(const CostModel& model, const StageLayout& layout,
                                                ZeroStage zero, uint32_t data_parallel,
                                                double device_memory_limit_bytes) {
  const double parameters = MaxParametersPerDevice(model, layout);
  const double state = ModelStatePerDevice(parameters, zero, data_parallel).total();
  const double available = device_memory_limit_bytes - state;
  if (available <= 0) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "model state alone needs %.2f GiB per device (%.3g parameters on the busiest device, "
        "ZeRO stage %d, data parallel %d) but the device memory limit is %.2f GiB; use more "
        "pipeline stages, a higher ZeRO stage or a larger cluster.device_memory_limit_mib",
        state / (1 << 30), parameters, static_cast<int>(zero), data_parallel,
        device_memory_limit_bytes / (1 << 30)));
  }
  return available;
}

std::vector<double> ParametersPerDevice(const CostModel& model, const StageLayout& layout) {
  const double enc = model.Parameters(Component::kEncoderLayer);
  const double dec = model.Parameters(Component::kDecoderLayer);
  const double emb = model.Parameters(Component::kEmbedding);
  const double post = model.Parameters(Component::kPostprocess);
  const uint32_t c = layout.devices;
  std::vector<double> params(c, 0);
  if (c == 1) {
    // Everything once: no replicas on one device.
    params[0] = ModelParameters(model, layout);
    return params;
  }
  const uint32_t encoder_devices = layout.encoder_decoder ? layout.encoder_devices : c;
  for (uint32_t d = 0; d < encoder_devices; ++d) {
    params[d] = LayersOnStage(layout.encoder_layers, encoder_devices, d) * enc +
                layout.encoder_device_parameters;
  }
  params[0] += emb;
  params[encoder_devices - 1] += layout.last_encoder_device_parameters;
  if (layout.encoder_decoder) {
    for (uint32_t d = encoder_devices; d < c; ++d) {
      params[d] =
          LayersOnStage(layout.decoder_layers, c - encoder_devices, d - encoder_devices) * dec +
          layout.decoder_device_parameters;
    }
    // MEGATRON: the decoder's own embedding; T5V11: the replica of the
    // shared word_embedding.
    params[encoder_devices] += emb;
  }
  params[c - 1] += post + (layout.tied_embedding_replica ? emb : 0);
  return params;
}

absl::StatusOr<std::vector<double>> AvailableActivationBytesPerDevice(
    const CostModel& model, const StageLayout& layout, ZeroStage zero, uint32_t data_parallel,
    double device_memory_limit_bytes) {
  std::vector<double> available = ParametersPerDevice(model, layout);
  for (size_t d = 0; d < available.size(); ++d) {
    const double parameters = available[d];
    const double state = ModelStatePerDevice(parameters, zero, data_parallel).total();
    available[d] = device_memory_limit_bytes - state;
    if (available[d] <= 0) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "model state alone needs %.2f GiB on pipeline device %d (%.3g parameters, ZeRO stage "
          "%d, data parallel %d) but the device memory limit is %.2f GiB; use more pipeline "
          "stages, a higher ZeRO stage or a larger cluster.device_memory_limit_mib",
          state / (1 << 30), d, parameters, static_cast<int>(zero), data_parallel,
          device_memory_limit_bytes / (1 << 30)));
    }
  }
  return available;
}

}  // namespace varipipe::planner
