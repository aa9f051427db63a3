// The dimensions an executor builds its model stages from, resolved from a
// JobConfig (defaults applied) and the stage -> layer assignment shared by
// every rank. The tensor-parallel degree says how the layers are sharded;
// which part a rank holds is its TensorGroup's (tensor_group.h).
#ifndef VARIPIPE_EXECUTOR_MODEL_MODEL_SPEC_H_
#define VARIPIPE_EXECUTOR_MODEL_MODEL_SPEC_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/config/layer_layout.h"
#include "varipipe/v1/config.pb.h"

namespace varipipe::executor {

struct ModelSpec {
  bool encoder_decoder = false;  // T5 when true, GPT otherwise
  int64_t num_layers = 0;        // GPT: decoder layers; T5: encoder layers
  int64_t num_decoder_layers = 0;  // T5 only
  int64_t hidden_size = 0;
  int64_t num_attention_heads = 0;
  int64_t kv_channels = 0;  // width of one head
  int64_t ffn_hidden_size = 0;
  int64_t vocab_size = 0;
  int64_t max_sequence_length = 0;  // learned position embeddings
  uint64_t seed = 0;                // deterministic initialisation
  // EXPLICIT or FUSED (FUSED only when FusedAttentionAvailable()).
  v1::AttentionKernel attention_kernel = v1::EXPLICIT;
  // LLAMA layers (docs/models.md) instead of MEGATRON ones.
  bool llama = false;
  // LLAMA: grouped-query attention's key/value heads (divides the heads).
  int64_t num_key_value_heads = 0;
  double norm_epsilon = 1e-5;  // LLAMA's and T5V11's RMSNorm
  double rope_theta = 10000;
  // Llama 3.1 frequency scaling; factor 0: none.
  double rope_factor = 0;
  double rope_low_freq_factor = 1;
  double rope_high_freq_factor = 4;
  double rope_original_max_positions = 8192;
  bool tie_word_embeddings = false;  // LLAMA: the head uses word_embedding
  // LLAMA: model.max_position_embeddings, the context an export declares;
  // 0: unset (hf_export.h).
  int64_t max_position_embeddings = 0;
  // T5V11 layers (docs/models.md) instead of MEGATRON ones (encoder_decoder).
  bool t5v11 = false;
  int64_t relative_buckets = 0;       // T5V11: relative position bias buckets
  int64_t relative_max_distance = 0;  // T5V11: distances sharing the last bucket
  // The job's stage layout (common/config/layer_layout.h) when the config
  // gives one (LISTED) or the planner chose one (AUTO: the executor sets
  // the planner daemons' choice, from GetJob or its first plan, into its
  // config first); empty: the even split over any number of stages.
  LayerLayout layers;
  bool layout_auto = false;  // parallelism.stage_layout.mode AUTO: `layers` set later
  // parallelism.tensor and .sequence_parallel (tensor_shard.h: the degree
  // divides the heads, key/value heads and MLP width).
  int64_t tensor_parallel = 1;
  bool sequence_parallel = false;
  // parallelism.context: the lanes of a context group split some
  // micro-batches' tokens (GPT and LLAMA only; docs/executor.md, "Context
  // parallelism"). A stage's context group has this size.
  int64_t context_parallel = 1;
};

// Applies the config's documented defaults; InvalidArgument naming the field
// when a required one is missing, when model.attention_kernel is FUSED
// and this build's LibTorch has no fused kernel, or for a T5 model with
// parallelism.context above 1.
absl::StatusOr<ModelSpec> ModelSpecFromConfig(const v1::JobConfig& config);

// The half-open range of layers [begin, end) of one stack a pipeline stage
// holds (PipelineStageRoles, from the job's LayerLayout).
struct LayerRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_MODEL_SPEC_H_
