// One pipeline stage of a GPT (MEGATRON or LLAMA, docs/models.md) or T5
// model: a range of layers, with the embedding on the stage that starts a
// stack and the final norm, LM head and loss on the last stage. T5 puts its encoder stages first
// and its decoder stages after (the planner's cost model assumes the same); the encoder output
// travels with the decoder activations through every decoder stage, and its gradient flows back the
// same way.
#ifndef VARIPIPE_EXECUTOR_MODEL_MODEL_STAGE_H_
#define VARIPIPE_EXECUTOR_MODEL_MODEL_STAGE_H_

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/model/model_spec.h"
#include "executor/model/transformer_layer.h"

namespace varipipe::executor {

// What one stage holds. Derived from the model and the pipeline degree by
// PipelineStageRoles; every rank computes the same roles.
struct StageRole {
  int64_t stage = 0;
  LayerRange encoder_layers;    // GPT layers or T5 encoder layers (may be empty)
  LayerRange decoder_layers;    // T5 decoder layers (may be empty)
  bool embeds_input = false;    // GPT stage 0, T5 stage 0 (encoder tokens)
  bool embeds_decoder = false;  // T5: first decoder stage (decoder tokens)
  bool ends_encoder = false;    // T5: last encoder stage (final encoder LayerNorm)
  bool has_head = false;        // the model's last stage: LM head and loss
  std::string DebugString() const;
};

// GPT: layers split evenly (StageLayers). T5 with pipeline > 1: devices split
// between encoder and decoder in proportion to their layer counts (at least
// one each), layers split evenly within each; with pipeline == 1 the single
// stage holds both. InvalidArgument when a stage would hold no layer.
absl::StatusOr<std::vector<StageRole>> PipelineStageRoles(const ModelSpec& spec,
                                                          int64_t num_stages);

// The global ranks that hold a tied embedding of the pipeline replica whose
// first rank is `replica_base` (ranks replica_base .. + pipeline - 1): its
// first and last stage, when the model ties its head and pipeline > 1;
// empty otherwise. Every rank computes the same groups.
std::vector<int> TiedEmbeddingRanks(const ModelSpec& spec, int64_t pipeline, int replica_base);

// A micro-batch's data as the stages see it. Token tensors are int64 and
// padded at the end; lengths give the real lengths (>= 1).
struct StageBatch {
  torch::Tensor input_tokens;    // [b, s] GPT sequence / T5 encoder input
  torch::Tensor input_lengths;   // [b]
  torch::Tensor decoder_tokens;  // T5: [b, t] decoder input (targets shifted right)
  torch::Tensor target_lengths;  // T5: [b]
  torch::Tensor labels;          // last stage: [b, s or t], -1 where no loss
  // Packed rows (several samples per row; undefined when unpacked): each
  // position's sample within its row (-1 padding) and its position inside
  // that sample, for the input (GPT sequence, T5 encoder) and T5 target rows
  // (MicroBatchLoader's RowLengths). Attention is block-diagonal per sample
  // and position embeddings restart per sample.
  torch::Tensor input_segments, input_positions;    // [b, s]
  torch::Tensor target_segments, target_positions;  // T5: [b, t]
  // Multiplies the summed token loss: 1 / (real target tokens of the whole
  // global mini-batch), so the micro-batch losses add up to the global mean.
  double loss_scale = 1.0;
};

// Activations between stages. `hidden` is [b, s, hidden]; `memory` is the
// encoder output [b, s_enc, hidden] on T5 decoder stages, undefined
// otherwise. On the last stage `loss` is this micro-batch's scaled loss.
struct StageActivations {
  torch::Tensor hidden;
  torch::Tensor memory;
  torch::Tensor loss;
};

class ModelStage : public torch::nn::Module {
 public:
  ModelStage(const ModelSpec& spec, const StageRole& role);

  const StageRole& role() const { return role_; }

  // Runs the stage. `in` is empty on stage 0; on T5 decoder stages after the
  // first it carries decoder activations and the encoder output; on the first
  // decoder stage only the encoder output (its `hidden`).
  StageActivations Forward(const StageActivations& in, const StageBatch& batch);

  // Selective recomputation (the plan's recompute "selective") for the
  // following forward passes: every layer's attention core is recomputed in
  // backward instead of stored.
  void SetSelectiveRecompute(bool on);

  // A tied LLAMA head on another stage than the embedding
  // (tie_word_embeddings, pipeline > 1): the first stage's word_embedding
  // and the last stage's replica of it, initialised (or loaded) alike, whose
  // gradients are summed over the two stages every iteration so they never
  // drift (Megatron-LM's rule; PlanInterpreter does it). Undefined on every
  // other stage, and when one stage holds both.
  torch::Tensor tied_embedding() const;
  // Whether parameter `name` (a named_parameters() key) is such a replica:
  // the gradient norm counts it once (on the first stage) and the first
  // stage exports it.
  bool IsReplica(const std::string& name) const;

  // Full recomputation (the plan's recompute "full") for the following
  // forward passes: every layer keeps only its inputs and is re-run, one
  // layer at a time, in backward (TransformerLayer::set_recompute_full).
  void SetFullRecompute(bool on);

 private:
  // Token plus position embeddings; `positions` [b, s] for packed rows,
  // else 0..s-1 in every row.
  torch::Tensor Embed(const torch::Tensor& tokens, const torch::Tensor& word,
                      const torch::Tensor& position, const torch::Tensor& positions) const;

  ModelSpec spec_;
  StageRole role_;
  // embeds_input (or a tied head); LLAMA has no position table.
  torch::Tensor word_embedding_, position_embedding_;
  torch::Tensor decoder_word_embedding_, decoder_position_embedding_;  // embeds_decoder
  torch::Tensor encoder_ln_weight_, encoder_ln_bias_;                  // ends_encoder
  // has_head; LLAMA: RMSNorm (no bias), and head_weight_ is word_embedding_
  // when tied.
  torch::Tensor final_ln_weight_, final_ln_bias_, head_weight_;
  std::vector<std::shared_ptr<TransformerLayer>> layers_;
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_MODEL_STAGE_H_
