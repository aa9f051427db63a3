// Model-state memory per device (parameters, gradients, optimizer state) and
// the memory left for activations.
//
// What the executor holds per parameter, whatever model.dtype: fp32
// parameters (the master weights; under a 16-bit model.dtype forward passes
// autocast them), fp32 gradients and AdamW's two fp32 moments: 4 + 4 + 8
// bytes (the ZeRO paper's mixed-precision layout, 2 + 2 + 12, has the same
// total but shards differently). ZeRO stage 1 shards the optimizer state
// across the data-parallel replicas, stage 2 would also shard the gradients,
// stage 3 also the parameters (Rajbhandari et al. 2020); the executor
// implements stage 1.
//
// Under mixed precision (a 16-bit model.dtype) each stage also keeps one
// compute-dtype copy of its linear layers' weights and biases (the LM
// head's weight where the stage holds the head, tied or not) for the whole
// iteration, cast once per optimizer step and read by every micro-batch:
// dtype_bytes x those parameters (StageLayout::compute_copy_bytes), static
// memory beside the fp32 state. None in fp32. No micro-batch keeps a cast
// of its own.
#ifndef VARIPIPE_PLANNER_COST_MEMORY_MODEL_H_
#define VARIPIPE_PLANNER_COST_MEMORY_MODEL_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/layer_layout.h"
#include "planner/cost/cost_model.h"

namespace varipipe::planner {

enum class ZeroStage { k0 = 0, k1 = 1, k2 = 2, k3 = 3 };

struct ModelStateBytes {
  double parameters = 0;
  double gradients = 0;
  double optimizer = 0;
  double total() const { return parameters + gradients + optimizer; }
};

// Model state of `parameter_count` parameters held by one device.
// REQUIRES: data_parallel >= 1.
ModelStateBytes ModelStatePerDevice(double parameter_count, ZeroStage zero, uint32_t data_parallel);

// How the model's layers sit on the pipeline's devices: the job's
// LayerLayout (common/config/layer_layout.h; the even split unless the
// config gives one or the planner chose one). T5 puts its encoder on the
// first encoder_devices devices and the decoder on the rest. The first
// device of each stack also holds that stack's embedding, the last device
// the LM head (postprocess).
struct StageLayout {
  uint32_t devices = 1;          // pipeline degree c
  // Tensor-parallel degree: each device is one tensor rank holding its part
  // of the stage (the cost model's parameters at this degree).
  uint32_t tensor_parallel = 1;
  uint32_t virtual_chunks = 1;   // model chunks per device (interleaving)
  uint32_t encoder_devices = 1;  // T5: devices holding encoder layers (== devices for GPT)
  // The model's layers of each kind.
  uint32_t encoder_layers = 0;
  uint32_t decoder_layers = 0;
  // Most layers any device holds of each kind.
  uint32_t encoder_layers_per_device = 0;
  uint32_t decoder_layers_per_device = 0;
  // The layers of each of the devices * virtual_chunks model stages.
  LayerLayout layers;
  // Layers of each stack on model stage `stage` when the model runs as
  // `stages` stages: the layout's own stage when stages == layers.stages(),
  // device `stage`'s chunks together when stages == devices (a schedule
  // without interleaving on a job with virtual chunks), the even split
  // otherwise.
  uint32_t StageEncoderLayers(uint32_t stage, uint32_t stages) const;
  uint32_t StageDecoderLayers(uint32_t stage, uint32_t stages) const;
  // Layers of each stack on pipeline device d (its chunks together).
  uint32_t DeviceEncoderLayers(uint32_t d) const { return layers.DeviceEncoderLayers(d, devices); }
  uint32_t DeviceDecoderLayers(uint32_t d) const { return layers.DeviceDecoderLayers(d, devices); }
  bool encoder_decoder = false;
  // The job's LM-head token chunk (ModelDims::loss_chunk_tokens; 0: the
  // default): the micro-batch cost model prices the head's transient at it
  // (micro_batch_cost.h).
  uint32_t loss_chunk_tokens = 0;
  // LLAMA with tie_word_embeddings on more than one device: the last device
  // holds a replica of the embedding for its LM head (Megatron-LM's rule;
  // its gradient is summed with the first device's every iteration), which
  // counts as model state there.
  bool tied_embedding_replica = false;
  // T5V11 (docs/models.md, "Shared parameters"): encoder and decoder look
  // their tokens up in one word_embedding. The first decoder device holds a
  // replica of the first device's (a parameter count equal to MEGATRON T5's
  // separate decoder embedding), and a device holding both stacks holds the
  // one tensor once (MEGATRON T5: two embeddings).
  bool shared_word_embedding = false;
  // Parameters each device holding layers of a stack holds once, whatever
  // its layer count: T5V11's relative position bias table of that stack
  // ([buckets, heads]; a replica on every such device, the first one's
  // counted in model totals). 0 for the other architectures.
  double encoder_device_parameters = 0;
  double decoder_device_parameters = 0;
  // Parameters of the last device holding encoder layers: T5V11's final
  // encoder RMSNorm (h). (MEGATRON T5's final encoder LayerNorm is not
  // counted: docs/cost-model.md, "Model-state memory".)
  double last_encoder_device_parameters = 0;
  // Activations a device keeps once per micro-batch for each stack it holds,
  // whatever its layer count (docs/cost-model.md, "T5V11"): T5V11's int64
  // bucket ids [1, s, s] (its bias table's gradient reads them) and, where
  // the layers keep their input bias for backward, the fp32 relative
  // position bias [1, heads, s, s] every layer of the stack adds to its
  // scores: under full recomputation (each layer's checkpoint) and under
  // selective recomputation of the explicit kernel (each recomputed core);
  // the explicit kernel without recomputation keeps only the softmax, and
  // the fused kernel keeps a masked copy per layer (the layer's own stored
  // bytes). Bytes per query-key position pair of the stack's sequence:
  // position_bias_split_bytes (the bias; its heads are split over
  // tensor-parallel ranks) and position_bias_replicated_bytes (the ids). 0
  // for the other architectures. From the job's model, whatever the cost
  // model: the profiler builds the bias outside the layers it measures.
  double position_bias_split_bytes = 0;
  double position_bias_replicated_bytes = 0;
  bool position_bias_fused = false;  // the fused attention kernel
  // The compute-dtype weight copy (see the header): bytes per parameter
  // (dims.dtype_bytes below 4, else 0) and the linear parameters of one
  // layer of each kind and of the LM head on one tensor rank
  // (LinearParameters, analytic_model.h).
  double compute_copy_bytes = 0;
  double encoder_layer_linear = 0;
  double decoder_layer_linear = 0;
  double head_linear = 0;
  // The gradient of one stack's position bias, fp32 [1, heads, s, s]: the
  // stage's backward sums every layer's share into it, so it is alive
  // beside each layer's own backward transient (a peak term, not stored).
  double PositionBiasGradientBytes(double s, uint32_t tensor_parallel) const {
    return position_bias_split_bytes / std::max<uint32_t>(1, tensor_parallel) * s * s;
  }
  // T5 with one device: encoder and decoder share it.
  bool shared_device() const { return encoder_decoder && devices == 1; }
  // The position bias bytes of one stack of sequence length s.
  double PositionBiasBytes(double s, uint32_t tensor_parallel, Recompute recompute) const {
    const bool bias_kept = recompute == Recompute::kFull ||
                           (recompute == Recompute::kSelective && !position_bias_fused);
    return ((bias_kept ? position_bias_split_bytes : 0.0) / std::max<uint32_t>(1, tensor_parallel) +
            position_bias_replicated_bytes) *
           s * s;
  }
};

// Layers of stage `index` when `layers` are spread over `stages` stages as
// evenly as possible, the first stages taking the remainder (EvenLayerLayout).
uint32_t LayersOnStage(uint32_t layers, uint32_t stages, uint32_t index);

// The layout of `dims` over `pipeline` devices with `virtual_chunks` chunks
// each: `layers` (pipeline * virtual_chunks stages, checked against the
// model), or the even split when null. InvalidArgument naming the reason
// when the layout does not fit the model. `tensor_parallel`: each device's
// tensor rank holds 1/tensor_parallel of the sharded parameters.
absl::StatusOr<StageLayout> MakeStageLayout(const ModelDims& dims, uint32_t pipeline,
                                            uint32_t virtual_chunks,
                                            const LayerLayout* layers = nullptr,
                                            uint32_t tensor_parallel = 1);

// The job's layout (ConfiguredLayerLayout: EVEN or LISTED; a planner
// that chose an AUTO layout holds it as LISTED) over pipeline *
// virtual_chunks stages.
absl::StatusOr<StageLayout> JobStageLayout(const v1::JobConfig& config);

// Parameters of the whole model, every shared parameter counted once (its
// replicas on other devices are not parameters of their own): what a
// model's published size counts.
double ModelParameters(const CostModel& model, const StageLayout& layout);

// Parameters on the device that holds the most (the memory bottleneck).
double MaxParametersPerDevice(const CostModel& model, const StageLayout& layout);

// Device memory left for activations: limit - model state (and the
// compute-dtype weight copy) of the busiest device. ResourceExhausted (naming both numbers) when the model state alone
// does not fit.
absl::StatusOr<double> AvailableActivationBytes(const CostModel& model, const StageLayout& layout,
                                                ZeroStage zero, uint32_t data_parallel,
                                                double device_memory_limit_bytes);

// Parameters held by each pipeline device (index 0..devices-1), layers split
// as the stages are (planner/cost/micro_batch_cost.h, EvaluateStages: the
// first devices of a stack take the remainder); embeddings on the first
// device of each stack, the LM head on the last device, and the per-device
// parameters of StageLayout (replicas included).
std::vector<double> ParametersPerDevice(const CostModel& model, const StageLayout& layout);

// The compute-dtype weight copy each pipeline device keeps (the header):
// compute_copy_bytes x (its layers' linear parameters + the head's weight
// on the last device). All zero in fp32.
std::vector<double> ComputeCopyBytesPerDevice(const StageLayout& layout);

// Each device's own room for activations: limit - its own model state
// (and its compute-dtype weight copy).
// ResourceExhausted (naming the device) when a device's model state alone
// does not fit.
absl::StatusOr<std::vector<double>> AvailableActivationBytesPerDevice(
    const CostModel& model, const StageLayout& layout, ZeroStage zero, uint32_t data_parallel,
    double device_memory_limit_bytes);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_COST_MEMORY_MODEL_H_
