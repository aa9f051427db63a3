#include "executor/model/model_spec.h"

#include <torch/version.h>

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/config/job_config.h"
#include "common/status.h"
#include "executor/model/attention_mask.h"

namespace varipipe::executor {

namespace {

// The spec's fields from the (defaulted) job config, before any check.
ModelSpec SpecFields(const v1::JobConfig& resolved) {
  const v1::ModelConfig& model = resolved.model();
  ModelSpec spec;
  spec.encoder_decoder = model.kind() == v1::T5;
  spec.num_layers = model.num_layers();
  spec.num_decoder_layers = spec.encoder_decoder ? model.num_decoder_layers() : 0;
  spec.hidden_size = model.hidden_size();
  spec.num_attention_heads = model.num_attention_heads();
  spec.kv_channels = model.kv_channels();
  spec.ffn_hidden_size = model.ffn_hidden_size();
  spec.vocab_size = model.vocab_size();
  spec.max_sequence_length =
      std::max(resolved.data().max_sequence_length(), resolved.data().max_target_length());
  spec.seed = resolved.data().seed();
  spec.attention_kernel = model.attention_kernel();
  spec.llama = model.architecture() == v1::LLAMA;
  if (spec.llama) {
    spec.num_key_value_heads = model.num_key_value_heads();
    spec.norm_epsilon = model.norm_epsilon();
    spec.rope_theta = model.rope_theta();
    if (model.has_rope_scaling()) {
      spec.rope_factor = model.rope_scaling().factor();
      spec.rope_low_freq_factor = model.rope_scaling().low_freq_factor();
      spec.rope_high_freq_factor = model.rope_scaling().high_freq_factor();
      spec.rope_original_max_positions = model.rope_scaling().original_max_position_embeddings();
    }
    spec.tie_word_embeddings = model.tie_word_embeddings();
    spec.max_position_embeddings = model.max_position_embeddings();
  }
  spec.tensor_parallel = std::max<int64_t>(1, resolved.parallelism().tensor());
  spec.sequence_parallel = resolved.parallelism().sequence_parallel();
  spec.context_parallel = std::max<int64_t>(1, resolved.parallelism().context());
  spec.t5v11 = model.architecture() == v1::T5V11;
  if (spec.t5v11) {
    spec.norm_epsilon = model.norm_epsilon();
    spec.relative_buckets = model.relative_attention_num_buckets();
    spec.relative_max_distance = model.relative_attention_max_distance();
  }
  return spec;
}

// Every tensor rank holds whole heads and an equal part of the MLP width, and
// some of the vocabulary (tensor_shard.h).
absl::Status CheckTensorParallel(const ModelSpec& spec) {
  const int64_t t = spec.tensor_parallel;
  const int64_t kv_heads = spec.llama ? spec.num_key_value_heads : spec.num_attention_heads;
  if (spec.num_attention_heads % t != 0 || kv_heads % t != 0 || spec.ffn_hidden_size % t != 0 ||
      spec.vocab_size < t) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallelism.tensor (", t, ") must divide model.num_attention_heads (",
                     spec.num_attention_heads, "), the key/value heads (", kv_heads,
                     ") and model.ffn_hidden_size (", spec.ffn_hidden_size,
                     ") and be at most model.vocab_size (", spec.vocab_size, ")"));
  }
  return absl::OkStatus();
}

// Sizes positive and the architecture's own constraints.
absl::Status CheckDimensions(const ModelSpec& spec) {
  const auto require = [](int64_t value, const char* field) -> absl::Status {
    if (value > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(field, " must be positive"));
  };
  VP_RETURN_IF_ERROR(require(spec.num_layers, "model.num_layers"));
  VP_RETURN_IF_ERROR(require(spec.hidden_size, "model.hidden_size"));
  VP_RETURN_IF_ERROR(require(spec.num_attention_heads, "model.num_attention_heads"));
  VP_RETURN_IF_ERROR(require(spec.kv_channels, "model.kv_channels"));
  VP_RETURN_IF_ERROR(require(spec.ffn_hidden_size, "model.ffn_hidden_size"));
  VP_RETURN_IF_ERROR(require(spec.vocab_size, "model.vocab_size"));
  VP_RETURN_IF_ERROR(require(spec.max_sequence_length, "data.max_sequence_length"));
  if (spec.encoder_decoder) {
    VP_RETURN_IF_ERROR(require(spec.num_decoder_layers, "model.num_decoder_layers"));
  }
  if (spec.llama) {
    if (spec.encoder_decoder) {
      return absl::InvalidArgumentError("model.architecture LLAMA needs model.kind GPT");
    }
    VP_RETURN_IF_ERROR(require(spec.num_key_value_heads, "model.num_key_value_heads"));
    if (spec.num_attention_heads % spec.num_key_value_heads != 0 || spec.kv_channels % 2 != 0) {
      return absl::InvalidArgumentError(
          "model.num_key_value_heads must divide model.num_attention_heads and "
          "model.kv_channels must be even");
    }
  }
  if (spec.t5v11) {
    if (!spec.encoder_decoder) {
      return absl::InvalidArgumentError("model.architecture T5V11 needs model.kind T5");
    }
    if (spec.relative_buckets < 4 || spec.relative_buckets % 2 != 0 ||
        spec.relative_max_distance <= spec.relative_buckets / 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.relative_attention_num_buckets (", spec.relative_buckets,
                       ") must be even and at least 4, and model.relative_attention_max_distance (",
                       spec.relative_max_distance, ") above half of it"));
    }
  }
  if (spec.encoder_decoder && spec.context_parallel > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallelism.context (", spec.context_parallel,
        ") must be 1 for T5 models: context parallelism splits the causal self-attention of "
        "GPT and LLAMA models only"));
  }
  return CheckTensorParallel(spec);
}

absl::Status CheckAttentionKernel(const ModelSpec& spec) {
  if (spec.attention_kernel == v1::FUSED && !FusedAttentionAvailable()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.attention_kernel: FUSED needs torch's scaled_dot_product_attention (LibTorch 2.0 "
        "or newer); this build has LibTorch ",
        TORCH_VERSION, ": use EXPLICIT, or rebuild with a newer LibTorch"));
  }
  if (spec.attention_kernel != v1::EXPLICIT && spec.attention_kernel != v1::FUSED) {
    return absl::InvalidArgumentError("model.attention_kernel must be EXPLICIT or FUSED");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelSpec> ModelSpecFromConfig(const v1::JobConfig& config) {
  v1::JobConfig resolved = config;
  ApplyJobConfigDefaults(resolved);
  ModelSpec spec = SpecFields(resolved);
  VP_RETURN_IF_ERROR(CheckDimensions(spec));
  switch (EffectiveLayoutMode(resolved.parallelism().stage_layout())) {
    case v1::LISTED: {
      VP_ASSIGN_OR_RETURN(spec.layers, ConfiguredLayerLayout(resolved));
      break;
    }
    case v1::AUTO:
      spec.layout_auto = true;
      break;
    default:
      break;
  }
  VP_RETURN_IF_ERROR(CheckAttentionKernel(spec));
  return spec;
}

}  // namespace varipipe::executor
