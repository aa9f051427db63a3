#include "executor/model/hf_weights.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/checkpoint/hf_model_config.h"
#include "common/status.h"
#include "executor/model/tensor_shard.h"

namespace varipipe::executor {
namespace {

// Per-layer parameters of a LLAMA layer and their Hugging Face suffixes
// under "model.layers.<i>." (docs/models.md, "Weight layout").
constexpr std::pair<const char*, const char*> kLlamaLayer[] = {
    {"attn_norm_weight", "input_layernorm.weight"},
    {"q_weight", "self_attn.q_proj.weight"},
    {"k_weight", "self_attn.k_proj.weight"},
    {"v_weight", "self_attn.v_proj.weight"},
    {"o_weight", "self_attn.o_proj.weight"},
    {"mlp_norm_weight", "post_attention_layernorm.weight"},
    {"gate_weight", "mlp.gate_proj.weight"},
    {"up_weight", "mlp.up_proj.weight"},
    {"down_weight", "mlp.down_proj.weight"},
};

// T5V11 layer parameters and their Hugging Face suffixes under
// "encoder.block.<i>." or "decoder.block.<i>." (docs/models.md, "Weight
// layout"); the cross-attention block is decoder-only and moves the MLP
// from layer.1 to layer.2.
constexpr std::pair<const char*, const char*> kT5SelfAttention[] = {
    {"attn_norm_weight", "layer.0.layer_norm.weight"},
    {"q_weight", "layer.0.SelfAttention.q.weight"},
    {"k_weight", "layer.0.SelfAttention.k.weight"},
    {"v_weight", "layer.0.SelfAttention.v.weight"},
    {"o_weight", "layer.0.SelfAttention.o.weight"},
};
constexpr std::pair<const char*, const char*> kT5CrossAttention[] = {
    {"cross_norm_weight", "layer.1.layer_norm.weight"},
    {"xq_weight", "layer.1.EncDecAttention.q.weight"},
    {"xk_weight", "layer.1.EncDecAttention.k.weight"},
    {"xv_weight", "layer.1.EncDecAttention.v.weight"},
    {"xo_weight", "layer.1.EncDecAttention.o.weight"},
};
constexpr std::pair<const char*, const char*> kT5Mlp[] = {
    {"mlp_norm_weight", "layer_norm.weight"},
    {"gate_weight", "DenseReluDense.wi_0.weight"},
    {"up_weight", "DenseReluDense.wi_1.weight"},
    {"down_weight", "DenseReluDense.wo.weight"},
};
// T5V11 parameters outside the layers.
constexpr std::pair<const char*, const char*> kT5Model[] = {
    {"word_embedding", "shared.weight"},
    {"encoder_relative_bias",
     "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"},
    {"decoder_relative_bias",
     "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"},
    {"encoder_norm_weight", "encoder.final_layer_norm.weight"},
    {"final_norm_weight", "decoder.final_layer_norm.weight"},
    {"head_weight", "lm_head.weight"},
};

absl::Status NeedsHuggingFaceLayout(const ModelSpec& spec) {
  if (spec.llama && !spec.encoder_decoder) return absl::OkStatus();
  if (spec.t5v11 && spec.encoder_decoder) return absl::OkStatus();
  return absl::InvalidArgumentError(
      "Hugging Face checkpoints load into model.architecture LLAMA (kind GPT) or T5V11 (kind T5) "
      "only; MEGATRON GPT and T5 have no Hugging Face layout");
}

// The Hugging Face names of T5V11 layer `index` of a stack ("encoder" or
// "decoder"), by our parameter name.
std::vector<std::pair<std::string, std::string>> T5LayerNames(const std::string& stack,
                                                              int64_t index) {
  const bool decoder = stack == "decoder";
  const std::string block = absl::StrCat(stack, ".block.", index, ".");
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [ours, theirs] : kT5SelfAttention) out.emplace_back(ours, block + theirs);
  if (decoder) {
    for (const auto& [ours, theirs] : kT5CrossAttention) out.emplace_back(ours, block + theirs);
  }
  const std::string mlp = block + (decoder ? "layer.2." : "layer.1.");
  for (const auto& [ours, theirs] : kT5Mlp) out.emplace_back(ours, mlp + theirs);
  return out;
}

absl::StatusOr<std::string> T5Name(const std::string& name) {
  for (const auto& [ours, theirs] : kT5Model) {
    if (name == ours) return std::string(theirs);
  }
  const std::vector<std::string> parts = absl::StrSplit(name, '.');
  int64_t layer = 0;
  for (const char* stack : {"encoder", "decoder"}) {
    const std::string prefix = absl::StrCat(stack, "_layer_");
    if (parts.size() == 2 && absl::StartsWith(parts[0], prefix) &&
        absl::SimpleAtoi(parts[0].substr(prefix.size()), &layer)) {
      for (const auto& [ours, theirs] : T5LayerNames(stack, layer)) {
        if (parts[1] == ours) return theirs;
      }
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("parameter '", name, "' has no Hugging Face name (docs/models.md)"));
}

absl::StatusOr<torch::Dtype> TorchDtypeOf(const SafetensorsTensor& t, const std::string& path) {
  if (t.dtype == "F32") return torch::kFloat32;
  if (t.dtype == "BF16") return torch::kBFloat16;
  if (t.dtype == "F16") return torch::kFloat16;
  return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", t.name, "' has dtype ",
                                                 t.dtype, "; weights must be F32, F16 or BF16"));
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

absl::StatusOr<std::string> HuggingFaceName(const ModelSpec& spec, std::string_view name_view) {
  VP_RETURN_IF_ERROR(NeedsHuggingFaceLayout(spec));
  const std::string name(name_view);
  if (spec.t5v11) return T5Name(name);
  if (name == "word_embedding") return std::string("model.embed_tokens.weight");
  if (name == "final_norm_weight") return std::string("model.norm.weight");
  if (name == "head_weight") return std::string("lm_head.weight");
  const std::vector<std::string> parts = absl::StrSplit(name, '.');
  int64_t layer = 0;
  if (parts.size() == 2 && absl::StartsWith(parts[0], "encoder_layer_") &&
      absl::SimpleAtoi(parts[0].substr(std::string("encoder_layer_").size()), &layer)) {
    for (const auto& [ours, theirs] : kLlamaLayer) {
      if (parts[1] == ours) return absl::StrCat("model.layers.", layer, ".", theirs);
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("parameter '", name, "' has no Hugging Face name (docs/models.md)"));
}

absl::StatusOr<std::vector<std::string>> HuggingFaceNames(const ModelSpec& spec) {
  VP_RETURN_IF_ERROR(NeedsHuggingFaceLayout(spec));
  if (spec.t5v11) {
    std::vector<std::string> names;
    for (const auto& [ours, theirs] : kT5Model) names.push_back(theirs);
    for (int64_t i = 0; i < spec.num_layers; ++i) {
      for (const auto& [ours, theirs] : T5LayerNames("encoder", i)) names.push_back(theirs);
    }
    for (int64_t i = 0; i < spec.num_decoder_layers; ++i) {
      for (const auto& [ours, theirs] : T5LayerNames("decoder", i)) names.push_back(theirs);
    }
    std::sort(names.begin(), names.end());
    return names;
  }
  std::vector<std::string> names = {"model.embed_tokens.weight", "model.norm.weight"};
  if (!spec.tie_word_embeddings) names.push_back("lm_head.weight");
  for (int64_t i = 0; i < spec.num_layers; ++i) {
    for (const auto& [ours, theirs] : kLlamaLayer) {
      names.push_back(absl::StrCat("model.layers.", i, ".", theirs));
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

namespace {

// transformers' LlamaConfig.max_position_embeddings when config.json has none.
constexpr int64_t kLlamaDefaultMaxPositions = 2048;

// A config.json number against the job's.
struct ConfigField {
  const char* hf;   // config.json's name
  const char* job;  // the job's
  double theirs;
  double ours;
};

absl::Status FirstDifference(const std::string& path, const std::vector<ConfigField>& fields) {
  for (const ConfigField& f : fields) {
    if (std::abs(f.theirs - f.ours) <= 1e-9 * std::max(1.0, std::abs(f.ours))) continue;
    const bool flag = std::string_view(f.hf) == "tie_word_embeddings";
    const auto text = [flag](double v) {
      return flag ? std::string(v != 0 ? "true" : "false") : absl::StrCat(v);
    };
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", f.hf, " is ", text(f.theirs),
                                                   " but the job's ", f.job, " is ", text(f.ours)));
  }
  return absl::OkStatus();
}

// T5Config's fields (ModelConfigFromHuggingFace refused what T5V11 cannot
// express) against the job's T5V11 model.
absl::Status CheckT5Config(const std::string& path, const v1::ModelConfig& m,
                           const ModelSpec& spec) {
  const auto real = [](auto v) { return static_cast<double>(v); };
  return FirstDifference(
      path,
      {{"d_model", "model.hidden_size", real(m.hidden_size()), real(spec.hidden_size)},
       {"num_layers", "model.num_layers", real(m.num_layers()), real(spec.num_layers)},
       {"num_decoder_layers", "model.num_decoder_layers", real(m.num_decoder_layers()),
        real(spec.num_decoder_layers)},
       {"num_heads", "model.num_attention_heads", real(m.num_attention_heads()),
        real(spec.num_attention_heads)},
       {"d_kv", "model.kv_channels", real(m.kv_channels()), real(spec.kv_channels)},
       {"d_ff", "model.ffn_hidden_size", real(m.ffn_hidden_size()), real(spec.ffn_hidden_size)},
       {"vocab_size", "model.vocab_size", real(m.vocab_size()), real(spec.vocab_size)},
       {"layer_norm_epsilon", "model.norm_epsilon", m.norm_epsilon(), spec.norm_epsilon},
       {"relative_attention_num_buckets", "model.relative_attention_num_buckets",
        real(m.relative_attention_num_buckets()), real(spec.relative_buckets)},
       {"relative_attention_max_distance", "model.relative_attention_max_distance",
        real(m.relative_attention_max_distance()), real(spec.relative_max_distance)}});
}

}  // namespace

absl::Status CheckHuggingFaceConfig(const HuggingFaceCheckpoint& ckpt, const ModelSpec& spec) {
  VP_RETURN_IF_ERROR(NeedsHuggingFaceLayout(spec));
  // config.json read as `varipipe-plan --model_from_hf` reads it (both
  // layouts of transformers, its defaults, what LLAMA cannot express).
  const std::string path = (std::filesystem::path(ckpt.dir()) / "config.json").string();
  VP_ASSIGN_OR_RETURN(const v1::ModelConfig m, ModelConfigFromHuggingFace(path));
  if (spec.t5v11 != (m.architecture() == v1::T5V11)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": model_type is ", m.architecture() == v1::T5V11 ? "t5" : "llama",
                     " but the job's model.architecture is ", spec.t5v11 ? "T5V11" : "LLAMA"));
  }
  if (spec.t5v11) return CheckT5Config(path, m, spec);
  const v1::RopeScaling& r = m.rope_scaling();
  std::vector<ConfigField> fields = {
      {"hidden_size", "model.hidden_size", static_cast<double>(m.hidden_size()),
       static_cast<double>(spec.hidden_size)},
      {"num_hidden_layers", "model.num_layers", static_cast<double>(m.num_layers()),
       static_cast<double>(spec.num_layers)},
      {"num_attention_heads", "model.num_attention_heads",
       static_cast<double>(m.num_attention_heads()), static_cast<double>(spec.num_attention_heads)},
      {"num_key_value_heads", "model.num_key_value_heads",
       static_cast<double>(m.num_key_value_heads()), static_cast<double>(spec.num_key_value_heads)},
      {"intermediate_size", "model.ffn_hidden_size", static_cast<double>(m.ffn_hidden_size()),
       static_cast<double>(spec.ffn_hidden_size)},
      {"vocab_size", "model.vocab_size", static_cast<double>(m.vocab_size()),
       static_cast<double>(spec.vocab_size)},
      {"head_dim", "model.kv_channels", static_cast<double>(m.kv_channels()),
       static_cast<double>(spec.kv_channels)},
      {"rms_norm_eps", "model.norm_epsilon", m.norm_epsilon(), spec.norm_epsilon},
      {"rope_theta", "model.rope_theta", m.rope_theta(), spec.rope_theta},
      {"rope_scaling.factor", "model.rope_scaling.factor", r.factor(), spec.rope_factor},
      {"rope_scaling.low_freq_factor", "model.rope_scaling.low_freq_factor",
       m.has_rope_scaling() ? r.low_freq_factor() : spec.rope_low_freq_factor,
       spec.rope_low_freq_factor},
      {"rope_scaling.high_freq_factor", "model.rope_scaling.high_freq_factor",
       m.has_rope_scaling() ? r.high_freq_factor() : spec.rope_high_freq_factor,
       spec.rope_high_freq_factor},
      {"rope_scaling.original_max_position_embeddings",
       "model.rope_scaling.original_max_position_embeddings",
       m.has_rope_scaling() ? static_cast<double>(r.original_max_position_embeddings())
                            : spec.rope_original_max_positions,
       spec.rope_original_max_positions},
      {"tie_word_embeddings", "model.tie_word_embeddings", m.tie_word_embeddings() ? 1.0 : 0.0,
       spec.tie_word_embeddings ? 1.0 : 0.0},
  };
  // Only when the job declares it (an export carries config.json's); absent
  // from config.json, LlamaConfig's default (2048) holds.
  if (spec.max_position_embeddings > 0) {
    fields.push_back(
        {"max_position_embeddings", "model.max_position_embeddings",
         static_cast<double>(m.max_position_embeddings() > 0 ? m.max_position_embeddings()
                                                             : kLlamaDefaultMaxPositions),
         static_cast<double>(spec.max_position_embeddings)});
  }
  return FirstDifference(path, fields);
}

absl::Status LoadHuggingFaceWeights(HuggingFaceCheckpoint& ckpt, const ModelSpec& spec,
                                    const std::vector<ModelStage*>& stages,
                                    bool reject_unexpected) {
  VP_RETURN_IF_ERROR(NeedsHuggingFaceLayout(spec));
  if (reject_unexpected) {
    VP_ASSIGN_OR_RETURN(const std::vector<std::string> expected, HuggingFaceNames(spec));
    const std::set<std::string> known(expected.begin(), expected.end());
    for (const std::string& name : ckpt.TensorNames()) {
      // T5: the stacks' aliases of the shared embedding, which some
      // checkpoints store beside shared.weight.
      if (known.count(name) > 0 || absl::EndsWith(name, ".rotary_emb.inv_freq") ||
          (spec.tie_word_embeddings && name == "lm_head.weight") ||
          (spec.t5v11 &&
           (name == "encoder.embed_tokens.weight" || name == "decoder.embed_tokens.weight"))) {
        continue;
      }
      return absl::InvalidArgumentError(absl::StrCat(ckpt.dir(), ": unexpected tensor '", name,
                                                     "': the job's model has no place for it"));
    }
  }
  // Check every tensor of every stage before copying any. Under tensor
  // parallelism a rank keeps its part of each whole tensor (tensor_shard.h).
  struct Pending {
    torch::Tensor parameter;
    HuggingFaceCheckpoint::Located source;
    torch::Dtype dtype;
    TensorShard shard;
    const TensorGroup* tensor;
  };
  std::vector<Pending> pending;
  for (ModelStage* stage : stages) {
    const TensorGroup& tensor = stage->tensor_group();
    for (const auto& item : stage->named_parameters(/*recurse=*/true)) {
      VP_ASSIGN_OR_RETURN(const std::string hf, HuggingFaceName(spec, item.key()));
      VP_ASSIGN_OR_RETURN(const HuggingFaceCheckpoint::Located source, ckpt.Find(hf));
      const TensorShard shard = ShardOfParameter(item.key());
      // The shape of this rank's part of the stored tensor.
      const torch::Tensor part =
          ShardOf(torch::empty(source.tensor->shape, torch::TensorOptions().device(torch::kMeta)),
                  shard, tensor.size(), tensor.index());
      const std::vector<int64_t> got(part.sizes().begin(), part.sizes().end());
      const std::vector<int64_t> want(item.value().sizes().begin(), item.value().sizes().end());
      if (got != want) {
        return absl::InvalidArgumentError(absl::StrCat(
            source.file->path(), ": tensor '", hf, "' has shape ", ShapeText(source.tensor->shape),
            " but stage ", stage->role().stage, "'s ", item.key(), " needs ", ShapeText(want),
            tensor.size() > 1
                ? absl::StrCat(" (tensor rank ", tensor.index(), " of ", tensor.size(), "'s part)")
                : ""));
      }
      VP_ASSIGN_OR_RETURN(const torch::Dtype dtype,
                          TorchDtypeOf(*source.tensor, source.file->path()));
      pending.push_back({item.value(), source, dtype, shard, &tensor});
    }
  }
  torch::NoGradGuard no_grad;
  for (const Pending& p : pending) {
    torch::Tensor host =
        torch::empty(p.source.tensor->shape, torch::TensorOptions().dtype(p.dtype));
    VP_RETURN_IF_ERROR(p.source.file->Read(*p.source.tensor, host.data_ptr()));
    p.parameter.copy_(ShardOf(host, p.shard, p.tensor->size(), p.tensor->index()));
  }
  return absl::OkStatus();
}

}  // namespace varipipe::executor
