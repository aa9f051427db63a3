// Measures the executor's own model components (executor/model: the same
// TransformerLayer, embeddings and LM head the stages run) at one grid point
// of the planner's cost model (docs/cost-model.md): forward and backward time
// and the activation memory it keeps for the backward and at its peak, under
// one recompute mode, on the device it runs on.
//
// Memory is measured, not modelled: on the CPU by the counting c10 allocator
// (counting_allocator.h), on GPUs by the CUDA caching allocator's statistics.
// Stored is what the forward leaves alive plus the input it keeps (a layer's
// input activation, the embedding's token ids, the LM head's input and
// labels) and minus its output, which the next component keeps as its input:
// so a stage's components add up to what the stage keeps, whether its input
// was received or embedded. Peak is the highest level during the forward and
// the backward (the received output gradient included), plus the kept input.
// Parameter gradients are allocated by a warm-up pass first and never
// counted. A T5 decoder layer is not charged for the encoder output it
// reads: a stage keeps one for all its decoder layers.
#ifndef VARIPIPE_EXECUTOR_PROFILE_COMPONENT_PROFILE_H_
#define VARIPIPE_EXECUTOR_PROFILE_COMPONENT_PROFILE_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/model/model_spec.h"
#include "executor/model/tensor_group.h"
#include "executor/model/transformer_layer.h"
#include "varipipe/v1/config.pb.h"
#include "varipipe/v1/cost_model.pb.h"

namespace varipipe::executor {

struct ProfilePoint {
  v1::CostComponent component = v1::ENCODER_LAYER;
  v1::RecomputeMode recompute = v1::RECOMPUTE_NONE;
  int64_t micro_batch = 1;
  int64_t seq_len = 1;      // the component's own length (decoder: decoder length)
  int64_t encoder_len = 0;  // DECODER_LAYER only
};

struct ProfileSettings {
  torch::Device device = torch::kCPU;
  // GPUs: forward passes under CUDA autocast to this dtype, as the executor
  // runs them (InterpreterOptions::cuda_autocast_dtype).
  std::optional<torch::ScalarType> cuda_autocast_dtype;
  int warmup = 1;   // passes before measuring
  int repeats = 5;  // measured passes; times are their median
  // Tensor parallelism (spec.tensor_parallel > 1): this rank's group, with
  // its transport. Every rank of the group measures the same points in the
  // same order, each its own part of the component (column- and
  // row-parallel layers, its heads of the attention core and of T5V11's
  // bias table, the vocabulary-parallel embedding and head; with sequence
  // parallelism a layer's input is the rank's part of the sequence), and
  // the collectives inside run over the group's transport: times and memory
  // are this rank's.
  const TensorGroup* tensor = nullptr;
  // The LM head's token chunk at POSTPROCESS points (common/loss_head_chunk.h
  // LossChunkTokens); 0: the default, which the planner assumes a profile
  // was measured with and adjusts for a job's training.loss_chunk_tokens
  // (micro_batch_cost.h).
  int64_t loss_chunk_tokens = 0;
};

struct PointCosts {
  double forward_ms = 0;
  double backward_ms = 0;  // with its recomputation (selective, full)
  double stored_mib = 0;
  double peak_mib = 0;
};

// The parameters of the component measured last, kept from one point to
// the next: building them initializes them on the host (a GPT-6.7B-shaped
// layer's 201M parameters took about 2 s a point on an H200, where the
// point's passes take milliseconds). Holds one component at a time.
struct ComponentCache {
  v1::CostComponent component = v1::COST_COMPONENT_UNSPECIFIED;
  std::shared_ptr<TransformerLayer> layer;  // layers
  std::vector<torch::Tensor> parameters;    // embedding, LM head
};

// Measures `point` of the model `spec`. On the CPU the counting allocator
// must be installed (InstallCountingCpuAllocator) before the first tensor.
// LibTorch errors (out of memory included) are returned as ResourceExhausted
// when the device ran out of memory, Internal otherwise.
// With `cache`, the component's parameters are reused from the previous
// point of the same component (their gradients never outlive a point).
absl::StatusOr<PointCosts> MeasurePoint(const ModelSpec& spec, const ProfilePoint& point,
                                        const ProfileSettings& settings,
                                        ComponentCache* cache = nullptr);

// Parameters of one instance of `component` (one layer, the embedding, the
// LM head with its final LayerNorm), counted from the executor's modules. A
// T5V11 layer's count leaves out its stack's relative bias table, which a
// stage holds once for all its layers of that stack. Unsharded whatever
// spec.tensor_parallel (the cost model derives a tensor rank's part,
// CostModel::Parameters).
double ComponentParameters(const ModelSpec& spec, v1::CostComponent component);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_PROFILE_COMPONENT_PROFILE_H_
