// The model dimensions and placement the cost models need, as a plain struct
// (the planner core's algorithms never see protobuf; ModelDimsFromConfig is
// the edge).
#ifndef VARIPIPE_PLANNER_COST_MODEL_DIMS_H_
#define VARIPIPE_PLANNER_COST_MODEL_DIMS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "varipipe/v1/config.pb.h"

namespace varipipe::planner {

enum class ModelKind { kGpt, kT5 };

// Recomputation of activations during the backward pass (Korthikanti et al.).
enum class Recompute { kNone = 0, kSelective = 1, kFull = 2 };
inline constexpr int kNumRecomputeModes = 3;
const char* RecomputeName(Recompute mode);  // "none", "selective", "full"

// How the attention core is computed (config.proto AttentionKernel):
// explicitly with stored [b, a, sq, sk] score tensors, or by a fused kernel
// (FlashAttention) that keeps one fp32 logsumexp per query row instead.
enum class AttentionKernel { kExplicit = 0, kFused = 1 };
const char* AttentionKernelName(AttentionKernel kernel);  // "EXPLICIT", "FUSED"

struct ModelDims {
  ModelKind kind = ModelKind::kGpt;
  // GPT: decoder layers. T5: encoder layers.
  uint32_t encoder_layers = 0;
  // T5 only.
  uint32_t decoder_layers = 0;
  uint32_t hidden = 0;
  uint32_t heads = 0;
  // Width of one head; heads * kv_channels need not equal hidden.
  uint32_t kv_channels = 0;
  uint32_t ffn = 0;
  uint32_t vocab = 0;
  // Bytes per activation/parameter element in the compute dtype (2 for
  // bf16/fp16, 4 for fp32).
  uint32_t dtype_bytes = 2;
  AttentionKernel attention_kernel = AttentionKernel::kExplicit;

  bool encoder_decoder() const { return kind == ModelKind::kT5; }
  // heads * kv_channels: the width of the attention projections.
  uint64_t attention_width() const { return uint64_t{heads} * kv_channels; }
};

// Dimensions of a validated config (defaults applied).
ModelDims ModelDimsFromConfig(const v1::ModelConfig& model);

AttentionKernel AttentionKernelFromProto(v1::AttentionKernel kernel);  // unspecified: explicit
v1::AttentionKernel AttentionKernelToProto(AttentionKernel kernel);

Recompute RecomputeFromProto(v1::RecomputeMode mode);
v1::RecomputeMode RecomputeToProto(Recompute mode);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_COST_MODEL_DIMS_H_
