// One pipeline stage of a GPT (MEGATRON or LLAMA, docs/models.md) or T5
// (MEGATRON or T5V11) model: a range of layers, with the embedding on the stage that starts a
// stack and the final norm, LM head and loss on the last stage. T5 puts its encoder stages first
// and its decoder stages after (the planner's cost model assumes the same); the encoder output
// travels with the decoder activations through every decoder stage, and its gradient flows back the
// same way.
//
// With tensor parallelism each stage holds its tensor rank's part of every
// layer (transformer_layer.h) and of the vocabulary: the embedding sums the
// ranks' rows (vocab_parallel.h) and the head computes this rank's logits
// and the vocabulary-parallel loss. Activations between stages are whole on
// every tensor rank; with sequence parallelism each stack's layers run on
// the rank's part of the sequence, scattered before the first and gathered
// after the last layer of the stage.
#ifndef VARIPIPE_EXECUTOR_MODEL_MODEL_STAGE_H_
#define VARIPIPE_EXECUTOR_MODEL_MODEL_STAGE_H_

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/model/context_parallel_attention.h"
#include "executor/model/model_spec.h"
#include "executor/model/tensor_group.h"
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

// The layers of spec.layers (the job's stage layout) when set; otherwise the
// even split (EvenLayerLayout: GPT layers as evenly as possible; T5 with
// more than one stage: stages split between encoder and decoder in
// proportion to their layer counts, at least one each; with one stage the
// single stage holds both). InvalidArgument when a stage would hold no
// layer or spec.layers has another number of stages; FailedPrecondition for
// an AUTO layout not yet set.
absl::StatusOr<std::vector<StageRole>> PipelineStageRoles(const ModelSpec& spec,
                                                          int64_t num_stages);
// The layout PipelineStageRoles follows (same errors).
absl::StatusOr<LayerLayout> StageLayoutOf(const ModelSpec& spec, int64_t num_stages);

// A parameter several stages hold (docs/models.md, "Shared parameters"): a
// LLAMA embedding tied to the head across stages, T5V11's shared embedding
// and its relative bias tables. Each holder has a replica under `name`; the
// first holder owns it (counts it in the gradient norm, exports it).
struct SharedParameter {
  std::string name;
  std::vector<int64_t> stages;  // ascending, at least two
};

// The parameters of a model split into `roles` (PipelineStageRoles) that more
// than one stage holds, in the order every rank sums their gradients.
std::vector<SharedParameter> SharedParameters(const ModelSpec& spec,
                                              const std::vector<StageRole>& roles);

// The gradient sums one rank takes part in: for each shared parameter its
// stage `stage` holds (in SharedParameters' order), the global ranks of the
// holders in the pipeline replica whose first rank is `replica_base` (ranks
// replica_base + stage; one stage per rank). Every rank computes the same
// groups.
struct SharedParameterGroup {
  std::string name;
  std::vector<int> ranks;
};
std::vector<SharedParameterGroup> SharedParameterGroups(const ModelSpec& spec,
                                                        const std::vector<StageRole>& roles,
                                                        int64_t stage, int replica_base);

// A micro-batch's data as the stages see it. Token tensors are int64 and
// padded at the end; lengths give the real lengths (>= 1).
struct StageBatch {
  torch::Tensor input_tokens;    // [b, s] GPT sequence / T5 encoder input
  torch::Tensor input_lengths;   // [b]
  torch::Tensor decoder_tokens;  // T5: [b, t] decoder input (targets shifted right)
  torch::Tensor target_lengths;  // T5: [b]
  torch::Tensor labels;          // last stage: [b, s or t], -1 where no loss
  // Last stage: the flat indices (into labels viewed as [b * (s or t)]),
  // ascending, of the positions whose label is >= 0, on the labels' device;
  // the head runs on these positions only. Built on the host (RowLengths'
  // labelled_positions, from the plan's lengths) so that no pass reads the
  // labels back from the device; undefined: derived from `labels`
  // (LabelledPositionsOf, a read of the labels on a GPU).
  torch::Tensor labelled_positions;
  // Packed rows (several samples per row; undefined when unpacked): each
  // position's sample within its row (-1 padding) and its position inside
  // that sample, for the input (GPT sequence, T5 encoder) and T5 target rows
  // (MicroBatchLoader's RowLengths). Attention is block-diagonal per sample
  // and position embeddings restart per sample.
  torch::Tensor input_segments, input_positions;    // [b, s]
  torch::Tensor target_segments, target_positions;  // T5: [b, t]
  // Packed rows: attention per sample (the variable-length kernel,
  // PerSampleAttention: cost and memory the sum over samples) or, when
  // false, over the whole row under the dense block-diagonal mask (one
  // kernel call per row, memory the row length squared). The plan's
  // MicroBatch.packed_attention.
  bool per_sample_attention = true;
  // Multiplies the summed token loss: 1 / (real target tokens of the whole
  // global mini-batch), so the micro-batch losses add up to the global mean.
  double loss_scale = 1.0;
  // A micro-batch split across the stage's context group (null: whole):
  // this lane's split (context_parallel_attention.h). The tensors are then
  // one row of all_gather_count positions, the lane's local tokens first
  // (labels: each token's label as in the whole micro-batch), then padding;
  // positions (absolute or rotary) are each token's place in its own
  // sample, and self-attention gathers the keys of every lane.
  c10::intrusive_ptr<ContextParallelInput> context;
};

// The flat indices, ascending, of the positions of `labels` [b, s] whose
// label is >= 0, on the labels' device (int64 [n]).
torch::Tensor LabelledPositionsOf(const torch::Tensor& labels);

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
  // `tensor`: the rank's tensor group (size spec.tensor_parallel), shared by
  // the rank's stages; none: a group of one. `context`: the rank's context
  // group (size spec.context_parallel: the lanes of its replica and
  // pipeline rank, of its tensor index), over which split micro-batches
  // gather keys and values; none: a group of one. A T5 model with
  // spec.context_parallel above 1 is refused (c10::Error naming
  // parallelism.context).
  ModelStage(const ModelSpec& spec, const StageRole& role,
             std::shared_ptr<TensorGroup> tensor = nullptr,
             std::shared_ptr<TensorGroup> context = nullptr);

  const StageRole& role() const { return role_; }
  TensorGroup& tensor_group() { return *tensor_; }
  TensorGroup& context_group() { return *context_; }

  // Runs the stage. `in` is empty on stage 0; on T5 decoder stages after the
  // first it carries decoder activations and the encoder output; on the first
  // decoder stage only the encoder output (its `hidden`).
  StageActivations Forward(const StageActivations& in, const StageBatch& batch);

  // Selective recomputation (the plan's recompute "selective") for the
  // following forward passes: every layer's attention core is recomputed in
  // backward instead of stored.
  void SetSelectiveRecompute(bool on);

  // Whether parameter `name` (a named_parameters() key) is a replica of a
  // shared parameter that an earlier stage owns (SharedParameters), or a
  // tensor-replicated parameter (tensor_shard.h) on a tensor rank other than
  // the first: the gradient norm counts it once (on the owner) and the owner
  // exports it.
  bool IsReplica(const std::string& name) const;

  // Full recomputation (the plan's recompute "full") for the following
  // forward passes: every layer keeps only its inputs and is re-run, one
  // layer at a time, in backward (TransformerLayer::set_recompute_full).
  void SetFullRecompute(bool on);

  // The head's token chunk (chunked_loss_head.h) for the following forward
  // passes; 0: DefaultLossChunkTokens of the rank's vocabulary rows
  // (common/loss_head_chunk.h), the default.
  void set_loss_chunk_tokens(int64_t tokens) { loss_chunk_tokens_ = tokens; }
  // The chunk the head runs with.
  int64_t loss_chunk_tokens() const;

 private:
  // The constructor's parameters before and after the layers (this tensor
  // rank's part of each).
  void RegisterEmbeddings();
  void RegisterHead();
  // Packed rows' self-attention input: the rows' variable-length layout for
  // per-sample attention, or the dense block-diagonal mask
  // (StageBatch::per_sample_attention).
  static AttentionInput PackedSelfInput(const torch::Tensor& segments, bool causal,
                                        bool per_sample);
  // Token plus position embeddings; `positions` [b, s] for packed rows,
  // else 0..s-1 in every row.
  torch::Tensor Embed(const torch::Tensor& tokens, const torch::Tensor& word,
                      const torch::Tensor& position, const torch::Tensor& positions) const;
  // The per-layer position input of a stack whose layers take `hidden`
  // [b, s, h] (`positions` [b, s] for packed rows, else 0..s-1): LLAMA's
  // rotary table, T5V11's relative position bias from `bias_table`
  // (bidirectional in the encoder); undefined for MEGATRON.
  torch::Tensor LayerPositions(const torch::Tensor& positions, const torch::Tensor& hidden,
                               const torch::Tensor& bias_table, bool bidirectional) const;
  // The final normalisation of the encoder or of the model.
  torch::Tensor FinalNorm(const torch::Tensor& x, const torch::Tensor& weight,
                          const torch::Tensor& bias) const;

  // The summed token loss of the last stage's `hidden` [b, s, h]: the final
  // norm, LM head and cross-entropy (vocabulary-parallel under tensor
  // parallelism) on the labelled positions only, a chunk of tokens at a time
  // (chunked_loss_head.h).
  torch::Tensor HeadLoss(const torch::Tensor& hidden, const StageBatch& batch) const;
  // Runs layers [first, first + count) of layers_ on `hidden`, each stack's
  // layers on the rank's sequence part with sequence parallelism.
  torch::Tensor RunLayers(size_t first, int64_t count, torch::Tensor hidden,
                          const AttentionInput& self_input, const torch::Tensor& memory,
                          const AttentionInput& cross_input, const torch::Tensor& position);

  ModelSpec spec_;
  StageRole role_;
  std::shared_ptr<TensorGroup> tensor_;
  std::shared_ptr<TensorGroup> context_;
  int64_t vocab_begin_ = 0;  // the first vocabulary row this tensor rank holds
  // embeds_input (or a tied head; T5V11: or embeds_decoder); LLAMA and
  // T5V11 have no position table.
  torch::Tensor word_embedding_, position_embedding_;
  // T5V11: each stack's relative bias table, on every stage with its layers.
  torch::Tensor encoder_relative_bias_, decoder_relative_bias_;
  torch::Tensor decoder_word_embedding_, decoder_position_embedding_;  // embeds_decoder
  torch::Tensor encoder_ln_weight_, encoder_ln_bias_;                  // ends_encoder
  // has_head; LLAMA: RMSNorm (no bias), and head_weight_ is word_embedding_
  // when tied.
  torch::Tensor final_ln_weight_, final_ln_bias_, head_weight_;
  int64_t loss_chunk_tokens_ = 0;  // set_loss_chunk_tokens
  std::vector<std::shared_ptr<TransformerLayer>> layers_;
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_MODEL_STAGE_H_
