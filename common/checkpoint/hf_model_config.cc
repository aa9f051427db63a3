#include "common/checkpoint/hf_model_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace varipipe {
namespace {

class Reader {
 public:
  Reader(const nlohmann::json& json, std::string path) : json_(json), path_(std::move(path)) {}

  const nlohmann::json* Find(const std::string& key, const nlohmann::json* in = nullptr) const {
    const nlohmann::json& node = in != nullptr ? *in : json_;
    if (!node.is_object()) return nullptr;
    const auto it = node.find(key);
    return it == node.end() || it->is_null() ? nullptr : &*it;
  }

  // A positive whole number, required unless `fallback` > 0.
  absl::StatusOr<uint32_t> Count(const std::string& key, uint64_t fallback = 0) const {
    const nlohmann::json* v = Find(key);
    if (v == nullptr) {
      if (fallback > 0) return static_cast<uint32_t>(fallback);
      return absl::InvalidArgumentError(absl::StrCat(path_, ": ", key, " is missing"));
    }
    if (!v->is_number_unsigned() || v->get<uint64_t>() == 0 || v->get<uint64_t>() > 0xffffffffull) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": ", key, " is not a positive whole number: ", v->dump()));
    }
    return static_cast<uint32_t>(v->get<uint64_t>());
  }

  absl::StatusOr<double> Real(const std::string& key, double fallback,
                              const nlohmann::json* in = nullptr,
                              const std::string& prefix = "") const {
    const nlohmann::json* v = Find(key, in);
    if (v == nullptr) return fallback;
    if (!v->is_number() || !std::isfinite(v->get<double>())) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": ", prefix, key, " is not a number: ", v->dump()));
    }
    return v->get<double>();
  }

  const std::string& path() const { return path_; }

 private:
  const nlohmann::json& json_;
  std::string path_;
};

// The weights' dtype (config.json's dtype or torch_dtype) as the model's
// compute dtype.
void SetDtype(const Reader& r, v1::ModelConfig& m) {
  const nlohmann::json* dtype = r.Find("dtype");
  if (dtype == nullptr) dtype = r.Find("torch_dtype");
  if (dtype != nullptr && dtype->is_string()) {
    const std::string d = dtype->get<std::string>();
    m.set_dtype(d == "float32" ? v1::FLOAT32 : d == "float16" ? v1::FLOAT16 : v1::BFLOAT16);
  }
}

// T5 v1.1 / FLAN-T5 (T5Config, model_type "t5") as a T5V11 model. T5Config's
// defaults are the original T5's (a relu MLP, a tied and rescaled head),
// which T5V11 does not build, so those fields must say otherwise.
absl::StatusOr<v1::ModelConfig> T5ModelConfig(const Reader& r) {
  const std::string& path = r.path();
  v1::ModelConfig m;
  m.set_kind(v1::T5);
  m.set_architecture(v1::T5V11);
  absl::StatusOr<uint32_t> n = r.Count("num_layers");
  if (!n.ok()) return n.status();
  m.set_num_layers(*n);
  if (n = r.Count("num_decoder_layers", m.num_layers()); !n.ok()) return n.status();
  m.set_num_decoder_layers(*n);
  if (n = r.Count("d_model"); !n.ok()) return n.status();
  m.set_hidden_size(*n);
  if (n = r.Count("num_heads"); !n.ok()) return n.status();
  m.set_num_attention_heads(*n);
  if (n = r.Count("d_kv", m.hidden_size() / m.num_attention_heads()); !n.ok()) return n.status();
  m.set_kv_channels(*n);
  if (n = r.Count("d_ff"); !n.ok()) return n.status();
  m.set_ffn_hidden_size(*n);
  if (n = r.Count("vocab_size"); !n.ok()) return n.status();
  m.set_vocab_size(*n);
  if (n = r.Count("relative_attention_num_buckets", 32); !n.ok()) return n.status();
  m.set_relative_attention_num_buckets(*n);
  if (n = r.Count("relative_attention_max_distance", 128); !n.ok()) return n.status();
  m.set_relative_attention_max_distance(*n);
  absl::StatusOr<double> x = r.Real("layer_norm_epsilon", 1e-6);
  if (!x.ok()) return x.status();
  m.set_norm_epsilon(*x);
  const nlohmann::json* act = r.Find("feed_forward_proj");
  if (act == nullptr || !act->is_string() || act->get<std::string>() != "gated-gelu") {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": feed_forward_proj is ",
        act == nullptr ? "missing (T5Config's default: relu)" : act->dump(),
        "; T5V11 (T5 v1.1, FLAN-T5) has a gated-GELU MLP (\"gated-gelu\"), the original T5's relu "
        "MLP is not built"));
  }
  const nlohmann::json* tie = r.Find("tie_word_embeddings");
  if (tie == nullptr || !tie->is_boolean() || tie->get<bool>()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": tie_word_embeddings is ",
                     tie == nullptr ? "missing (T5Config's default: true)" : tie->dump(),
                     "; T5V11 (T5 v1.1, FLAN-T5) has an untied LM head, the original T5's tied, "
                     "rescaled head is "
                     "not built"));
  }
  SetDtype(r, m);
  return m;
}

// Llama's rotary embedding: its base, and the llama3 frequency scaling.
absl::Status SetLlamaRope(const Reader& r, v1::ModelConfig& m) {
  const std::string& path = r.path();
  absl::StatusOr<double> x;
  // transformers 5: rope_parameters; earlier: rope_theta and rope_scaling.
  const nlohmann::json* params = r.Find("rope_parameters");
  const nlohmann::json* scaling = params != nullptr ? params : r.Find("rope_scaling");
  const std::string prefix = params != nullptr ? "rope_parameters." : "rope_scaling.";
  if (x = params != nullptr ? r.Real("rope_theta", 10000, params, prefix)
                            : r.Real("rope_theta", 10000);
      !x.ok()) {
    return x.status();
  }
  m.set_rope_theta(*x);
  if (scaling != nullptr) {
    const nlohmann::json* kind = r.Find("rope_type", scaling);
    if (kind == nullptr) kind = r.Find("type", scaling);
    const std::string k =
        kind != nullptr && kind->is_string() ? kind->get<std::string>() : "default";
    if (k == "llama3") {
      v1::RopeScaling* s = m.mutable_rope_scaling();
      if (x = r.Real("factor", 0, scaling, prefix); !x.ok()) return x.status();
      s->set_factor(*x);
      if (x = r.Real("low_freq_factor", 1, scaling, prefix); !x.ok()) return x.status();
      s->set_low_freq_factor(*x);
      if (x = r.Real("high_freq_factor", 4, scaling, prefix); !x.ok()) return x.status();
      s->set_high_freq_factor(*x);
      if (x = r.Real("original_max_position_embeddings", 8192, scaling, prefix); !x.ok()) {
        return x.status();
      }
      s->set_original_max_position_embeddings(static_cast<uint32_t>(*x));
    } else if (k != "default") {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", prefix, "rope_type \"", k,
                                                     "\" is not supported (default or llama3)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::ModelConfig> LlamaModelConfig(const Reader& r) {
  const std::string& path = r.path();
  v1::ModelConfig m;
  m.set_kind(v1::GPT);
  m.set_architecture(v1::LLAMA);
  absl::StatusOr<uint32_t> n = r.Count("num_hidden_layers");
  if (!n.ok()) return n.status();
  m.set_num_layers(*n);
  if (n = r.Count("hidden_size"); !n.ok()) return n.status();
  m.set_hidden_size(*n);
  if (n = r.Count("num_attention_heads"); !n.ok()) return n.status();
  m.set_num_attention_heads(*n);
  if (n = r.Count("num_key_value_heads", m.num_attention_heads()); !n.ok()) return n.status();
  m.set_num_key_value_heads(*n);
  if (n = r.Count("head_dim", m.hidden_size() / m.num_attention_heads()); !n.ok()) {
    return n.status();
  }
  m.set_kv_channels(*n);
  if (n = r.Count("intermediate_size"); !n.ok()) return n.status();
  m.set_ffn_hidden_size(*n);
  if (n = r.Count("vocab_size"); !n.ok()) return n.status();
  m.set_vocab_size(*n);
  // The context the checkpoint declares; absent: LlamaConfig's default,
  // which an export then leaves absent too.
  if (r.Find("max_position_embeddings") != nullptr) {
    if (n = r.Count("max_position_embeddings"); !n.ok()) return n.status();
    m.set_max_position_embeddings(*n);
  }
  absl::StatusOr<double> x = r.Real("rms_norm_eps", 1e-6);
  if (!x.ok()) return x.status();
  m.set_norm_epsilon(*x);
  VP_RETURN_IF_ERROR(SetLlamaRope(r, m));
  if (const nlohmann::json* tie = r.Find("tie_word_embeddings"); tie != nullptr) {
    m.set_tie_word_embeddings(tie->is_boolean() && tie->get<bool>());
  }
  for (const char* bias : {"attention_bias", "mlp_bias"}) {
    const nlohmann::json* v = r.Find(bias);
    if (v != nullptr && v->is_boolean() && v->get<bool>()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", bias, " is true; LLAMA layers have no biases"));
    }
  }
  if (const nlohmann::json* act = r.Find("hidden_act");
      act != nullptr && (!act->is_string() || act->get<std::string>() != "silu")) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": hidden_act is ", act->dump(), "; LLAMA layers use silu (SwiGLU)"));
  }
  SetDtype(r, m);
  return m;
}

}  // namespace

absl::StatusOr<v1::ModelConfig> ModelConfigFromHuggingFace(const std::string& given) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string path =
      fs::is_directory(given, ec) ? (fs::path(given) / "config.json").string() : given;
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json json = nlohmann::json::parse(text.str(), nullptr, false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  const Reader r(json, path);
  const nlohmann::json* type = r.Find("model_type");
  if (type != nullptr && type->is_string() && type->get<std::string>() == "t5") {
    return T5ModelConfig(r);
  }
  if (type == nullptr || !type->is_string() || type->get<std::string>() != "llama") {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": model_type is ", type == nullptr ? "missing" : type->dump(),
        "; only Llama-family (model_type \"llama\") and T5 v1.1 / FLAN-T5 (\"t5\") checkpoints "
        "map to a Varipipe model"));
  }
  return LlamaModelConfig(r);
}

}  // namespace varipipe
