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

// The layers a model is built from (config.proto Architecture,
// docs/models.md): Megatron's (LayerNorm with bias, learned positions, GeLU
// MLP, biases everywhere), Llama's (RMSNorm, rotary positions, SwiGLU MLP,
// grouped-query attention, no biases; decoder-only) or T5 v1.1's (RMSNorm,
// relative position bias tables, gated-GELU MLP, unscaled multi-head
// attention, no biases, one word embedding shared by both stacks, an untied
// head; encoder-decoder only).
enum class Architecture { kMegatron = 0, kLlama = 1, kT5V11 = 2 };
const char* ArchitectureName(Architecture architecture);  // "MEGATRON", "LLAMA", "T5V11"

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
  Architecture architecture = Architecture::kMegatron;
  // Key/value heads of grouped-query attention (LLAMA); 0 means `heads`
  // (multi-head attention, as every MEGATRON model).
  uint32_t kv_heads = 0;
  // LLAMA: the LM head multiplies by the token embedding (one tensor).
  bool tied_embeddings = false;
  // T5V11: buckets of the relative position bias (each stack's table is
  // [buckets, heads]); 0 for the other architectures.
  uint32_t relative_attention_buckets = 0;
  // Labelled tokens per chunk of the LM head's chunked linear + cross-
  // entropy (training.loss_chunk_tokens, common/loss_head_chunk.h); 0: the
  // default for the head's vocabulary rows. A job setting, not the model's:
  // only ModelDimsFromJob fills it.
  uint32_t loss_chunk_tokens = 0;

  bool encoder_decoder() const { return kind == ModelKind::kT5; }
  bool megatron() const { return architecture == Architecture::kMegatron; }
  bool llama() const { return architecture == Architecture::kLlama; }
  bool t5v11() const { return architecture == Architecture::kT5V11; }
  // heads * kv_channels: the width of the attention projections (Q and the
  // output projection; K and V too without grouped-query attention).
  uint64_t attention_width() const { return uint64_t{heads} * kv_channels; }
  uint32_t key_value_heads() const { return kv_heads == 0 ? heads : kv_heads; }
  // key_value_heads * kv_channels: the width of the K and V projections.
  uint64_t kv_width() const { return uint64_t{key_value_heads()} * kv_channels; }
  // What the architecture builds (docs/models.md). Gated MLP: three
  // matrices (gate, up, down: SwiGLU for LLAMA, gated GELU for T5V11)
  // instead of fc1 and fc2.
  bool gated_mlp() const { return !megatron(); }
  // Biases on the linear layers, and LayerNorm's bias (RMSNorm has none).
  bool biases() const { return megatron(); }
  // A learned absolute position table next to the token embedding (LLAMA
  // rotates Q and K instead, T5V11 adds a relative position bias to the
  // scores: neither has a position table).
  bool position_table() const { return megatron(); }
  // Dropout after the embedding and on the residual branches (MEGATRON's
  // memory formulas keep its one-byte masks; LLAMA and T5V11 have none).
  bool dropout() const { return megatron(); }
  // T5V11: parameters of one stack's relative position bias table,
  // [buckets, heads]; 0 for the other architectures.
  uint64_t relative_bias_parameters() const {
    return t5v11() ? uint64_t{relative_attention_buckets} * heads : 0;
  }
};

// Dimensions of a validated config (defaults applied).
ModelDims ModelDimsFromConfig(const v1::ModelConfig& model);
// The same with the job's settings that change what the model's components
// cost (training.loss_chunk_tokens).
ModelDims ModelDimsFromJob(const v1::JobConfig& config);

AttentionKernel AttentionKernelFromProto(v1::AttentionKernel kernel);  // unspecified: explicit
v1::AttentionKernel AttentionKernelToProto(AttentionKernel kernel);

Recompute RecomputeFromProto(v1::RecomputeMode mode);
v1::RecomputeMode RecomputeToProto(Recompute mode);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_COST_MODEL_DIMS_H_
