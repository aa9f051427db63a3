#include "planner/cost/memory_model.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "planner/cost/analytic_model.h"
#include "planner/cost/model_dims.h"

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

uint32_t StageLayout::StageEncoderLayers(uint32_t stage, uint32_t stages) const {
  if (stages == layers.stages()) return layers.encoder[stage];
  if (stages == devices) return DeviceEncoderLayers(stage);
  return encoder_decoder ? 0 : LayersOnStage(encoder_layers, stages, stage);
}

uint32_t StageLayout::StageDecoderLayers(uint32_t stage, uint32_t stages) const {
  if (stages == layers.stages()) return layers.decoder[stage];
  if (stages == devices) return DeviceDecoderLayers(stage);
  return 0;
}

absl::StatusOr<StageLayout> MakeStageLayout(const ModelDims& dims, uint32_t pipeline,
                                            uint32_t virtual_chunks, const LayerLayout* layers,
                                            uint32_t tensor_parallel) {
  if (pipeline == 0 || virtual_chunks == 0 || tensor_parallel == 0) {
    return absl::InvalidArgumentError(
        "pipeline degree, virtual chunks and tensor-parallel degree must be at least 1");
  }
  StageLayout layout;
  layout.devices = pipeline;
  layout.tensor_parallel = tensor_parallel;
  layout.virtual_chunks = virtual_chunks;
  layout.encoder_decoder = dims.encoder_decoder();
  layout.loss_chunk_tokens = dims.loss_chunk_tokens;
  layout.encoder_layers = dims.encoder_layers;
  layout.decoder_layers = dims.encoder_decoder() ? dims.decoder_layers : 0;
  layout.tied_embedding_replica = dims.tied_embeddings && pipeline * virtual_chunks > 1;
  if (dims.t5v11()) {
    layout.shared_word_embedding = true;
    // The bias tables split their heads over the tensor ranks.
    layout.encoder_device_parameters =
        static_cast<double>(dims.relative_bias_parameters()) / tensor_parallel;
    layout.decoder_device_parameters =
        static_cast<double>(dims.relative_bias_parameters()) / tensor_parallel;
    layout.last_encoder_device_parameters = dims.hidden;
    layout.position_bias_split_bytes = 4.0 * dims.heads;  // fp32, from the fp32 table
    layout.position_bias_replicated_bytes = 8;            // int64 bucket ids
    layout.position_bias_fused = dims.attention_kernel == AttentionKernel::kFused;
  }
  if (dims.dtype_bytes < 4) {
    layout.compute_copy_bytes = dims.dtype_bytes;
    layout.encoder_layer_linear =
        LinearParameters(dims, Component::kEncoderLayer, tensor_parallel);
    layout.decoder_layer_linear =
        LinearParameters(dims, Component::kDecoderLayer, tensor_parallel);
    layout.head_linear = LinearParameters(dims, Component::kPostprocess, tensor_parallel);
  }
  const LayerCounts counts{.encoder_decoder = dims.encoder_decoder(),
                           .encoder_layers = layout.encoder_layers,
                           .decoder_layers = layout.decoder_layers};
  const uint32_t stages = pipeline * virtual_chunks;
  if (layers == nullptr) {
    absl::StatusOr<LayerLayout> even = EvenLayerLayout(counts, stages);
    if (!even.ok()) return even.status();
    layout.layers = *std::move(even);
  } else {
    // The invariants of layer_layout.h, for a layout from a plan or a store.
    const LayerLayout& l = *layers;
    uint32_t encoder_sum = 0;
    uint32_t decoder_sum = 0;
    bool valid = l.stages() == stages && l.decoder.size() == l.encoder.size();
    for (uint32_t s = 0; valid && s < l.stages(); ++s) {
      encoder_sum += l.encoder[s];
      decoder_sum += l.decoder[s];
      valid = l.encoder[s] + l.decoder[s] > 0 &&
              (stages == 1 || l.encoder[s] == 0 || l.decoder[s] == 0) &&
              (s == 0 || l.encoder[s] == 0 || l.encoder[s - 1] > 0);
    }
    valid = valid && encoder_sum == counts.encoder_layers && decoder_sum == counts.decoder_layers &&
            (counts.encoder_decoder || decoder_sum == 0) &&
            (!counts.encoder_decoder || stages == 1 ||
             (l.encoder_stages() >= 1 && l.encoder_stages() < stages));
    if (!valid) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage layout ", l.ToString(), " does not split the model's ", counts.encoder_layers,
          counts.encoder_decoder ? absl::StrCat(" encoder and ", counts.decoder_layers, " decoder")
                                 : "",
          " layers over ", stages, " stages"));
    }
    layout.layers = l;
  }
  // T5 runs without interleaving (the config refuses virtual chunks for it).
  layout.encoder_devices = dims.encoder_decoder() ? layout.layers.encoder_stages() : pipeline;
  for (uint32_t d = 0; d < pipeline; ++d) {
    layout.encoder_layers_per_device =
        std::max(layout.encoder_layers_per_device, layout.DeviceEncoderLayers(d));
    layout.decoder_layers_per_device =
        std::max(layout.decoder_layers_per_device, layout.DeviceDecoderLayers(d));
  }
  return layout;
}

absl::StatusOr<StageLayout> JobStageLayout(const v1::JobConfig& config) {
  const ModelDims dims = ModelDimsFromJob(config);
  absl::StatusOr<LayerLayout> layers = ConfiguredLayerLayout(config);
  if (!layers.ok()) return layers.status();
  return MakeStageLayout(dims, std::max(1u, config.parallelism().pipeline()),
                         std::max(1u, config.parallelism().virtual_chunks()), &*layers,
                         std::max(1u, config.parallelism().tensor()));
}

double ModelParameters(const CostModel& model, const StageLayout& layout) {
  const uint32_t t = layout.tensor_parallel;
  const double emb = model.Parameters(Component::kEmbedding, t);
  // MEGATRON T5 has an embedding per stack; T5V11 shares one.
  const double embeddings = layout.encoder_decoder && !layout.shared_word_embedding ? 2 : 1;
  return layout.encoder_layers * model.Parameters(Component::kEncoderLayer, t) +
         layout.decoder_layers * model.Parameters(Component::kDecoderLayer, t) + embeddings * emb +
         model.Parameters(Component::kPostprocess, t) + layout.encoder_device_parameters +
         (layout.encoder_decoder ? layout.decoder_device_parameters : 0.0) +
         layout.last_encoder_device_parameters;
}

double MaxParametersPerDevice(const CostModel& model, const StageLayout& layout) {
  const std::vector<double> params = ParametersPerDevice(model, layout);
  return *std::max_element(params.begin(), params.end());
}

absl::StatusOr<double> AvailableActivationBytes(const CostModel& model, const StageLayout& layout,
                                                ZeroStage zero, uint32_t data_parallel,
                                                double device_memory_limit_bytes) {
  // The busiest device: the one with the least room.
  absl::StatusOr<std::vector<double>> rooms = AvailableActivationBytesPerDevice(
      model, layout, zero, data_parallel, device_memory_limit_bytes);
  if (!rooms.ok()) return rooms.status();
  return *std::min_element(rooms->begin(), rooms->end());
}

std::vector<double> ComputeCopyBytesPerDevice(const StageLayout& layout) {
  std::vector<double> bytes(layout.devices, 0);
  if (layout.compute_copy_bytes == 0) return bytes;
  for (uint32_t d = 0; d < layout.devices; ++d) {
    bytes[d] = layout.compute_copy_bytes *
               (layout.DeviceEncoderLayers(d) * layout.encoder_layer_linear +
                layout.DeviceDecoderLayers(d) * layout.decoder_layer_linear +
                (d + 1 == layout.devices ? layout.head_linear : 0.0));
  }
  return bytes;
}

std::vector<double> ParametersPerDevice(const CostModel& model, const StageLayout& layout) {
  const uint32_t t = layout.tensor_parallel;
  const double enc = model.Parameters(Component::kEncoderLayer, t);
  const double dec = model.Parameters(Component::kDecoderLayer, t);
  const double emb = model.Parameters(Component::kEmbedding, t);
  const double post = model.Parameters(Component::kPostprocess, t);
  const uint32_t c = layout.devices;
  std::vector<double> params(c, 0);
  if (c == 1) {
    // Everything once: no replicas on one device.
    params[0] = ModelParameters(model, layout);
    return params;
  }
  const uint32_t encoder_devices = layout.encoder_decoder ? layout.encoder_devices : c;
  for (uint32_t d = 0; d < encoder_devices; ++d) {
    params[d] = layout.DeviceEncoderLayers(d) * enc + layout.encoder_device_parameters;
  }
  params[0] += emb;
  params[encoder_devices - 1] += layout.last_encoder_device_parameters;
  if (layout.encoder_decoder) {
    for (uint32_t d = encoder_devices; d < c; ++d) {
      params[d] = layout.DeviceDecoderLayers(d) * dec + layout.decoder_device_parameters;
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
  const std::vector<double> copies = ComputeCopyBytesPerDevice(layout);
  for (size_t d = 0; d < available.size(); ++d) {
    const double parameters = available[d];
    const double state =
        ModelStatePerDevice(parameters, zero, data_parallel).total() + copies[d];
    available[d] = device_memory_limit_bytes - state;
    if (available[d] <= 0) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "model state alone needs %.2f GiB on pipeline device %d (%.3g parameters, ZeRO stage "
          "%d, data parallel %d%s) but the device memory limit is %.2f GiB; use more pipeline "
          "stages, a higher ZeRO stage or a larger cluster.device_memory_limit_mib",
          state / (1 << 30), d, parameters, static_cast<int>(zero), data_parallel,
          copies[d] > 0 ? absl::StrFormat(", %.2f GiB of it the compute-dtype weight copy",
                                          copies[d] / (1 << 30))
                        : "",
          device_memory_limit_bytes / (1 << 30)));
    }
  }
  return available;
}

}  // namespace varipipe::planner
