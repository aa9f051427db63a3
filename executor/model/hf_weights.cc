#include "executor/model/hf_weights.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status.h"

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

absl::Status NeedsLlama(const ModelSpec& spec) {
  if (spec.llama && !spec.encoder_decoder) return absl::OkStatus();
  return absl::InvalidArgumentError(
      "Hugging Face checkpoints load into model.architecture LLAMA (kind GPT) only; MEGATRON "
      "GPT and T5 have no Hugging Face layout");
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

// The config check's comparisons: each names the config.json field, its
// value and the job's.
class ConfigCheck {
 public:
  explicit ConfigCheck(const HuggingFaceCheckpoint& ckpt) : ckpt_(ckpt) {}

  absl::Status Number(const std::string& field, double fallback, double job,
                      const std::string& job_field, bool present_required = false) {
    const HuggingFaceConfigValue v = ckpt_.Config(field);
    double value = fallback;
    if (v.kind == HuggingFaceConfigValue::kNumber) {
      value = v.number;
    } else if (v.kind != HuggingFaceConfigValue::kMissing || present_required) {
      return absl::InvalidArgumentError(absl::StrCat(Where(), field,
                                                     v.kind == HuggingFaceConfigValue::kMissing
                                                         ? " is missing"
                                                         : " is not a number: " + v.text));
    }
    if (std::abs(value - job) > 1e-9 * std::max(1.0, std::abs(job))) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(), field, " is ", value, " but the job's ", job_field, " is ", job));
    }
    return absl::OkStatus();
  }

  std::string Where() const { return absl::StrCat(ckpt_.dir(), "/config.json: "); }

 private:
  const HuggingFaceCheckpoint& ckpt_;
};

}  // namespace

absl::StatusOr<std::string> HuggingFaceName(const ModelSpec& spec, std::string_view name_view) {
  VP_RETURN_IF_ERROR(NeedsLlama(spec));
  const std::string name(name_view);
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
  VP_RETURN_IF_ERROR(NeedsLlama(spec));
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

absl::Status CheckHuggingFaceConfig(const HuggingFaceCheckpoint& ckpt, const ModelSpec& spec) {
  VP_RETURN_IF_ERROR(NeedsLlama(spec));
  ConfigCheck check(ckpt);
  const HuggingFaceConfigValue type = ckpt.Config("model_type");
  if (type.kind != HuggingFaceConfigValue::kString || type.text != "llama") {
    return absl::InvalidArgumentError(absl::StrCat(
        check.Where(), "model_type is ",
        type.kind == HuggingFaceConfigValue::kMissing ? "missing" : "'" + type.text + "'",
        " but the job's model.architecture LLAMA loads model_type 'llama'"));
  }
  const auto h = static_cast<double>(spec.hidden_size);
  VP_RETURN_IF_ERROR(check.Number("hidden_size", 0, h, "model.hidden_size", true));
  VP_RETURN_IF_ERROR(check.Number("num_hidden_layers", 0, static_cast<double>(spec.num_layers),
                                  "model.num_layers", true));
  const auto heads = static_cast<double>(spec.num_attention_heads);
  VP_RETURN_IF_ERROR(
      check.Number("num_attention_heads", 0, heads, "model.num_attention_heads", true));
  VP_RETURN_IF_ERROR(check.Number("num_key_value_heads", heads,
                                  static_cast<double>(spec.num_key_value_heads),
                                  "model.num_key_value_heads"));
  VP_RETURN_IF_ERROR(check.Number("intermediate_size", 0, static_cast<double>(spec.ffn_hidden_size),
                                  "model.ffn_hidden_size", true));
  VP_RETURN_IF_ERROR(check.Number("vocab_size", 0, static_cast<double>(spec.vocab_size),
                                  "model.vocab_size", true));
  VP_RETURN_IF_ERROR(check.Number("head_dim", h / heads, static_cast<double>(spec.kv_channels),
                                  "model.kv_channels"));
  VP_RETURN_IF_ERROR(check.Number("rms_norm_eps", 1e-6, spec.norm_epsilon, "model.norm_epsilon"));
  // transformers 5 keeps rope_theta and the scaling in rope_parameters;
  // earlier versions at the top level and in rope_scaling.
  const bool v5 = ckpt.Config("rope_parameters").kind == HuggingFaceConfigValue::kOther;
  const std::string rope = v5 ? "rope_parameters." : "";
  VP_RETURN_IF_ERROR(check.Number(rope + "rope_theta", 10000, spec.rope_theta, "model.rope_theta"));
  const std::string scaling = v5 ? "rope_parameters." : "rope_scaling.";
  HuggingFaceConfigValue rope_type = ckpt.Config(scaling + "rope_type");
  if (rope_type.kind == HuggingFaceConfigValue::kMissing) rope_type = ckpt.Config(scaling + "type");
  const bool llama3 =
      rope_type.kind == HuggingFaceConfigValue::kString && rope_type.text == "llama3";
  const bool plain =
      rope_type.kind == HuggingFaceConfigValue::kMissing ||
      (rope_type.kind == HuggingFaceConfigValue::kString && rope_type.text == "default");
  if (!llama3 && !plain) {
    return absl::InvalidArgumentError(absl::StrCat(check.Where(), scaling, "rope_type '",
                                                   rope_type.text,
                                                   "' is not supported (default or llama3 only)"));
  }
  if (llama3 != (spec.rope_factor > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        check.Where(), scaling, "rope_type is ", llama3 ? "'llama3'" : "default",
        " but the job's model.rope_scaling is ", spec.rope_factor > 0 ? "set" : "unset"));
  }
  if (llama3) {
    VP_RETURN_IF_ERROR(
        check.Number(scaling + "factor", 0, spec.rope_factor, "model.rope_scaling.factor", true));
    VP_RETURN_IF_ERROR(check.Number(scaling + "low_freq_factor", 1, spec.rope_low_freq_factor,
                                    "model.rope_scaling.low_freq_factor"));
    VP_RETURN_IF_ERROR(check.Number(scaling + "high_freq_factor", 4, spec.rope_high_freq_factor,
                                    "model.rope_scaling.high_freq_factor"));
    VP_RETURN_IF_ERROR(check.Number(scaling + "original_max_position_embeddings", 8192,
                                    spec.rope_original_max_positions,
                                    "model.rope_scaling.original_max_position_embeddings"));
  }
  const HuggingFaceConfigValue tie = ckpt.Config("tie_word_embeddings");
  const bool tied = tie.kind == HuggingFaceConfigValue::kBool && tie.flag;
  if (tied != spec.tie_word_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(check.Where(), "tie_word_embeddings is ",
                                                   tied ? "true" : "false",
                                                   " but the job's model.tie_word_embeddings is ",
                                                   spec.tie_word_embeddings ? "true" : "false"));
  }
  for (const char* bias : {"attention_bias", "mlp_bias"}) {
    const HuggingFaceConfigValue v = ckpt.Config(bias);
    if (v.kind == HuggingFaceConfigValue::kBool && v.flag) {
      return absl::InvalidArgumentError(
          absl::StrCat(check.Where(), bias, " is true; LLAMA layers have no biases"));
    }
  }
  const HuggingFaceConfigValue act = ckpt.Config("hidden_act");
  if (act.kind == HuggingFaceConfigValue::kString && act.text != "silu") {
    return absl::InvalidArgumentError(absl::StrCat(check.Where(), "hidden_act is '", act.text,
                                                   "'; LLAMA layers use silu (SwiGLU)"));
  }
  return absl::OkStatus();
}

absl::Status LoadHuggingFaceWeights(HuggingFaceCheckpoint& ckpt, const ModelSpec& spec,
                                    const std::vector<ModelStage*>& stages,
                                    bool reject_unexpected) {
  VP_RETURN_IF_ERROR(NeedsLlama(spec));
  if (reject_unexpected) {
    VP_ASSIGN_OR_RETURN(const std::vector<std::string> expected, HuggingFaceNames(spec));
    const std::set<std::string> known(expected.begin(), expected.end());
    for (const std::string& name : ckpt.TensorNames()) {
      if (known.count(name) > 0 || absl::EndsWith(name, ".rotary_emb.inv_freq") ||
          (spec.tie_word_embeddings && name == "lm_head.weight")) {
        continue;
      }
      return absl::InvalidArgumentError(absl::StrCat(ckpt.dir(), ": unexpected tensor '", name,
                                                     "': the job's model has no place for it"));
    }
  }
  // Check every tensor of every stage before copying any.
  struct Pending {
    torch::Tensor parameter;
    HuggingFaceCheckpoint::Located source;
    torch::Dtype dtype;
  };
  std::vector<Pending> pending;
  for (ModelStage* stage : stages) {
    for (const auto& item : stage->named_parameters(/*recurse=*/true)) {
      VP_ASSIGN_OR_RETURN(const std::string hf, HuggingFaceName(spec, item.key()));
      VP_ASSIGN_OR_RETURN(const HuggingFaceCheckpoint::Located source, ckpt.Find(hf));
      const std::vector<int64_t> want(item.value().sizes().begin(), item.value().sizes().end());
      if (source.tensor->shape != want) {
        return absl::InvalidArgumentError(absl::StrCat(
            source.file->path(), ": tensor '", hf, "' has shape ", ShapeText(source.tensor->shape),
            " but stage ", stage->role().stage, "'s ", item.key(), " needs ", ShapeText(want)));
      }
      VP_ASSIGN_OR_RETURN(const torch::Dtype dtype,
                          TorchDtypeOf(*source.tensor, source.file->path()));
      pending.push_back({item.value(), source, dtype});
    }
  }
  torch::NoGradGuard no_grad;
  for (const Pending& p : pending) {
    torch::Tensor host =
        torch::empty(p.source.tensor->shape, torch::TensorOptions().dtype(p.dtype));
    VP_RETURN_IF_ERROR(p.source.file->Read(*p.source.tensor, host.data_ptr()));
    p.parameter.copy_(host);
  }
  return absl::OkStatus();
}

}  // namespace varipipe::executor
