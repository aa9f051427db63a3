#include "executor/model/model_stage.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "executor/model/attention_mask.h"
#include "executor/model/deferred_linear.h"
#include "executor/model/initializer.h"
#include "executor/model/rotary.h"

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

absl::StatusOr<std::vector<StageRole>> PipelineStageRoles(const ModelSpec& spec,
                                                          int64_t num_stages) {
  if (num_stages < 1) return absl::InvalidArgumentError("the pipeline needs at least one stage");
  std::vector<StageRole> roles(num_stages);
  for (int64_t i = 0; i < num_stages; ++i) roles[i].stage = i;
  roles.front().embeds_input = true;
  roles.back().has_head = true;
  if (!spec.encoder_decoder) {
    if (spec.num_layers < num_stages) {
      return absl::InvalidArgumentError(
          absl::StrCat(spec.num_layers, " layers cannot fill ", num_stages, " pipeline stages"));
    }
    for (int64_t i = 0; i < num_stages; ++i) {
      roles[i].encoder_layers = StageLayers(spec.num_layers, num_stages, i);
    }
    return roles;
  }
  if (num_stages == 1) {
    roles[0].encoder_layers = {0, spec.num_layers};
    roles[0].decoder_layers = {0, spec.num_decoder_layers};
    roles[0].ends_encoder = true;
    roles[0].embeds_decoder = true;
    return roles;
  }
  // Devices in proportion to the layer counts, at least one each (the
  // planner's memory model splits the same way).
  const double share = static_cast<double>(spec.num_layers) /
                       static_cast<double>(spec.num_layers + spec.num_decoder_layers);
  const int64_t encoder_stages = std::clamp<int64_t>(
      static_cast<int64_t>(share * static_cast<double>(num_stages) + 0.5), 1, num_stages - 1);
  const int64_t decoder_stages = num_stages - encoder_stages;
  if (spec.num_layers < encoder_stages || spec.num_decoder_layers < decoder_stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("T5 with ", spec.num_layers, " encoder and ", spec.num_decoder_layers,
                     " decoder layers cannot fill ", encoder_stages, " encoder and ",
                     decoder_stages, " decoder stages"));
  }
  for (int64_t i = 0; i < encoder_stages; ++i) {
    roles[i].encoder_layers = StageLayers(spec.num_layers, encoder_stages, i);
  }
  roles[encoder_stages - 1].ends_encoder = true;
  roles[encoder_stages].embeds_decoder = true;
  for (int64_t i = 0; i < decoder_stages; ++i) {
    roles[encoder_stages + i].decoder_layers =
        StageLayers(spec.num_decoder_layers, decoder_stages, i);
  }
  return roles;
}

ModelStage::ModelStage(const ModelSpec& spec, const StageRole& role) : spec_(spec), role_(role) {
  const int64_t h = spec.hidden_size;
  // GPT / T5 encoder embedding (index 0) and T5 decoder embedding (index 1,
  // untied from the encoder's).
  // LLAMA has no position table (rotary positions in every layer), and a
  // tied head reuses word_embedding: the same tensor on one stage, a
  // replica on the last stage otherwise (tied_embedding()).
  if (role.embeds_input || (spec.tie_word_embeddings && role.has_head)) {
    Initializer init(spec.seed, ModelComponent::kEmbedding, 0);
    word_embedding_ =
        register_parameter("word_embedding", init.Normal({spec.vocab_size, h}, kInitStddev));
    if (!spec.llama) {
      position_embedding_ = register_parameter(
          "position_embedding", init.Normal({spec.max_sequence_length, h}, kInitStddev));
    }
  }
  if (role.embeds_decoder) {
    Initializer init(spec.seed, ModelComponent::kEmbedding, 1);
    decoder_word_embedding_ = register_parameter("decoder_word_embedding",
                                                 init.Normal({spec.vocab_size, h}, kInitStddev));
    decoder_position_embedding_ = register_parameter(
        "decoder_position_embedding", init.Normal({spec.max_sequence_length, h}, kInitStddev));
  }
  const int64_t total_layers = spec.num_layers + spec.num_decoder_layers;
  for (int64_t i = role.encoder_layers.begin; i < role.encoder_layers.end; ++i) {
    layers_.push_back(register_module(
        absl::StrCat("encoder_layer_", i),
        std::make_shared<TransformerLayer>(spec, ModelComponent::kEncoderLayer, i, total_layers)));
  }
  if (role.ends_encoder) {
    encoder_ln_weight_ = register_parameter("encoder_ln_weight", Initializer::Ones({h}));
    encoder_ln_bias_ = register_parameter("encoder_ln_bias", Initializer::Zeros({h}));
  }
  for (int64_t i = role.decoder_layers.begin; i < role.decoder_layers.end; ++i) {
    layers_.push_back(register_module(
        absl::StrCat("decoder_layer_", i),
        std::make_shared<TransformerLayer>(spec, ModelComponent::kDecoderLayer, i, total_layers)));
  }
  if (role.has_head && spec.llama) {
    Initializer init(spec.seed, ModelComponent::kHead, 0);
    final_ln_weight_ = register_parameter("final_norm_weight", Initializer::Ones({h}));
    head_weight_ =
        spec.tie_word_embeddings
            ? word_embedding_
            : register_parameter("head_weight", init.Normal({spec.vocab_size, h}, kInitStddev));
  } else if (role.has_head) {
    Initializer init(spec.seed, ModelComponent::kHead, 0);
    final_ln_weight_ = register_parameter("final_ln_weight", Initializer::Ones({h}));
    final_ln_bias_ = register_parameter("final_ln_bias", Initializer::Zeros({h}));
    head_weight_ =
        register_parameter("head_weight", init.Normal({spec.vocab_size, h}, kInitStddev));
  }
}

torch::Tensor ModelStage::tied_embedding() const {
  if (!spec_.tie_word_embeddings || role_.embeds_input == role_.has_head) return {};
  return word_embedding_;
}

bool ModelStage::IsReplica(const std::string& name) const {
  return spec_.tie_word_embeddings && role_.has_head && !role_.embeds_input &&
         name == "word_embedding";
}

std::vector<int> TiedEmbeddingRanks(const ModelSpec& spec, int64_t pipeline, int replica_base) {
  if (!spec.tie_word_embeddings || pipeline <= 1) return {};
  return {replica_base, replica_base + static_cast<int>(pipeline) - 1};
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
  const torch::Tensor words = torch::embedding(word, tokens);
  if (!position.defined()) return words;  // LLAMA: rotary positions in the layers
  if (positions.defined()) return words + torch::embedding(position, positions);
  return words + position.slice(0, 0, tokens.size(1)).unsqueeze(0);
}

StageActivations ModelStage::Forward(const StageActivations& in, const StageBatch& batch) {
  StageActivations out;
  torch::Tensor hidden = in.hidden;
  torch::Tensor memory = in.memory;
  size_t next_layer = 0;
  // Encoder (GPT: the whole model) part.
  const bool packed = batch.input_segments.defined();
  if (role_.embeds_input) {
    hidden = Embed(batch.input_tokens, word_embedding_, position_embedding_, batch.input_positions);
  }
  if (role_.encoder_layers.size() > 0) {
    const bool causal = !spec_.encoder_decoder;
    const torch::Tensor mask =
        packed ? SegmentSelfAttentionMask(batch.input_segments, causal)
               : SelfAttentionMaskFor(spec_.attention_kernel, batch.input_lengths, hidden.size(1),
                                      causal);
    // LLAMA: each token's rotary angles, restarting per sample in packed rows.
    const torch::Tensor rotary =
        spec_.llama
            ? RotaryTable(spec_, packed ? batch.input_positions
                                        : SequentialPositions(hidden.size(1), hidden.device()))
            : torch::Tensor();
    for (int64_t i = 0; i < role_.encoder_layers.size(); ++i) {
      hidden = layers_[next_layer++]->Forward(hidden, mask, {}, {}, rotary);
    }
  }
  if (role_.ends_encoder) {
    hidden =
        torch::layer_norm(hidden, {spec_.hidden_size}, encoder_ln_weight_, encoder_ln_bias_, 1e-5);
  }
  // Decoder part (T5).
  if (spec_.encoder_decoder && (role_.embeds_decoder || role_.decoder_layers.size() > 0)) {
    if (role_.embeds_decoder) {
      memory = hidden;  // the encoder output
      hidden = Embed(batch.decoder_tokens, decoder_word_embedding_, decoder_position_embedding_,
                     batch.target_positions);
    }
    const torch::Tensor self_mask =
        packed ? SegmentSelfAttentionMask(batch.target_segments, /*causal=*/true)
               : SelfAttentionMaskFor(spec_.attention_kernel, batch.target_lengths, hidden.size(1),
                                      /*causal=*/true);
    const torch::Tensor cross_mask =
        packed ? SegmentCrossAttentionMask(batch.target_segments, batch.input_segments)
               : CrossAttentionMask(batch.input_lengths, hidden.size(1), memory.size(1));
    for (int64_t i = 0; i < role_.decoder_layers.size(); ++i) {
      hidden = layers_[next_layer++]->Forward(hidden, self_mask, memory, cross_mask);
    }
    out.memory = memory;
  }
  out.hidden = hidden;
  if (role_.has_head) {
    const torch::Tensor normed = spec_.llama
                                     ? RmsNorm(hidden, final_ln_weight_, spec_.norm_epsilon)
                                     : torch::layer_norm(hidden, {spec_.hidden_size},
                                                         final_ln_weight_, final_ln_bias_, 1e-5);
    const torch::Tensor logits = DeferredLinear(normed, head_weight_);
    const torch::Tensor token_loss = torch::nn::functional::cross_entropy(
        logits.reshape({-1, spec_.vocab_size}).to(torch::kFloat32), batch.labels.reshape({-1}),
        torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1).reduction(torch::kSum));
    out.loss = token_loss * batch.loss_scale;
  }
  return out;
}

}  // namespace varipipe::executor
