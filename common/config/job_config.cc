#include "common/config/job_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/config/layer_layout.h"
#include "common/config/rank_layout.h"
#include "common/status.h"
#include "google/protobuf/util/json_util.h"

namespace varipipe {
namespace {

using v1::JobConfig;
namespace bounds = job_config_bounds;

// Collects "field: message" lines.
class ErrorList {
 public:
  template <typename... Args>
  void Add(absl::string_view field, const Args&... message) {
    errors_.push_back(absl::StrCat(field, ": ", message...));
  }
  // A message that already starts with its field ("field: ...").
  void AddWithField(std::string message) { errors_.push_back(std::move(message)); }
  std::vector<std::string> Take() { return std::move(errors_); }

 private:
  std::vector<std::string> errors_;
};

bool IsValidJobId(absl::string_view id) {
  if (id.empty() || id.size() > 64) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

// "host:port" with a non-empty host and a port in 1..65535.
bool IsValidHostPort(absl::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return false;
  const absl::string_view host = address.substr(0, colon);
  const absl::string_view port_text = address.substr(colon + 1);
  if (host.find_first_of(": \t") != absl::string_view::npos) return false;
  if (port_text.empty() || port_text.size() > 5 ||
      !std::all_of(port_text.begin(), port_text.end(),
                   [](char c) { return absl::ascii_isdigit(static_cast<unsigned char>(c)); })) {
    return false;
  }
  uint32_t port = 0;
  return absl::SimpleAtoi(port_text, &port) && port >= 1 && port <= 65535;
}

// Checks a repeated enum field: no UNSPECIFIED (0) entries and no duplicates.
template <typename RepeatedEnum, typename NameFn>
void CheckEnumList(const RepeatedEnum& values, absl::string_view field, NameFn name,
                   ErrorList& errors) {
  std::set<int> seen;
  for (int i = 0; i < values.size(); ++i) {
    const int value = values.Get(i);
    const std::string where = absl::StrCat(field, "[", i, "]");
    if (value == 0) {
      errors.Add(where, "must name a value (got ", name(value), ")");
    } else if (name(value).empty()) {
      errors.Add(where, "unknown value ", value);
    } else if (!seen.insert(value).second) {
      errors.Add(where, name(value), " is listed twice");
    }
  }
}

// A double as written in a config, all its digits up to 15 (StrCat's six
// would print 1e+06 and hide the digits of 1000001): "0.001", "1000000",
// "1e+300", "nan", "inf".
std::string Real(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.15g", value);
  return text;
}

// Checks value <= max.
void CheckAtMost(ErrorList& errors, absl::string_view field, uint64_t value, uint64_t max) {
  if (value > max) errors.Add(field, "is too large (", value, "; at most ", max, ")");
}

// Checks 1 <= value <= max (0 means "missing").
void CheckRange(ErrorList& errors, absl::string_view field, uint64_t value, uint64_t max) {
  if (value == 0) {
    errors.Add(field, "must be at least 1");
  } else {
    CheckAtMost(errors, field, value, max);
  }
}

// Checks that a double is finite (NaN and infinities parse from JSON as
// "NaN", "Infinity" and "-Infinity"); returns whether it is, so that the
// callers check its range only then.
bool CheckFinite(ErrorList& errors, absl::string_view field, double value) {
  if (std::isfinite(value)) return true;
  errors.Add(field, "must be a finite number (got ", Real(value), ")");
  return false;
}

// Checks a finite double against its upper bound.
void CheckRealAtMost(ErrorList& errors, absl::string_view field, double value, double max) {
  if (value > max) errors.Add(field, "is too large (", Real(value), "; at most ", Real(max), ")");
}

// Checks a double that must be zero or positive (what zero means follows
// in `zero_note`, e.g. " (off)") and at most `max`.
void CheckNonNegative(ErrorList& errors, absl::string_view field, double value, double max,
                      absl::string_view zero_note = "") {
  if (!CheckFinite(errors, field, value)) return;
  if (value < 0) {
    errors.Add(field, "must be zero", zero_note, " or positive (got ", Real(value), ")");
  } else {
    CheckRealAtMost(errors, field, value, max);
  }
}

// Checks a double that must be positive and at most `max`.
void CheckPositive(ErrorList& errors, absl::string_view field, double value, double max) {
  if (!CheckFinite(errors, field, value)) return;
  if (!(value > 0)) {
    errors.Add(field, "must be positive (got ", Real(value), ")");
  } else {
    CheckRealAtMost(errors, field, value, max);
  }
}

void ValidateModel(const JobConfig& config, ErrorList& errors) {
  const v1::ModelConfig& m = config.model();
  const bool t5 = m.kind() == v1::T5;
  if (m.kind() == v1::MODEL_KIND_UNSPECIFIED) {
    errors.Add("model.kind", "is required (GPT or T5)");
  } else if (!v1::ModelKind_IsValid(m.kind())) {
    errors.Add("model.kind", "unknown value ", static_cast<int>(m.kind()), " (GPT or T5)");
  }
  CheckRange(errors, "model.num_layers", m.num_layers(), bounds::kMaxLayers);
  if (t5) {
    CheckRange(errors, "model.num_decoder_layers", m.num_decoder_layers(), bounds::kMaxLayers);
  }
  if (!t5 && m.num_decoder_layers() != 0) {
    errors.Add("model.num_decoder_layers", "is only used by T5 models (model.kind is GPT)");
  }
  CheckRange(errors, "model.hidden_size", m.hidden_size(), bounds::kMaxHiddenSize);
  CheckRange(errors, "model.num_attention_heads", m.num_attention_heads(),
             bounds::kMaxAttentionHeads);
  CheckAtMost(errors, "model.kv_channels", m.kv_channels(), bounds::kMaxHiddenSize);
  const uint64_t attention_width = uint64_t{m.num_attention_heads()} * m.kv_channels();
  if (m.num_attention_heads() <= bounds::kMaxAttentionHeads &&
      m.kv_channels() <= bounds::kMaxHiddenSize && attention_width > bounds::kMaxAttentionWidth) {
    errors.Add("model.kv_channels", "num_attention_heads (", m.num_attention_heads(),
               ") x kv_channels (", m.kv_channels(), ") = ", attention_width,
               " is too large (at most ", bounds::kMaxAttentionWidth, ")");
  }
  if (m.hidden_size() <= bounds::kMaxHiddenSize) {
    CheckRange(errors, "model.ffn_hidden_size", m.ffn_hidden_size(), bounds::kMaxFfnHiddenSize);
  }
  if (m.num_attention_heads() != 0 && m.kv_channels() == 0 && m.hidden_size() != 0) {
    errors.Add("model.hidden_size", "must be divisible by model.num_attention_heads (",
               m.hidden_size(), " % ", m.num_attention_heads(), " = ",
               m.hidden_size() % m.num_attention_heads(), ") unless model.kv_channels is set");
  }
  CheckRange(errors, "model.vocab_size", m.vocab_size(), bounds::kMaxVocabSize);
  if (m.dtype() != v1::FLOAT32 && m.dtype() != v1::BFLOAT16 && m.dtype() != v1::FLOAT16) {
    errors.Add("model.dtype", "must be FLOAT32, BFLOAT16 or FLOAT16 (got ",
               v1::DType_IsValid(m.dtype()) ? v1::DType_Name(m.dtype())
                                            : absl::StrCat(static_cast<int>(m.dtype())),
               ")");
  }
  if (m.attention_kernel() != v1::EXPLICIT && m.attention_kernel() != v1::FUSED) {
    errors.Add("model.attention_kernel", "must be EXPLICIT or FUSED (got ",
               v1::AttentionKernel_IsValid(m.attention_kernel())
                   ? v1::AttentionKernel_Name(m.attention_kernel())
                   : absl::StrCat(static_cast<int>(m.attention_kernel())),
               ")");
  }
  if (m.packed_attention() != v1::PER_SAMPLE && m.packed_attention() != v1::BLOCK_DIAGONAL_MASK &&
      m.packed_attention() != v1::FASTEST_PER_MICRO_BATCH) {
    errors.Add("model.packed_attention",
               "must be FASTEST_PER_MICRO_BATCH, PER_SAMPLE or BLOCK_DIAGONAL_MASK (got ",
               v1::PackedAttention_IsValid(m.packed_attention())
                   ? v1::PackedAttention_Name(m.packed_attention())
                   : absl::StrCat(static_cast<int>(m.packed_attention())),
               ")");
  }
}

// T5V11's fields (docs/models.md): an encoder-decoder with multi-head
// attention, an untied head, buckets that leave an exact range in both
// directions (max_exact = buckets / 4 in the encoder, buckets / 2 in the
// decoder) and a maximum distance beyond it (the log-spaced buckets divide by
// log(max_distance / max_exact)).
void ValidateT5V11(const JobConfig& config, ErrorList& errors) {
  const v1::ModelConfig& m = config.model();
  if (m.kind() != v1::T5) {
    errors.Add("model.architecture",
               "T5V11 is an encoder-decoder architecture: model.kind must be T5");
  }
  if (m.num_key_value_heads() != 0 && m.num_key_value_heads() != m.num_attention_heads()) {
    errors.Add("model.num_key_value_heads",
               "grouped-query attention needs model.architecture LLAMA");
  }
  if (m.has_rope_theta()) errors.Add("model.rope_theta", "is only used by LLAMA models");
  if (m.has_rope_scaling()) errors.Add("model.rope_scaling", "is only used by LLAMA models");
  if (m.tie_word_embeddings()) {
    errors.Add("model.tie_word_embeddings",
               "T5V11 has an untied LM head (the original T5's tied, rescaled head is not built)");
  }
  const uint32_t buckets = m.relative_attention_num_buckets();
  if (buckets != 0 && (buckets < 4 || buckets > 1024 || buckets % 2 != 0)) {
    errors.Add("model.relative_attention_num_buckets", "must be even, from 4 to 1024 (got ",
               buckets, ")");
  }
  const uint32_t distance = m.relative_attention_max_distance();
  const uint32_t effective_buckets = buckets == 0 ? 32 : buckets;
  if (distance != 0 &&
      (distance <= effective_buckets / 2 || distance > bounds::kMaxSequenceLength)) {
    errors.Add("model.relative_attention_max_distance", "must exceed half the buckets (",
               effective_buckets / 2, ") and be at most ", bounds::kMaxSequenceLength, " (got ",
               distance, ")");
  }
  // A shared parameter (the embedding, a stack's bias table) has one replica
  // per stage that uses it; interleaved chunks would put several on one rank.
  if (config.parallelism().virtual_chunks() > 1) {
    errors.Add("parallelism.virtual_chunks",
               "T5V11 shares parameters across stages, which does not work with interleaved "
               "stages: must be 1 (got ",
               config.parallelism().virtual_chunks(), ")");
  }
}

// MEGATRON models: no field of another architecture.
void ValidateMegatron(const JobConfig& config, ErrorList& errors) {
  const v1::ModelConfig& m = config.model();
  if (m.num_key_value_heads() != 0 && m.num_key_value_heads() != m.num_attention_heads()) {
    errors.Add("model.num_key_value_heads",
               "grouped-query attention needs model.architecture LLAMA");
  }
  if (m.has_rope_theta()) errors.Add("model.rope_theta", "is only used by LLAMA models");
  if (m.has_rope_scaling()) errors.Add("model.rope_scaling", "is only used by LLAMA models");
  if (m.tie_word_embeddings()) {
    errors.Add("model.tie_word_embeddings", "is only used by LLAMA models");
  }
  if (!config.training().init_from().empty()) {
    errors.Add("training.init_from",
               "loads Hugging Face checkpoints into model.architecture LLAMA or T5V11 only "
               "(this model is MEGATRON)");
  }
}

// LLAMA models: grouped-query attention, rotary pairs and the tied head.
void ValidateLlama(const JobConfig& config, ErrorList& errors) {
  const v1::ModelConfig& m = config.model();
  if (m.kind() != v1::GPT) {
    errors.Add("model.architecture",
               "LLAMA is a decoder-only architecture: model.kind must be GPT");
  }
  const uint32_t heads = m.num_attention_heads();
  const uint32_t kv_heads = m.num_key_value_heads();
  if (heads != 0 && (kv_heads == 0 || kv_heads > heads || heads % kv_heads != 0)) {
    errors.Add("model.num_key_value_heads", "must divide model.num_attention_heads (", heads,
               "; got ", kv_heads, ")");
  }
  if (m.kv_channels() % 2 != 0) {
    errors.Add("model.kv_channels", "must be even for rotary embeddings (got ", m.kv_channels(),
               ")");
  }
  if (m.has_rope_theta()) CheckPositive(errors, "model.rope_theta", m.rope_theta(), 1e12);
  if (m.has_rope_scaling()) {
    const v1::RopeScaling& r = m.rope_scaling();
    if (CheckFinite(errors, "model.rope_scaling.factor", r.factor()) &&
        !(r.factor() > 1 && r.factor() <= 1024)) {
      errors.Add("model.rope_scaling.factor", "must be above 1 and at most 1024 (got ",
                 Real(r.factor()), ")");
    }
    CheckPositive(errors, "model.rope_scaling.low_freq_factor", r.low_freq_factor(), 1e6);
    CheckPositive(errors, "model.rope_scaling.high_freq_factor", r.high_freq_factor(), 1e6);
    if (std::isfinite(r.low_freq_factor()) && std::isfinite(r.high_freq_factor()) &&
        !(r.high_freq_factor() > r.low_freq_factor())) {
      errors.Add("model.rope_scaling.high_freq_factor", "must exceed low_freq_factor (",
                 Real(r.high_freq_factor()), " <= ", Real(r.low_freq_factor()), ")");
    }
    CheckRange(errors, "model.rope_scaling.original_max_position_embeddings",
               r.original_max_position_embeddings(), bounds::kMaxSequenceLength);
  }
  // Across pipeline stages the last stage holds a replica of the embedding
  // (gradients summed with the first stage's); interleaved chunks would put
  // several replicas on one rank, which is not built.
  if (m.tie_word_embeddings() && config.parallelism().virtual_chunks() > 1) {
    errors.Add("model.tie_word_embeddings",
               "does not work with interleaved stages: parallelism.virtual_chunks must be 1 (got ",
               config.parallelism().virtual_chunks(), ")");
  }
}

// Architecture-specific fields (docs/models.md): each belongs to LLAMA or
// T5V11, and grouped-query attention, rotary pairs and a tied head have
// constraints.
void ValidateArchitecture(const JobConfig& config, ErrorList& errors) {
  const v1::ModelConfig& m = config.model();
  if (m.architecture() != v1::ARCHITECTURE_UNSPECIFIED && m.architecture() != v1::MEGATRON &&
      m.architecture() != v1::LLAMA && m.architecture() != v1::T5V11) {
    errors.Add("model.architecture", "must be MEGATRON, LLAMA or T5V11 (got ",
               v1::Architecture_IsValid(m.architecture())
                   ? v1::Architecture_Name(m.architecture())
                   : absl::StrCat(static_cast<int>(m.architecture())),
               ")");
    return;
  }
  if (m.has_norm_epsilon()) {
    CheckPositive(errors, "model.norm_epsilon", m.norm_epsilon(), 1.0);
  }
  const bool llama = m.architecture() == v1::LLAMA;
  const bool t5v11 = m.architecture() == v1::T5V11;
  if (!llama && m.max_position_embeddings() != 0) {
    errors.Add("model.max_position_embeddings", "is only used by LLAMA models");
  }
  if (llama) {
    CheckAtMost(errors, "model.max_position_embeddings", m.max_position_embeddings(),
                bounds::kMaxSequenceLength);
  }
  if (!t5v11) {
    if (m.relative_attention_num_buckets() != 0) {
      errors.Add("model.relative_attention_num_buckets", "is only used by T5V11 models");
    }
    if (m.relative_attention_max_distance() != 0) {
      errors.Add("model.relative_attention_max_distance", "is only used by T5V11 models");
    }
  }
  if (t5v11) {
    ValidateT5V11(config, errors);
    return;
  }
  if (!llama) {
    ValidateMegatron(config, errors);
    return;
  }
  ValidateLlama(config, errors);
}

// parallelism.stage_layout (docs/configuration.md, "Stage layout"): layers
// only with EXPLICIT, and an explicit layout that covers the model.
void ValidateStageLayout(const JobConfig& config, ErrorList& errors) {
  const v1::ParallelismConfig& p = config.parallelism();
  const v1::StageLayoutConfig& layout = p.stage_layout();
  const v1::StageLayoutMode mode = EffectiveLayoutMode(layout);
  if (config.model().kind() == v1::T5 && p.virtual_chunks() > 1) return;  // refused above
  if (mode != v1::LISTED) {
    if (!layout.layers().empty() || layout.encoder_stages() != 0) {
      errors.Add("parallelism.stage_layout",
                 "layers and encoder_stages are only read with mode LISTED (mode is ",
                 v1::StageLayoutMode_Name(mode), ")");
    }
    return;
  }
  if (layout.layers().empty()) {
    errors.Add("parallelism.stage_layout.layers", "mode LISTED needs one entry per stage");
    return;
  }
  const uint64_t stages = uint64_t{p.pipeline()} * p.virtual_chunks();
  if (stages == 0 || p.pipeline() > bounds::kMaxPipeline || stages > bounds::kMaxLayers * 2) {
    return;  // reported with parallelism.pipeline
  }
  absl::StatusOr<LayerLayout> listed_layout =
      ListedLayerLayout(layout, LayerCountsOf(config.model()), static_cast<uint32_t>(stages),
                        "parallelism.stage_layout");
  if (!listed_layout.ok()) {
    errors.AddWithField(std::string(listed_layout.status().message()));
  }
}

// Tensor parallelism shards attention heads, key/value heads, the MLP width
// and the vocabulary (docs/configuration.md, "Tensor parallelism"): every
// rank needs whole heads and a part of each.
void CheckTensorParallelism(const JobConfig& config, ErrorList& errors) {
  const v1::ParallelismConfig& p = config.parallelism();
  const uint32_t t = p.tensor();
  // A tensor group runs a collective per layer: it belongs within a node.
  if (t > bounds::kMaxDevicesPerNode) {
    errors.Add("parallelism.tensor", "must be at most ", bounds::kMaxDevicesPerNode, " (got ", t,
               ")");
    return;
  }
  if (p.sequence_parallel() && t <= 1) {
    errors.Add("parallelism.sequence_parallel", "needs parallelism.tensor above 1 (got ", t, ")");
  }
  if (t <= 1) return;
  const v1::ModelConfig& m = config.model();
  const auto divides = [&](uint32_t value, const char* field) {
    if (value != 0 && value % t != 0) {
      errors.Add("parallelism.tensor", t, " must divide ", field, " (", value,
                 "): each tensor rank holds an equal part");
    }
  };
  divides(m.num_attention_heads(), "model.num_attention_heads");
  divides(m.num_key_value_heads(), "model.num_key_value_heads");
  divides(m.ffn_hidden_size(), "model.ffn_hidden_size");
  if (m.vocab_size() != 0 && m.vocab_size() < t) {
    errors.Add("parallelism.tensor", t, " exceeds model.vocab_size (", m.vocab_size(),
               "): each tensor rank holds part of the vocabulary");
  }
}

// Context parallelism (docs/configuration.md, "Context parallelism"): a
// context group splits a micro-batch's causal self-attention keys and
// values, which only the decoder-only models have; its lanes run one slot
// sequence, which the interleaved schedule does not build.
void CheckContextParallelism(const JobConfig& config, ErrorList& errors) {
  const v1::ParallelismConfig& p = config.parallelism();
  const uint32_t c = p.context();
  CheckAtMost(errors, "parallelism.context", c, bounds::kMaxContext);
  if (!v1::ContextSplitPolicy_IsValid(p.context_split()) ||
      p.context_split() == v1::CONTEXT_SPLIT_POLICY_UNSPECIFIED) {
    errors.Add("parallelism.context_split", "unknown value ", static_cast<int>(p.context_split()),
               " (PER_MICRO_BATCH, ALWAYS or NEVER)");
  }
  if (c <= 1) return;
  if (config.model().kind() == v1::T5) {
    errors.Add("parallelism.context", "context parallelism (", c,
               ") is for GPT and Llama models only (model.kind is T5): must be 1");
  }
  if (p.virtual_chunks() > 1) {
    errors.Add("parallelism.context", "context parallelism (", c,
               ") does not run with the interleaved schedule: parallelism.virtual_chunks must "
               "be 1 (got ",
               p.virtual_chunks(), ")");
  }
  if (p.sequence_parallel()) {
    errors.Add("parallelism.context", "context parallelism (", c,
               ") does not run with parallelism.sequence_parallel: turn one of them off");
  }
}

void ValidateParallelism(const JobConfig& config, ErrorList& errors) {
  const v1::ParallelismConfig& p = config.parallelism();
  CheckTensorParallelism(config, errors);
  CheckContextParallelism(config, errors);
  CheckAtMost(errors, "parallelism.pipeline", p.pipeline(), bounds::kMaxPipeline);
  CheckAtMost(errors, "parallelism.data", p.data(), bounds::kMaxData);
  if (p.pipeline() <= bounds::kMaxPipeline && p.data() <= bounds::kMaxData &&
      p.context() <= bounds::kMaxContext) {
    // At most 2^12 x 2^16 x 2^32, then (only when that is within 2^20)
    // x 2^10: no overflow.
    uint64_t ranks = uint64_t{p.pipeline()} * p.data() * p.tensor();
    if (ranks <= bounds::kMaxWorldSize) ranks *= std::max(1u, p.context());
    if (ranks > bounds::kMaxWorldSize) {
      errors.Add("parallelism.data", "pipeline (", p.pipeline(), ") x data (", p.data(),
                 ") x tensor (", p.tensor(), ")",
                 p.context() > 1 ? absl::StrCat(" x context (", p.context(), ")") : "", " = ",
                 ranks, " ranks is too many (at most ", bounds::kMaxWorldSize, ")");
    }
  }
  const v1::ModelConfig& m = config.model();
  const uint64_t layers =
      m.kind() == v1::T5 ? uint64_t{m.num_layers()} + m.num_decoder_layers() : m.num_layers();
  const uint64_t stages = uint64_t{p.pipeline()} * p.virtual_chunks();
  if (layers != 0 && stages > layers) {
    errors.Add("parallelism.pipeline", "pipeline (", p.pipeline(), ") x virtual_chunks (",
               p.virtual_chunks(), ") = ", stages, " stages exceeds the model's ", layers,
               " layers");
  }
  ValidateStageLayout(config, errors);
  // T5 has no interleaved schedule, and the executors would build
  // pipeline x virtual_chunks stages that its plans (over pipeline stages)
  // leave partly unrun. T5V11 names its own reason.
  if (p.virtual_chunks() > 1 && config.model().kind() == v1::T5 &&
      config.model().architecture() != v1::T5V11) {
    errors.Add("parallelism.virtual_chunks",
               "T5 runs without interleaving (the interleaved schedule is GPT only): must be 1 "
               "(got ",
               p.virtual_chunks(), ")");
  }
  if (p.virtual_chunks() > 1) {
    const auto& schedules = config.planner().schedules();
    if (std::find(schedules.begin(), schedules.end(), v1::INTERLEAVED_1F1B) == schedules.end()) {
      errors.Add("parallelism.virtual_chunks",
                 "is > 1, which only the INTERLEAVED_1F1B schedule uses; add it to "
                 "planner.schedules or set virtual_chunks to 1");
    }
  }
}

void ValidateCluster(const JobConfig& config, ErrorList& errors) {
  const v1::ClusterConfig& c = config.cluster();
  CheckAtMost(errors, "cluster.devices_per_node", c.devices_per_node(), bounds::kMaxDevicesPerNode);
  if (c.device_memory_limit_mib() == 0) {
    errors.Add("cluster.device_memory_limit_mib", "is required (memory per device in MiB)");
  } else {
    CheckAtMost(errors, "cluster.device_memory_limit_mib", c.device_memory_limit_mib(),
                bounds::kMaxDeviceMemoryMib);
  }
  const auto check_bandwidth = [&](absl::string_view field, double value) {
    CheckPositive(errors, field, value, bounds::kMaxBandwidthGbps);
    if (value > 0 && value < bounds::kMinBandwidthGbps) {
      errors.Add(field, "is too small (", Real(value), "; at least ",
                 Real(bounds::kMinBandwidthGbps), ")");
    }
  };
  check_bandwidth("cluster.intra_node_bandwidth_gbps", c.intra_node_bandwidth_gbps());
  CheckNonNegative(errors, "cluster.intra_node_latency_us", c.intra_node_latency_us(),
                   bounds::kMaxLatencyUs);
  check_bandwidth("cluster.inter_node_bandwidth_gbps", c.inter_node_bandwidth_gbps());
  CheckNonNegative(errors, "cluster.inter_node_latency_us", c.inter_node_latency_us(),
                   bounds::kMaxLatencyUs);
  const auto& presets = HardwarePresetNames();
  if (std::find(presets.begin(), presets.end(), c.hardware()) == presets.end()) {
    errors.Add("cluster.hardware", "unknown preset '", c.hardware(),
               "' (known: ", absl::StrJoin(presets, ", "), ")");
  }
}

void ValidateData(const JobConfig& config, ErrorList& errors) {
  const v1::DataConfig& d = config.data();
  const bool t5 = config.model().kind() == v1::T5;
  switch (d.format()) {
    case v1::DATASET_FORMAT_UNSPECIFIED:
      errors.Add("data.format", "is required (SYNTHETIC, JSONL or MEGATRON_INDEXED)");
      break;
    case v1::SYNTHETIC:
      if (!d.path().empty()) errors.Add("data.path", "must be empty for SYNTHETIC data");
      break;
    case v1::JSONL:
      if (d.path().empty()) errors.Add("data.path", "is required for JSONL data");
      break;
    case v1::MEGATRON_INDEXED:
      if (d.path().empty()) {
        errors.Add("data.path", "is required for MEGATRON_INDEXED data (prefix of .idx/.bin)");
      }
      if (t5 && d.target_path().empty()) {
        errors.Add("data.target_path",
                   "is required for MEGATRON_INDEXED data with a T5 model (prefix of the "
                   "targets' .idx/.bin)");
      }
      break;
    default:
      errors.Add("data.format", "unknown value ", static_cast<int>(d.format()),
                 " (SYNTHETIC, JSONL or MEGATRON_INDEXED)");
  }
  if (!d.target_path().empty() && d.format() != v1::MEGATRON_INDEXED) {
    errors.Add("data.target_path", "is only used by MEGATRON_INDEXED data");
  }
  if (d.format() != v1::SYNTHETIC && d.synthetic_num_samples() != 0) {
    errors.Add("data.synthetic_num_samples", "is only used by SYNTHETIC data");
  } else {
    CheckAtMost(errors, "data.synthetic_num_samples", d.synthetic_num_samples(),
                bounds::kMaxSyntheticSamples);
  }
  if (!v1::SyntheticMixtureKind_IsValid(d.synthetic_mixture())) {
    errors.Add("data.synthetic_mixture", "unknown value ", static_cast<int>(d.synthetic_mixture()),
               " (FLAN_LIKE, DOCUMENTS or LONG_TAIL)");
  }
  if (d.max_sequence_length() == 0) {
    errors.Add("data.max_sequence_length", "is required");
  } else {
    CheckAtMost(errors, "data.max_sequence_length", d.max_sequence_length(),
                bounds::kMaxSequenceLength);
  }
  if (t5) {
    CheckAtMost(errors, "data.max_target_length", d.max_target_length(),
                bounds::kMaxSequenceLength);
  }
  if (!t5 && d.max_target_length() != 0) {
    errors.Add("data.max_target_length", "is only used by T5 models (model.kind is GPT)");
  }
  const uint64_t longest_sample =
      uint64_t{d.max_sequence_length()} + (t5 ? d.max_target_length() : 0);
  if (d.tokens_per_global_batch() == 0) {
    errors.Add("data.tokens_per_global_batch", "is required");
  } else if (d.tokens_per_global_batch() < longest_sample) {
    errors.Add("data.tokens_per_global_batch", "(", d.tokens_per_global_batch(),
               ") must hold at least one sample of the maximum length (", longest_sample,
               " tokens)");
  } else {
    CheckAtMost(errors, "data.tokens_per_global_batch", d.tokens_per_global_batch(),
                bounds::kMaxTokensPerBatch);
  }
}

void ValidatePlanner(const JobConfig& config, ErrorList& errors) {
  const v1::PlannerConfig& p = config.planner();
  CheckEnumList(
      p.partition_methods(), "planner.partition_methods",
      [](int v) { return v1::PartitionMethod_Name(v); }, errors);
  CheckEnumList(
      p.schedules(), "planner.schedules", [](int v) { return v1::ScheduleKind_Name(v); }, errors);
  CheckEnumList(
      p.recompute_modes(), "planner.recompute_modes",
      [](int v) { return v1::RecomputeMode_Name(v); }, errors);
  CheckNonNegative(errors, "planner.tmax_interval_ms", p.tmax_interval_ms(),
                   bounds::kMaxTmaxIntervalMs, " (no bucketing)");
  CheckAtMost(errors, "planner.length_multiple", p.length_multiple(), bounds::kMaxLengthMultiple);
  CheckAtMost(errors, "planner.plan_ahead", p.plan_ahead(), bounds::kMaxPlanAhead);
  CheckAtMost(errors, "planner.threads", p.threads(), bounds::kMaxPlannerThreads);
  CheckAtMost(errors, "planner.kfkb_k", p.kfkb_k(), bounds::kMaxKfkbK);
  CheckAtMost(errors, "planner.fixed_micro_batch_size", p.fixed_micro_batch_size(),
              bounds::kMaxFixedMicroBatchSize);
  CheckAtMost(errors, "planner.micro_batch_token_budget", p.micro_batch_token_budget(),
              bounds::kMaxTokensPerBatch);
  if (!v1::SampleOrder_IsValid(p.sample_order())) {
    errors.Add("planner.sample_order", "unknown value ", static_cast<int>(p.sample_order()),
               " (LENGTH_SORT or TWO_D_TOUR)");
  }
  if (p.sample_order() == v1::TWO_D_TOUR && config.model().kind() != v1::T5) {
    errors.Add("planner.sample_order",
               "TWO_D_TOUR orders (input, target) pairs of T5 models; "
               "GPT samples have one length (use LENGTH_SORT)");
  }
}

void ValidateStore(const JobConfig& config, ErrorList& errors) {
  const v1::StoreConfig& s = config.store();
  if (!s.redis_address().empty() && !IsValidHostPort(s.redis_address())) {
    errors.Add("store.redis_address", "must be host:port with a port in 1..65535 (got '",
               s.redis_address(), "'), or empty for an embedded redis-server");
  }
  if (s.key_prefix().find_first_of(" \t\r\n{}") != std::string::npos) {
    errors.Add("store.key_prefix", "must not contain whitespace or braces (got '", s.key_prefix(),
               "')");
  }
}

void ValidateTraining(const JobConfig& config, ErrorList& errors) {
  const v1::TrainingConfig& t = config.training();
  if (t.iterations() == 0) {
    errors.Add("training.iterations", "is required (at least 1)");
  } else {
    CheckAtMost(errors, "training.iterations", t.iterations(), bounds::kMaxIterations);
  }
  CheckPositive(errors, "training.learning_rate", t.learning_rate(), bounds::kMaxLearningRate);
  if (CheckFinite(errors, "training.min_learning_rate", t.min_learning_rate()) &&
      (!(t.min_learning_rate() >= 0) || t.min_learning_rate() > t.learning_rate())) {
    errors.Add("training.min_learning_rate", "must be in [0, training.learning_rate] (got ",
               Real(t.min_learning_rate()), ")");
  }
  CheckAtMost(errors, "training.warmup_iterations", t.warmup_iterations(), bounds::kMaxIterations);
  CheckNonNegative(errors, "training.weight_decay", t.weight_decay(), bounds::kMaxWeightDecay);
  const auto check_beta = [&](absl::string_view field, double beta) {
    if (CheckFinite(errors, field, beta) && !(beta >= 0 && beta < 1)) {
      errors.Add(field, "must be in [0, 1) (got ", Real(beta), ")");
    }
  };
  check_beta("training.adam_beta1", t.adam_beta1());
  check_beta("training.adam_beta2", t.adam_beta2());
  CheckPositive(errors, "training.adam_epsilon", t.adam_epsilon(), bounds::kMaxAdamEpsilon);
  CheckNonNegative(errors, "training.gradient_clip_norm", t.gradient_clip_norm(),
                   bounds::kMaxGradientClipNorm, " (off)");
  CheckAtMost(errors, "training.checkpoint_interval", t.checkpoint_interval(),
              bounds::kMaxIterations);
  CheckAtMost(errors, "training.watchdog_timeout_s", t.watchdog_timeout_s(),
              bounds::kMaxWatchdogTimeoutS);
  if (!v1::Optimizer_IsValid(t.optimizer())) {
    errors.Add("training.optimizer", "unknown value ", static_cast<int>(t.optimizer()),
               " (ADAMW or SGD)");
  }
  if (t.zero_stage() > 1) {
    errors.Add("training.zero_stage", "must be 0 or 1 (got ", t.zero_stage(),
               "; ZeRO stages 2 and 3 are not supported)");
  }
}

}  // namespace

const std::vector<std::string>& HardwarePresetNames() {
  static const auto* const kNames =
      new std::vector<std::string>{"a100-40gb", "a100-80gb", "h100-80gb", "h200"};
  return *kNames;
}

int WorldSize(const JobConfig& config) { return RankLayout::Of(config.parallelism()).world_size(); }

namespace {

// The 1-based line of the first occurrence of `"token"` in `json`, or 0.
int LineOfQuoted(absl::string_view json, absl::string_view token) {
  if (token.empty()) return 0;
  const std::string quoted = absl::StrCat("\"", token, "\"");
  const size_t at = json.find(quoted);
  // Ambiguous when the token appears more than once: no line then.
  if (at == absl::string_view::npos || json.find(quoted, at + 1) != absl::string_view::npos) {
    return 0;
  }
  return 1 + static_cast<int>(std::count(json.begin(), json.begin() + at, '\n'));
}

// Protobuf's JSON errors name the field path but not the line; find the line
// of the offending key or value ("(model) hidden_sise: Cannot find field." or
// "(model.kind): invalid value \"gpx\" for type ...").
std::string JsonErrorLocation(absl::string_view json, absl::string_view error) {
  int line = 0;
  if (const size_t close = error.find(") "); close != absl::string_view::npos) {
    const absl::string_view rest = error.substr(close + 2);
    line = LineOfQuoted(json, rest.substr(0, rest.find(':')));
  }
  if (line == 0) {
    if (const size_t value = error.find("invalid value \""); value != absl::string_view::npos) {
      const absl::string_view rest = error.substr(value + 15);
      line = LineOfQuoted(json, rest.substr(0, rest.find('"')));
    }
  }
  return line == 0 ? std::string() : absl::StrCat(":", line);
}

}  // namespace

absl::StatusOr<JobConfig> ParseJobConfigJson(absl::string_view json, absl::string_view source) {
  JobConfig config;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  options.case_insensitive_enum_parsing = true;
  const auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &config, options);
  if (!status.ok()) {
    const std::string error = status.message().as_string();
    return absl::InvalidArgumentError(
        absl::StrCat(source, JsonErrorLocation(json, error), ": not a valid job config: ", error));
  }
  return config;
}

namespace {

// model.*: the architecture's defaults.
void ApplyModelDefaults(JobConfig& config) {
  v1::ModelConfig& m = *config.mutable_model();
  if (m.kind() == v1::T5 && m.num_decoder_layers() == 0) m.set_num_decoder_layers(m.num_layers());
  if (m.kv_channels() == 0 && m.num_attention_heads() != 0 &&
      m.hidden_size() % m.num_attention_heads() == 0) {
    m.set_kv_channels(m.hidden_size() / m.num_attention_heads());
  }
  // model.architecture stays unset for MEGATRON (the default), so the
  // resolved configs of today's models are unchanged.
  const bool llama = m.architecture() == v1::LLAMA;
  if (m.ffn_hidden_size() == 0 && m.hidden_size() <= bounds::kMaxHiddenSize) {
    // LLAMA: two thirds of 4h (the gated MLP's three matrices cost what two
    // of 4h would), rounded up to a multiple of 256, as Meta's reference.
    m.set_ffn_hidden_size(llama ? (8 * m.hidden_size() / 3 + 255) / 256 * 256
                                : 4 * m.hidden_size());
  }
  if (llama) {
    if (!m.has_norm_epsilon()) m.set_norm_epsilon(1e-5);
    if (m.num_key_value_heads() == 0) m.set_num_key_value_heads(m.num_attention_heads());
    if (!m.has_rope_theta()) m.set_rope_theta(10000);
    if (m.has_rope_scaling()) {
      v1::RopeScaling& r = *m.mutable_rope_scaling();
      if (r.low_freq_factor() == 0) r.set_low_freq_factor(1);
      if (r.high_freq_factor() == 0) r.set_high_freq_factor(4);
      if (r.original_max_position_embeddings() == 0) r.set_original_max_position_embeddings(8192);
    }
  }
  if (m.architecture() == v1::T5V11) {
    if (!m.has_norm_epsilon()) m.set_norm_epsilon(1e-6);
    if (m.num_key_value_heads() == 0) m.set_num_key_value_heads(m.num_attention_heads());
    if (m.relative_attention_num_buckets() == 0) m.set_relative_attention_num_buckets(32);
    if (m.relative_attention_max_distance() == 0) m.set_relative_attention_max_distance(128);
  }
  if (m.dtype() == v1::DTYPE_UNSPECIFIED) m.set_dtype(v1::BFLOAT16);
  if (m.attention_kernel() == v1::ATTENTION_KERNEL_UNSPECIFIED) {
    m.set_attention_kernel(v1::EXPLICIT);
  }
  if (m.packed_attention() == v1::PACKED_ATTENTION_UNSPECIFIED) {
    m.set_packed_attention(v1::FASTEST_PER_MICRO_BATCH);
  }
}

// parallelism.*, cluster.* and data.*.
void ApplyLayoutAndDataDefaults(JobConfig& config) {
  const v1::ModelConfig& m = config.model();
  v1::ParallelismConfig& p = *config.mutable_parallelism();
  if (p.pipeline() == 0) p.set_pipeline(1);
  if (p.data() == 0) p.set_data(1);
  if (p.tensor() == 0) p.set_tensor(1);
  if (p.virtual_chunks() == 0) p.set_virtual_chunks(1);
  if (p.context() == 0) p.set_context(1);
  if (p.context_split() == v1::CONTEXT_SPLIT_POLICY_UNSPECIFIED) {
    p.set_context_split(v1::PER_MICRO_BATCH);
  }

  v1::ClusterConfig& c = *config.mutable_cluster();
  if (c.devices_per_node() == 0) c.set_devices_per_node(8);
  if (c.intra_node_bandwidth_gbps() == 0) c.set_intra_node_bandwidth_gbps(150);
  if (!c.has_intra_node_latency_us()) c.set_intra_node_latency_us(10);
  if (c.inter_node_bandwidth_gbps() == 0) c.set_inter_node_bandwidth_gbps(12.5);
  if (!c.has_inter_node_latency_us()) c.set_inter_node_latency_us(30);
  if (c.hardware().empty()) c.set_hardware("a100-40gb");
  c.set_hardware(absl::AsciiStrToLower(c.hardware()));

  v1::DataConfig& d = *config.mutable_data();
  if (m.kind() == v1::T5 && d.max_target_length() == 0) {
    d.set_max_target_length(d.max_sequence_length());
  }
  if (d.format() == v1::SYNTHETIC && d.synthetic_num_samples() == 0) {
    d.set_synthetic_num_samples(1000000);
  }
}

// planner.*. The default search is everything that can win (planner.h):
// every partition method and every schedule valid for the job.
void ApplyPlannerDefaults(JobConfig& config) {
  v1::PlannerConfig& pl = *config.mutable_planner();
  if (pl.partition_methods().empty()) {
    for (v1::PartitionMethod method :
         {v1::DYNAMIC_PROGRAMMING, v1::PACKING, v1::TOKEN_BASED, v1::FIXED_SIZE, v1::PADDING}) {
      pl.add_partition_methods(method);
    }
  }
  if (pl.schedules().empty()) {
    if (config.parallelism().virtual_chunks() > 1) {
      pl.add_schedules(v1::INTERLEAVED_1F1B);
    } else {
      for (v1::ScheduleKind schedule : {v1::ADAPTIVE, v1::ONE_F_ONE_B, v1::ADAPTIVE_ZERO_BUBBLE,
                                        v1::ZERO_BUBBLE_H1, v1::KFKB, v1::GPIPE}) {
        pl.add_schedules(schedule);
      }
    }
  }
  if (pl.recompute_modes().empty()) {
    pl.add_recompute_modes(v1::RECOMPUTE_NONE);
    pl.add_recompute_modes(v1::RECOMPUTE_SELECTIVE);
    pl.add_recompute_modes(v1::RECOMPUTE_FULL);
  }
  if (!pl.has_tmax_interval_ms()) pl.set_tmax_interval_ms(0.5);
  if (pl.length_multiple() == 0) pl.set_length_multiple(8);
  if (pl.plan_ahead() == 0) pl.set_plan_ahead(8);
  if (!pl.has_online_calibration()) pl.set_online_calibration(true);
  if (pl.kfkb_k() == 0) pl.set_kfkb_k(2);
  if (pl.sample_order() == v1::SAMPLE_ORDER_UNSPECIFIED) pl.set_sample_order(v1::LENGTH_SORT);
  if (!pl.has_dp_packed_rows()) pl.set_dp_packed_rows(true);
}

// store.* and training.*.
void ApplyStoreAndTrainingDefaults(JobConfig& config) {
  v1::StoreConfig& s = *config.mutable_store();
  if (s.password_env().empty()) s.set_password_env("VARIPIPE_REDIS_PASSWORD");
  if (s.key_prefix().empty()) s.set_key_prefix("varipipe");

  v1::TrainingConfig& t = *config.mutable_training();
  if (t.learning_rate() == 0) t.set_learning_rate(1e-4);
  if (!t.has_min_learning_rate()) t.set_min_learning_rate(t.learning_rate() / 10);
  if (!t.has_weight_decay()) t.set_weight_decay(t.optimizer() == v1::SGD ? 0.0 : 0.01);
  if (!t.has_adam_beta1()) t.set_adam_beta1(0.9);
  if (!t.has_adam_beta2()) t.set_adam_beta2(0.95);
  if (t.adam_epsilon() == 0) t.set_adam_epsilon(1e-8);
  if (!t.has_gradient_clip_norm()) t.set_gradient_clip_norm(1.0);
  if (t.checkpoint_interval() == 0) t.set_checkpoint_interval(100);
  if (t.watchdog_timeout_s() == 0) t.set_watchdog_timeout_s(300);
}

}  // namespace

void ApplyJobConfigDefaults(JobConfig& config) {
  ApplyModelDefaults(config);
  ApplyLayoutAndDataDefaults(config);
  ApplyPlannerDefaults(config);
  ApplyStoreAndTrainingDefaults(config);
}

std::vector<std::string> JobConfigErrors(const JobConfig& config) {
  ErrorList errors;
  if (!IsValidJobId(config.job_id())) {
    errors.Add("job_id", config.job_id().empty()
                             ? "is required"
                             : absl::StrCat("'", config.job_id(),
                                            "' must be 1-64 letters, digits, '-', '_' or '.'"));
  }
  ValidateModel(config, errors);
  ValidateArchitecture(config, errors);
  ValidateParallelism(config, errors);
  ValidateCluster(config, errors);
  ValidateData(config, errors);
  ValidatePlanner(config, errors);
  ValidateStore(config, errors);
  ValidateTraining(config, errors);
  return errors.Take();
}

absl::Status ValidateJobConfig(const JobConfig& config, absl::string_view source) {
  const std::vector<std::string> errors = JobConfigErrors(config);
  if (errors.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(source, ": invalid job config (", errors.size(),
                                                 errors.size() == 1 ? " error" : " errors",
                                                 "):\n  ", absl::StrJoin(errors, "\n  ")));
}

namespace {

// `path` under `base` (absolute), normalised; absolute and empty paths are
// returned as they are.
std::string ResolvePath(const std::filesystem::path& base, const std::string& path) {
  if (path.empty() || std::filesystem::path(path).is_absolute()) return path;
  return (base / path).lexically_normal().string();
}

}  // namespace

void ResolveJobConfigPaths(JobConfig& config, const std::filesystem::path& directory) {
  std::error_code error;
  // absolute("") is an error, not the working directory.
  std::filesystem::path base =
      std::filesystem::absolute(directory.empty() ? "." : directory, error);
  if (error) base = directory;  // no working directory: relative paths stay under `directory`
  v1::DataConfig& d = *config.mutable_data();
  d.set_path(ResolvePath(base, d.path()));
  d.set_target_path(ResolvePath(base, d.target_path()));
  config.mutable_store()->set_password_file(ResolvePath(base, config.store().password_file()));
  config.mutable_planner()->set_cost_model_path(
      ResolvePath(base, config.planner().cost_model_path()));
  v1::TrainingConfig& t = *config.mutable_training();
  t.set_checkpoint_dir(ResolvePath(base, t.checkpoint_dir()));
  t.set_init_from(ResolvePath(base, t.init_from()));
}

absl::StatusOr<JobConfig> LoadJobConfigFile(const std::string& path) {
  VP_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  VP_ASSIGN_OR_RETURN(JobConfig config, ParseJobConfigJson(text, path));
  // The directory of the file as given ("" for "job.json"), made absolute
  // against this process's working directory now, once: the resolved
  // config (handed to executors over GetJob) holds absolute paths only.
  ResolveJobConfigPaths(config, std::filesystem::path(path).parent_path());
  ApplyJobConfigDefaults(config);
  VP_RETURN_IF_ERROR(ValidateJobConfig(config, path));
  return config;
}

std::string JobConfigToJson(const JobConfig& config) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  // Printing a valid message cannot fail.
  (void)google::protobuf::util::MessageToJsonString(config, &json, options);
  return json;
}

}  // namespace varipipe
