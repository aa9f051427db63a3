#include "executor/model/model_stage.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/loss_head_chunk.h"
#include "common/status.h"
#include "executor/model/attention_mask.h"
#include "executor/model/chunked_loss_head.h"
#include "executor/model/cuda_autocast.h"
#include "executor/model/initializer.h"
#include "executor/model/norm.h"
#include "executor/model/relative_position_bias.h"
#include "executor/model/rotary.h"
#include "executor/model/tensor_parallel_ops.h"
#include "executor/model/tensor_shard.h"
#include "executor/model/vocab_parallel.h"

namespace varipipe::executor {

std::string StageRole::DebugString() const {
  std::string out = absl::StrCat("stage ", stage);
  if (embeds_input) absl::StrAppend(&out, " embedding");
  if (encoder_layers.size() > 0) {
    absl::StrAppend(&out, " layers [", encoder_layers.begin, ", ", encoder_layers.end, ")");
  }
  if (ends_encoder) absl::StrAppend(&out, " encoder-norm");
  if (embeds_decoder) absl::StrAppend(&out, " decoder-embedding");
  if (decoder_layers.size() > 0) {
    absl::StrAppend(&out, " decoder layers [", decoder_layers.begin, ", ", decoder_layers.end, ")");
  }
  if (has_head) absl::StrAppend(&out, " head");
  return out;
}

absl::StatusOr<LayerLayout> StageLayoutOf(const ModelSpec& spec, int64_t num_stages) {
  if (num_stages < 1) return absl::InvalidArgumentError("the pipeline needs at least one stage");
  if (spec.layout_auto && spec.layers.stages() == 0) {
    return absl::FailedPreconditionError(
        "parallelism.stage_layout.mode is AUTO but no layout was set: the planner's choice is "
        "read from the instruction store (or the first plan) before the model is built");
  }
  if (spec.layers.stages() == 0) {
    const LayerCounts counts{.encoder_decoder = spec.encoder_decoder,
                             .encoder_layers = static_cast<uint32_t>(spec.num_layers),
                             .decoder_layers = static_cast<uint32_t>(spec.num_decoder_layers)};
    return EvenLayerLayout(counts, static_cast<uint32_t>(num_stages));
  }
  if (spec.layers.stages() != num_stages) {
    return absl::InvalidArgumentError(absl::StrCat("the stage layout ", spec.layers.ToString(),
                                                   " has ", spec.layers.stages(),
                                                   " stages but the pipeline has ", num_stages));
  }
  return spec.layers;
}

absl::StatusOr<std::vector<StageRole>> PipelineStageRoles(const ModelSpec& spec,
                                                          int64_t num_stages) {
  VP_ASSIGN_OR_RETURN(const LayerLayout layout, StageLayoutOf(spec, num_stages));
  std::vector<StageRole> roles(num_stages);
  for (int64_t i = 0; i < num_stages; ++i) {
    StageRole& role = roles[i];
    role.stage = i;
    const uint32_t s = static_cast<uint32_t>(i);
    role.encoder_layers.begin = layout.FirstEncoderLayer(s);
    role.encoder_layers.end = role.encoder_layers.begin + layout.encoder[s];
    role.decoder_layers.begin = layout.FirstDecoderLayer(s);
    role.decoder_layers.end = role.decoder_layers.begin + layout.decoder[s];
    if (spec.encoder_decoder) {
      // The last stage with encoder layers ends the encoder; the first with
      // decoder layers embeds the decoder's tokens.
      role.ends_encoder =
          layout.encoder[s] > 0 && (s + 1 == layout.stages() || layout.encoder[s + 1] == 0);
      role.embeds_decoder = layout.decoder[s] > 0 && (s == 0 || layout.decoder[s - 1] == 0);
    }
  }
  roles.front().embeds_input = true;
  roles.back().has_head = true;
  return roles;
}

namespace {

// The rank's part of a parameter drawn whole (tensor_shard.h).
torch::Tensor PartOf(const char* name, const torch::Tensor& full, const TensorGroup& tensor) {
  return ShardOf(full, ShardOfParameter(name), tensor.size(), tensor.index());
}

}  // namespace

ModelStage::ModelStage(const ModelSpec& spec, const StageRole& role,
                       std::shared_ptr<TensorGroup> tensor, std::shared_ptr<TensorGroup> context)
    : spec_(spec),
      role_(role),
      tensor_(tensor != nullptr ? std::move(tensor) : std::make_shared<TensorGroup>()),
      context_(context != nullptr ? std::move(context) : std::make_shared<TensorGroup>()),
      vocab_begin_(RangeOfPart(spec.vocab_size, tensor_->size(), tensor_->index()).begin) {
  TORCH_CHECK(tensor_->size() == spec.tensor_parallel, "a tensor group of ", tensor_->size(),
              " ranks for a model of tensor-parallel degree ", spec.tensor_parallel);
  TORCH_CHECK(!spec.encoder_decoder || spec.context_parallel <= 1, "parallelism.context (",
              spec.context_parallel,
              ") must be 1 for T5 models: context parallelism splits the causal self-attention "
              "of GPT and LLAMA models only");
  TORCH_CHECK(context_->size() == 1 || context_->size() == spec.context_parallel,
              "a context group of ", context_->size(),
              " ranks for a model of context-parallel degree ", spec.context_parallel);
  const int64_t h = spec.hidden_size;
  RegisterEmbeddings();
  const int64_t total_layers = spec.num_layers + spec.num_decoder_layers;
  for (int64_t i = role.encoder_layers.begin; i < role.encoder_layers.end; ++i) {
    layers_.push_back(
        register_module(absl::StrCat("encoder_layer_", i),
                        std::make_shared<TransformerLayer>(spec, ModelComponent::kEncoderLayer, i,
                                                           total_layers, tensor_.get())));
  }
  if (role.ends_encoder && spec.t5v11) {
    encoder_ln_weight_ = register_parameter("encoder_norm_weight", Initializer::Ones({h}));
  } else if (role.ends_encoder) {
    encoder_ln_weight_ = register_parameter("encoder_ln_weight", Initializer::Ones({h}));
    encoder_ln_bias_ = register_parameter("encoder_ln_bias", Initializer::Zeros({h}));
  }
  for (int64_t i = role.decoder_layers.begin; i < role.decoder_layers.end; ++i) {
    layers_.push_back(
        register_module(absl::StrCat("decoder_layer_", i),
                        std::make_shared<TransformerLayer>(spec, ModelComponent::kDecoderLayer, i,
                                                           total_layers, tensor_.get())));
  }
  RegisterHead();
}

// Registration order is the parameters' order (checkpoints, optimizer
// buffers): embeddings and bias tables, layers, encoder norm, head.
void ModelStage::RegisterEmbeddings() {
  const ModelSpec& spec = spec_;
  const StageRole& role = role_;
  const TensorGroup& tp = *tensor_;
  const int64_t h = spec.hidden_size;
  // GPT / T5 encoder embedding (index 0) and T5 decoder embedding (index 1,
  // untied from the encoder's).
  // LLAMA and T5V11 have no position table (rotary positions or a relative
  // bias in every layer). A tied LLAMA head reuses word_embedding, as T5V11's
  // decoder does: the same tensor on one stage, a replica on another
  // (SharedParameters).
  if (role.embeds_input || (spec.tie_word_embeddings && role.has_head) ||
      (spec.t5v11 && role.embeds_decoder)) {
    Initializer init(spec.seed, ModelComponent::kEmbedding, 0);
    word_embedding_ = register_parameter(
        "word_embedding",
        PartOf("word_embedding", init.Normal({spec.vocab_size, h}, kInitStddev), tp));
    if (!spec.llama && !spec.t5v11) {
      position_embedding_ = register_parameter(
          "position_embedding", init.Normal({spec.max_sequence_length, h}, kInitStddev));
    }
  }
  // T5V11: one relative bias table per stack, on every stage with its layers.
  if (spec.t5v11 && role.encoder_layers.size() > 0) {
    Initializer init(spec.seed, ModelComponent::kPositionBias, 0);
    encoder_relative_bias_ = register_parameter(
        "encoder_relative_bias",
        PartOf("encoder_relative_bias",
               init.Normal({spec.relative_buckets, spec.num_attention_heads}, kInitStddev), tp));
  }
  if (spec.t5v11 && role.decoder_layers.size() > 0) {
    Initializer init(spec.seed, ModelComponent::kPositionBias, 1);
    decoder_relative_bias_ = register_parameter(
        "decoder_relative_bias",
        PartOf("decoder_relative_bias",
               init.Normal({spec.relative_buckets, spec.num_attention_heads}, kInitStddev), tp));
  }
  if (role.embeds_decoder && !spec.t5v11) {
    Initializer init(spec.seed, ModelComponent::kEmbedding, 1);
    decoder_word_embedding_ = register_parameter(
        "decoder_word_embedding",
        PartOf("decoder_word_embedding", init.Normal({spec.vocab_size, h}, kInitStddev), tp));
    decoder_position_embedding_ = register_parameter(
        "decoder_position_embedding", init.Normal({spec.max_sequence_length, h}, kInitStddev));
  }
}

void ModelStage::RegisterHead() {
  const ModelSpec& spec = spec_;
  const StageRole& role = role_;
  const TensorGroup& tp = *tensor_;
  const int64_t h = spec.hidden_size;
  if (role.has_head && (spec.llama || spec.t5v11)) {
    Initializer init(spec.seed, ModelComponent::kHead, 0);
    final_ln_weight_ = register_parameter("final_norm_weight", Initializer::Ones({h}));
    head_weight_ =
        spec.tie_word_embeddings
            ? word_embedding_
            : register_parameter(
                  "head_weight",
                  PartOf("head_weight", init.Normal({spec.vocab_size, h}, kInitStddev), tp));
  } else if (role.has_head) {
    Initializer init(spec.seed, ModelComponent::kHead, 0);
    final_ln_weight_ = register_parameter("final_ln_weight", Initializer::Ones({h}));
    final_ln_bias_ = register_parameter("final_ln_bias", Initializer::Zeros({h}));
    head_weight_ = register_parameter(
        "head_weight", PartOf("head_weight", init.Normal({spec.vocab_size, h}, kInitStddev), tp));
  }
}

bool ModelStage::IsReplica(const std::string& name) const {
  if (tensor_->index() > 0 && ShardOfParameter(name).replicated()) return true;
  // The owner is the first holder: the stage embedding the input, the first
  // stage of a stack.
  if (name == "word_embedding") {
    return (spec_.tie_word_embeddings || spec_.t5v11) && !role_.embeds_input;
  }
  if (name == "encoder_relative_bias") return spec_.t5v11 && role_.encoder_layers.begin > 0;
  if (name == "decoder_relative_bias") return spec_.t5v11 && role_.decoder_layers.begin > 0;
  return false;
}

std::vector<SharedParameter> SharedParameters(const ModelSpec& spec,
                                              const std::vector<StageRole>& roles) {
  std::vector<SharedParameter> out;
  const auto add = [&](const char* name, auto holds) {
    SharedParameter shared{.name = name, .stages = {}};
    for (const StageRole& role : roles) {
      if (holds(role)) shared.stages.push_back(role.stage);
    }
    if (shared.stages.size() > 1) out.push_back(std::move(shared));
  };
  if (spec.tie_word_embeddings) {
    add("word_embedding", [](const StageRole& r) { return r.embeds_input || r.has_head; });
  }
  if (spec.t5v11) {
    add("word_embedding", [](const StageRole& r) { return r.embeds_input || r.embeds_decoder; });
    add("encoder_relative_bias", [](const StageRole& r) { return r.encoder_layers.size() > 0; });
    add("decoder_relative_bias", [](const StageRole& r) { return r.decoder_layers.size() > 0; });
  }
  return out;
}

std::vector<SharedParameterGroup> SharedParameterGroups(const ModelSpec& spec,
                                                        const std::vector<StageRole>& roles,
                                                        int64_t stage, int replica_base) {
  std::vector<SharedParameterGroup> out;
  for (const SharedParameter& shared : SharedParameters(spec, roles)) {
    if (std::find(shared.stages.begin(), shared.stages.end(), stage) == shared.stages.end()) {
      continue;
    }
    SharedParameterGroup group{.name = shared.name, .ranks = {}};
    for (int64_t s : shared.stages) group.ranks.push_back(replica_base + static_cast<int>(s));
    out.push_back(std::move(group));
  }
  return out;
}

void ModelStage::SetSelectiveRecompute(bool on) {
  for (const std::shared_ptr<TransformerLayer>& layer : layers_) layer->set_recompute_attention(on);
}

void ModelStage::SetFullRecompute(bool on) {
  for (const std::shared_ptr<TransformerLayer>& layer : layers_) layer->set_recompute_full(on);
}

torch::Tensor ModelStage::Embed(const torch::Tensor& tokens, const torch::Tensor& word,
                                const torch::Tensor& position,
                                const torch::Tensor& positions) const {
  const torch::Tensor words = VocabParallelEmbedding(tokens, word, vocab_begin_, *tensor_);
  // The sum in the tables' dtype (fp32), the residual stream in the compute
  // dtype.
  const auto residual = [](const torch::Tensor& x) { return x.to(ComputeDtype(x)); };
  if (!position.defined()) return residual(words);  // LLAMA: rotary positions in the layers
  if (positions.defined()) return residual(words + torch::embedding(position, positions));
  return residual(words + position.slice(0, 0, tokens.size(1)).unsqueeze(0));
}

torch::Tensor ModelStage::LayerPositions(const torch::Tensor& positions,
                                         const torch::Tensor& hidden,
                                         const torch::Tensor& bias_table,
                                         bool bidirectional) const {
  if (!spec_.llama && !spec_.t5v11) return {};
  // Packed rows restart positions per sample; an unpacked row counts 0..s-1.
  const torch::Tensor at =
      positions.defined() ? positions : SequentialPositions(hidden.size(1), hidden.device());
  if (spec_.llama) return RotaryTable(spec_, at);
  return RelativePositionBias(bias_table,
                              RelativePositionBuckets(at, at, bidirectional, spec_.relative_buckets,
                                                      spec_.relative_max_distance));
}

torch::Tensor ModelStage::FinalNorm(const torch::Tensor& x, const torch::Tensor& weight,
                                    const torch::Tensor& bias) const {
  if (spec_.llama || spec_.t5v11) return RmsNorm(x, weight, spec_.norm_epsilon);
  return LayerNormalization(x, weight, bias, 1e-5);
}

AttentionInput ModelStage::PackedSelfInput(const torch::Tensor& segments, bool causal,
                                           bool per_sample) {
  if (per_sample) {
    return AttentionInput::VariableLength(
        VariableLengthLayout::FromSegments(segments, segments, causal));
  }
  return AttentionInput::DenseMask(SegmentSelfAttentionMask(segments, causal));
}

torch::Tensor LabelledPositionsOf(const torch::Tensor& labels) {
  return (labels.reshape({-1}) >= 0).nonzero().reshape({-1});
}

int64_t ModelStage::loss_chunk_tokens() const {
  if (loss_chunk_tokens_ > 0) return loss_chunk_tokens_;
  return DefaultLossChunkTokens(head_weight_.defined() ? head_weight_.size(0) : spec_.vocab_size);
}

torch::Tensor ModelStage::HeadLoss(const torch::Tensor& hidden, const StageBatch& batch) const {
  const torch::Tensor positions = batch.labelled_positions.defined()
                                      ? batch.labelled_positions
                                      : LabelledPositionsOf(batch.labels);
  // The labelled rows only (the norm is per position, so gathering first is
  // exact); their gradient is scattered back by index_select's backward.
  const torch::Tensor rows = hidden.reshape({-1, hidden.size(-1)}).index_select(0, positions);
  const torch::Tensor labels = batch.labels.reshape({-1}).index_select(0, positions);
  // Column-parallel over the vocabulary: this rank's logits, a chunk at a
  // time.
  return ChunkedLinearCrossEntropy(
      CopyToTensorRegion(FinalNorm(rows, final_ln_weight_, final_ln_bias_), *tensor_), head_weight_,
      labels, vocab_begin_, *tensor_, loss_chunk_tokens());
}

torch::Tensor ModelStage::RunLayers(size_t first, int64_t count, torch::Tensor hidden,
                                    const AttentionInput& self_input, const torch::Tensor& memory,
                                    const AttentionInput& cross_input,
                                    const torch::Tensor& position) {
  if (count == 0) return hidden;
  const int64_t length = hidden.size(1);
  const bool sequence_parallel = tensor_->sequence_parallel();
  if (sequence_parallel) hidden = ScatterToSequence(hidden, *tensor_);
  for (int64_t i = 0; i < count; ++i) {
    hidden = layers_[first + static_cast<size_t>(i)]->Forward(hidden, self_input, memory,
                                                              cross_input, position, length);
  }
  // What follows (the next stage, a norm, the head) holds whole sequences,
  // the same on every tensor rank.
  if (sequence_parallel) {
    hidden = GatherFromSequence(hidden, *tensor_, length, /*reduce_grad=*/false);
  }
  return hidden;
}

StageActivations ModelStage::Forward(const StageActivations& in, const StageBatch& batch) {
  StageActivations out;
  // Received activations in the compute dtype (a no-op when they come in
  // it, as the plan's buffers do under mixed precision).
  const auto residual = [](const torch::Tensor& x) {
    return x.defined() ? x.to(ComputeDtype(x)) : x;
  };
  torch::Tensor hidden = residual(in.hidden);
  torch::Tensor memory = residual(in.memory);
  size_t next_layer = 0;
  // Encoder (GPT: the whole model) part.
  const bool packed = batch.input_segments.defined();
  // A split micro-batch: each token's place in its own sample.
  const torch::Tensor& input_positions =
      batch.context ? batch.context->positions() : batch.input_positions;
  if (role_.embeds_input) {
    hidden = Embed(batch.input_tokens, word_embedding_, position_embedding_, input_positions);
  }
  if (role_.encoder_layers.size() > 0 && batch.context) {
    TORCH_CHECK(!spec_.encoder_decoder, "a T5 stage cannot run a context-parallel micro-batch");
    TORCH_CHECK(context_->size() == batch.context->split().group_size(),
                "a micro-batch split over ", batch.context->split().group_size(),
                " lanes on a stage whose context group has ", context_->size());
    // The lanes' keys and values gathered in every layer; LLAMA's rotary
    // angles from the tokens' own positions.
    const AttentionInput self_input =
        AttentionInput::ContextParallel(batch.context, context_.get());
    const torch::Tensor position = LayerPositions(input_positions, hidden, torch::Tensor(),
                                                  /*bidirectional=*/true);
    hidden = RunLayers(next_layer, role_.encoder_layers.size(), hidden, self_input, {},
                       AttentionInput(), position);
    next_layer += static_cast<size_t>(role_.encoder_layers.size());
  } else if (role_.encoder_layers.size() > 0) {
    const bool causal = !spec_.encoder_decoder;
    // One input (and for packed rows one layout) for all of the stage's
    // layers.
    const AttentionInput self_input =
        packed ? PackedSelfInput(batch.input_segments, causal, batch.per_sample_attention)
               : SelfAttentionMaskFor(spec_.attention_kernel, batch.input_lengths, hidden.size(1),
                                      causal);
    // LLAMA: each token's rotary angles; T5V11: the encoder's bidirectional
    // position bias, once for all layers; both restart per sample in packed
    // rows.
    const torch::Tensor position =
        LayerPositions(batch.input_positions, hidden, encoder_relative_bias_,
                       /*bidirectional=*/true);
    hidden = RunLayers(next_layer, role_.encoder_layers.size(), hidden, self_input, {},
                       AttentionInput(), position);
    next_layer += static_cast<size_t>(role_.encoder_layers.size());
  }
  if (role_.ends_encoder) hidden = FinalNorm(hidden, encoder_ln_weight_, encoder_ln_bias_);
  // Decoder part (T5).
  if (spec_.encoder_decoder && (role_.embeds_decoder || role_.decoder_layers.size() > 0)) {
    if (role_.embeds_decoder) {
      memory = hidden;  // the encoder output
      // T5V11 shares the encoder's embedding.
      hidden = Embed(batch.decoder_tokens, spec_.t5v11 ? word_embedding_ : decoder_word_embedding_,
                     decoder_position_embedding_, batch.target_positions);
    }
    const AttentionInput self_input =
        packed ? PackedSelfInput(batch.target_segments, /*causal=*/true, batch.per_sample_attention)
               : SelfAttentionMaskFor(spec_.attention_kernel, batch.target_lengths, hidden.size(1),
                                      /*causal=*/true);
    // Each target's queries over its own sample's encoder keys.
    const AttentionInput cross_input =
        !packed ? AttentionInput::DenseMask(
                      CrossAttentionMask(batch.input_lengths, hidden.size(1), memory.size(1)))
        : batch.per_sample_attention
            ? AttentionInput::VariableLength(VariableLengthLayout::FromSegments(
                  batch.target_segments, batch.input_segments, /*causal=*/false))
            : AttentionInput::DenseMask(
                  SegmentCrossAttentionMask(batch.target_segments, batch.input_segments));
    // T5V11: the decoder's causal position bias.
    const torch::Tensor position =
        LayerPositions(batch.target_positions, hidden, decoder_relative_bias_,
                       /*bidirectional=*/false);
    hidden = RunLayers(next_layer, role_.decoder_layers.size(), hidden, self_input, memory,
                       cross_input, position);
    out.memory = memory;
  }
  out.hidden = hidden;
  if (role_.has_head) out.loss = HeadLoss(hidden, batch) * batch.loss_scale;
  return out;
}

}  // namespace varipipe::executor
