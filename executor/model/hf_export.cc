#include "executor/model/hf_export.h"

#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/checkpoint/hf_export_config.h"
#include "common/checkpoint/safetensors_writer.h"
#include "common/status.h"
#include "executor/model/hf_weights.h"
#include "nlohmann/json.hpp"

namespace varipipe::executor {
namespace {

struct ExportDtype {
  torch::Dtype torch;
  const char* safetensors;
  const char* config;  // config.json's torch_dtype
  int bytes;
};

absl::StatusOr<ExportDtype> DtypeFor(v1::DType dtype) {
  switch (dtype) {
    case v1::FLOAT32:
      return ExportDtype{torch::kFloat32, "F32", "float32", 4};
    case v1::BFLOAT16:
      return ExportDtype{torch::kBFloat16, "BF16", "bfloat16", 2};
    case v1::FLOAT16:
      return ExportDtype{torch::kFloat16, "F16", "float16", 2};
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("cannot export weights as ", v1::DType_Name(dtype)));
  }
}

// Every exported tensor's shape, from the spec (docs/models.md's table).
absl::StatusOr<std::vector<int64_t>> ShapeOf(const ModelSpec& spec, const std::string& name) {
  const int64_t h = spec.hidden_size;
  const int64_t q = spec.num_attention_heads * spec.kv_channels;
  const int64_t kv = spec.num_key_value_heads * spec.kv_channels;
  const int64_t f = spec.ffn_hidden_size;
  if (spec.t5v11) {
    if (name == "shared.weight" || name == "lm_head.weight") {
      return std::vector<int64_t>{spec.vocab_size, h};
    }
    if (absl::EndsWith(name, "relative_attention_bias.weight")) {
      return std::vector<int64_t>{spec.relative_buckets, spec.num_attention_heads};
    }
    if (absl::EndsWith(name, "layer_norm.weight")) return std::vector<int64_t>{h};
    if (absl::EndsWith(name, ".q.weight") || absl::EndsWith(name, ".k.weight") ||
        absl::EndsWith(name, ".v.weight")) {
      return std::vector<int64_t>{q, h};
    }
    if (absl::EndsWith(name, ".o.weight")) return std::vector<int64_t>{h, q};
    if (absl::EndsWith(name, ".wi_0.weight") || absl::EndsWith(name, ".wi_1.weight")) {
      return std::vector<int64_t>{f, h};
    }
    if (absl::EndsWith(name, ".wo.weight")) return std::vector<int64_t>{h, f};
    return absl::InvalidArgumentError(absl::StrCat("no shape for '", name, "'"));
  }
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight") {
    return std::vector<int64_t>{spec.vocab_size, h};
  }
  if (absl::EndsWith(name, "norm.weight") || absl::EndsWith(name, "layernorm.weight")) {
    return std::vector<int64_t>{h};
  }
  if (absl::EndsWith(name, "q_proj.weight")) return std::vector<int64_t>{q, h};
  if (absl::EndsWith(name, "k_proj.weight") || absl::EndsWith(name, "v_proj.weight")) {
    return std::vector<int64_t>{kv, h};
  }
  if (absl::EndsWith(name, "o_proj.weight")) return std::vector<int64_t>{h, q};
  if (absl::EndsWith(name, "gate_proj.weight") || absl::EndsWith(name, "up_proj.weight")) {
    return std::vector<int64_t>{f, h};
  }
  if (absl::EndsWith(name, "down_proj.weight")) return std::vector<int64_t>{h, f};
  return absl::InvalidArgumentError(absl::StrCat("no shape for '", name, "'"));
}

// T5V11: one shard per layer of both stacks, encoder layers first; the
// shared embedding with encoder layer 0, the encoder's final norm with its
// last layer, the decoder's final norm and the head with the last decoder
// layer; each stack's bias table is in its block 0.
absl::StatusOr<int> T5ShardOf(const ModelSpec& spec, const std::string& hf_name) {
  const int encoder = static_cast<int>(spec.num_layers);
  const int decoder = static_cast<int>(spec.num_decoder_layers);
  if (hf_name == "shared.weight") return 0;
  if (hf_name == "encoder.final_layer_norm.weight") return encoder - 1;
  if (hf_name == "decoder.final_layer_norm.weight" || hf_name == "lm_head.weight") {
    return encoder + decoder - 1;
  }
  const std::vector<std::string> parts = absl::StrSplit(hf_name, '.');
  int layer = 0;
  if (parts.size() > 3 && parts[1] == "block" && absl::SimpleAtoi(parts[2], &layer) && layer >= 0) {
    if (parts[0] == "encoder" && layer < encoder) return layer;
    if (parts[0] == "decoder" && layer < decoder) return encoder + layer;
  }
  return absl::InvalidArgumentError(absl::StrCat("'", hf_name, "' belongs to no export shard"));
}

int ShardCount(const ModelSpec& spec) {
  return static_cast<int>(spec.num_layers + (spec.t5v11 ? spec.num_decoder_layers : 0));
}

// config.json of a T5 v1.1 / FLAN-T5 model (T5ForConditionalGeneration).
// Varipipe trains without dropout; the start, padding and end tokens are
// T5's (0, 0, 1).
nlohmann::json T5Config(const ModelSpec& spec, const ExportDtype& d) {
  return {
      {"architectures", {"T5ForConditionalGeneration"}},
      {"model_type", "t5"},
      {"d_model", spec.hidden_size},
      {"d_kv", spec.kv_channels},
      {"d_ff", spec.ffn_hidden_size},
      {"num_layers", spec.num_layers},
      {"num_decoder_layers", spec.num_decoder_layers},
      {"num_heads", spec.num_attention_heads},
      {"vocab_size", spec.vocab_size},
      {"relative_attention_num_buckets", spec.relative_buckets},
      {"relative_attention_max_distance", spec.relative_max_distance},
      {"layer_norm_epsilon", spec.norm_epsilon},
      {"feed_forward_proj", "gated-gelu"},
      {"dense_act_fn", "gelu_new"},
      {"is_gated_act", true},
      {"tie_word_embeddings", false},
      {"is_encoder_decoder", true},
      {"decoder_start_token_id", 0},
      {"pad_token_id", 0},
      {"eos_token_id", 1},
      {"dropout_rate", 0.0},
      {"initializer_factor", 1.0},
      {"torch_dtype", d.config},
  };
}

}  // namespace

absl::StatusOr<int> ExportShardOf(const ModelSpec& spec, const std::string& hf_name) {
  if (spec.t5v11) return T5ShardOf(spec, hf_name);
  if (hf_name == "model.embed_tokens.weight") return 0;
  if (hf_name == "model.norm.weight" || hf_name == "lm_head.weight") {
    return static_cast<int>(spec.num_layers) - 1;
  }
  const std::vector<std::string> parts = absl::StrSplit(hf_name, '.');
  int layer = 0;
  if (parts.size() > 3 && parts[0] == "model" && parts[1] == "layers" &&
      absl::SimpleAtoi(parts[2], &layer) && layer >= 0 && layer < spec.num_layers) {
    return layer;
  }
  return absl::InvalidArgumentError(absl::StrCat("'", hf_name, "' belongs to no export shard"));
}

std::string ExportShardName(int shard, int shards) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", shard + 1, shards);
}

absl::Status ExportHuggingFaceShards(const std::string& dir, const ModelSpec& spec,
                                     const std::vector<ModelStage*>& stages, v1::DType dtype) {
  VP_ASSIGN_OR_RETURN(const ExportDtype d, DtypeFor(dtype));
  VP_ASSIGN_OR_RETURN(const std::vector<std::string> all, HuggingFaceNames(spec));
  const int shards = ShardCount(spec);
  // Per shard: the names it needs and the tensors these stages hold.
  std::map<int, size_t> needed;
  for (const std::string& name : all) {
    VP_ASSIGN_OR_RETURN(const int shard, ExportShardOf(spec, name));
    ++needed[shard];
  }
  std::map<int, std::vector<std::pair<std::string, torch::Tensor>>> held;
  for (ModelStage* stage : stages) {
    for (const auto& item : stage->named_parameters(/*recurse=*/true)) {
      if (stage->IsReplica(item.key())) continue;  // the first stage exports it
      VP_ASSIGN_OR_RETURN(const std::string name, HuggingFaceName(spec, item.key()));
      VP_ASSIGN_OR_RETURN(const int shard, ExportShardOf(spec, name));
      held[shard].emplace_back(name,
                               item.value().detach().to(torch::kCPU).to(d.torch).contiguous());
    }
  }
  for (const auto& [shard, tensors] : held) {
    if (tensors.size() != needed[shard]) {
      return absl::FailedPreconditionError(
          absl::StrCat("export shard ", ExportShardName(shard, shards), " needs ", needed[shard],
                       " tensors but these stages hold ", tensors.size(), " of them"));
    }
    std::vector<TensorToWrite> out;
    for (const auto& [name, t] : tensors) {
      out.push_back({name, d.safetensors, std::vector<int64_t>(t.sizes().begin(), t.sizes().end()),
                     t.data_ptr(), static_cast<uint64_t>(t.numel()) * d.bytes});
    }
    const std::string path = (std::filesystem::path(dir) / ExportShardName(shard, shards)).string();
    VP_RETURN_IF_ERROR(WriteSafetensors(path, std::move(out), {{"format", "pt"}}));
  }
  return absl::OkStatus();
}

absl::Status ExportHuggingFaceIndex(const std::string& dir, const ModelSpec& spec, v1::DType dtype,
                                    const std::string& init_from) {
  VP_ASSIGN_OR_RETURN(const ExportDtype d, DtypeFor(dtype));
  VP_ASSIGN_OR_RETURN(const std::vector<std::string> all, HuggingFaceNames(spec));
  const int shards = ShardCount(spec);
  nlohmann::json map = nlohmann::json::object();
  uint64_t total = 0;
  for (const std::string& name : all) {
    VP_ASSIGN_OR_RETURN(const int shard, ExportShardOf(spec, name));
    VP_ASSIGN_OR_RETURN(const std::vector<int64_t> shape, ShapeOf(spec, name));
    uint64_t numel = 1;
    for (int64_t v : shape) numel *= static_cast<uint64_t>(v);
    total += numel * static_cast<uint64_t>(d.bytes);
    map[name] = ExportShardName(shard, shards);
  }
  const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
  const std::filesystem::path base(dir);
  if (!init_from.empty()) {
    VP_RETURN_IF_ERROR(CarryHuggingFaceModelFiles(init_from, dir, d.config));
    return WriteFileAtomically((base / "model.safetensors.index.json").string(),
                               index.dump(2) + "\n");
  }
  if (spec.t5v11) {
    VP_RETURN_IF_ERROR(
        WriteFileAtomically((base / "config.json").string(), T5Config(spec, d).dump(2) + "\n"));
    return WriteFileAtomically((base / "model.safetensors.index.json").string(),
                               index.dump(2) + "\n");
  }
  nlohmann::json config = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"hidden_size", spec.hidden_size},
      {"intermediate_size", spec.ffn_hidden_size},
      {"num_hidden_layers", spec.num_layers},
      {"num_attention_heads", spec.num_attention_heads},
      {"num_key_value_heads", spec.num_key_value_heads},
      {"head_dim", spec.kv_channels},
      {"vocab_size", spec.vocab_size},
      {"max_position_embeddings",
       spec.max_position_embeddings > 0 ? spec.max_position_embeddings : spec.max_sequence_length},
      {"rms_norm_eps", spec.norm_epsilon},
      {"rope_theta", spec.rope_theta},
      {"tie_word_embeddings", spec.tie_word_embeddings},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"initializer_range", 0.02},
      {"torch_dtype", d.config},
  };
  if (spec.rope_factor > 0) {
    config["rope_scaling"] = {{"rope_type", "llama3"},
                              {"factor", spec.rope_factor},
                              {"low_freq_factor", spec.rope_low_freq_factor},
                              {"high_freq_factor", spec.rope_high_freq_factor},
                              {"original_max_position_embeddings",
                               static_cast<int64_t>(spec.rope_original_max_positions)}};
  } else {
    config["rope_scaling"] = nullptr;
  }
  VP_RETURN_IF_ERROR(WriteFileAtomically((base / "config.json").string(), config.dump(2) + "\n"));
  return WriteFileAtomically((base / "model.safetensors.index.json").string(),
                             index.dump(2) + "\n");
}

}  // namespace varipipe::executor
