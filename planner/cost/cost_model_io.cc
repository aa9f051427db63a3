#include "planner/cost/cost_model_io.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/cost_model_format.h"
#include "common/status.h"
#include "google/protobuf/util/json_util.h"
#include "planner/cost/analytic_model.h"
#include "planner/cost/dynapipe_profile_reader.h"
#include "planner/cost/hardware.h"

namespace varipipe::planner {
namespace {

constexpr double kMiB = 1 << 20;

absl::StatusOr<Component> ComponentFromProto(v1::CostComponent c) {
  switch (c) {
    case v1::ENCODER_LAYER:
      return Component::kEncoderLayer;
    case v1::DECODER_LAYER:
      return Component::kDecoderLayer;
    case v1::EMBEDDING:
      return Component::kEmbedding;
    case v1::POSTPROCESS:
      return Component::kPostprocess;
    case v1::ATTENTION_CORE:
      return Component::kAttentionCore;
    default:
      return absl::InvalidArgumentError("component must be set");
  }
}

v1::CostComponent ComponentToProto(Component c) {
  switch (c) {
    case Component::kEncoderLayer:
      return v1::ENCODER_LAYER;
    case Component::kDecoderLayer:
      return v1::DECODER_LAYER;
    case Component::kEmbedding:
      return v1::EMBEDDING;
    case Component::kPostprocess:
      return v1::POSTPROCESS;
    case Component::kAttentionCore:
      return v1::ATTENTION_CORE;
  }
  return v1::COST_COMPONENT_UNSPECIFIED;
}

// The profiled model's dimensions, with the job config's defaults
// (common/config/job_config.cc): LLAMA's MLP is two thirds of 4h rounded up
// to a multiple of 256 (every other architecture's 4h); key/value heads
// default to the heads and T5V11's buckets to 32 (ModelDimsFromConfig).
void SetProfiledModel(const v1::ModelConfig& model_config, CostModel& model) {
  v1::ModelConfig profiled = model_config;
  if (profiled.kv_channels() == 0 && profiled.num_attention_heads() != 0) {
    profiled.set_kv_channels(profiled.hidden_size() / profiled.num_attention_heads());
  }
  const bool llama = profiled.architecture() == v1::LLAMA;
  if (profiled.ffn_hidden_size() == 0) {
    profiled.set_ffn_hidden_size(llama ? (8 * profiled.hidden_size() / 3 + 255) / 256 * 256
                                       : 4 * profiled.hidden_size());
  }
  // A file that does not name its attention kernel is not checked for it.
  model.set_profiled_dims(ModelDimsFromConfig(profiled),
                          profiled.attention_kernel() != v1::ATTENTION_KERNEL_UNSPECIFIED);
}

// Grid g of the file into the model; `repairs` says where values were
// raised to keep it non-decreasing (the DP needs that; the documented rule).
absl::Status AddGrid(const v1::CostGrid& grid, int g, const std::string& source, CostModel& model,
                     std::vector<std::string>& repairs) {
  const std::string where = absl::StrCat(source, ": grids[", g, "]");
  absl::StatusOr<Component> component = ComponentFromProto(grid.component());
  if (!component.ok()) return Annotate(component.status(), where);
  if (grid.recompute() == v1::RECOMPUTE_MODE_UNSPECIFIED) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": recompute must be set"));
  }
  const size_t points = static_cast<size_t>(grid.micro_batch_sizes_size()) * grid.seq_lens_size() *
                        std::max(1, grid.encoder_seq_lens_size());
  for (const auto& [name, size] :
       {std::pair<const char*, int>{"forward_ms", grid.forward_ms_size()},
        {"backward_ms", grid.backward_ms_size()},
        {"stored_activation_mib", grid.stored_activation_mib_size()},
        {"peak_activation_mib", grid.peak_activation_mib_size()}}) {
    if (static_cast<size_t>(size) != points) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".", name, ": ", size, " values for a grid of ", points, " points"));
    }
  }
  const std::vector<uint32_t> b(grid.micro_batch_sizes().begin(), grid.micro_batch_sizes().end());
  const std::vector<uint32_t> e(grid.encoder_seq_lens().begin(), grid.encoder_seq_lens().end());
  const std::vector<uint32_t> sl(grid.seq_lens().begin(), grid.seq_lens().end());
  std::vector<std::vector<double>> columns = {
      {grid.forward_ms().begin(), grid.forward_ms().end()},
      {grid.backward_ms().begin(), grid.backward_ms().end()},
      {grid.stored_activation_mib().begin(), grid.stored_activation_mib().end()},
      {grid.peak_activation_mib().begin(), grid.peak_activation_mib().end()}};
  const char* names[] = {"forward_ms", "backward_ms", "stored_activation_mib",
                         "peak_activation_mib"};
  const bool sorted = std::is_sorted(b.begin(), b.end()) && std::is_sorted(e.begin(), e.end()) &&
                      std::is_sorted(sl.begin(), sl.end());
  for (int c = 0; c < 4 && sorted; ++c) {
    // NaN and negative values are refused by ProfileGrid::Create below.
    if (std::any_of(columns[c].begin(), columns[c].end(), [](double v) { return !(v >= 0); })) {
      continue;
    }
    std::string first;
    if (const int raised = RaiseToRunningMaxima(b, e, sl, columns[c], &first); raised > 0) {
      repairs.push_back(absl::StrCat("grids[", g, "].", names[c], " (", ComponentName(*component),
                                     "): ", raised, " raised, first at ", first));
    }
  }
  std::vector<CostValues> values(points);
  for (size_t i = 0; i < points; ++i) {
    values[i] = {columns[0][i], columns[1][i], columns[2][i] * kMiB, columns[3][i] * kMiB};
  }
  absl::StatusOr<ProfileGrid> profile = ProfileGrid::Create(
      b, sl, e, std::move(values), absl::StrCat(where, " (", ComponentName(*component), ")"));
  if (!profile.ok()) return profile.status();
  if (absl::Status s =
          model.SetGrid(*component, RecomputeFromProto(grid.recompute()),
                        std::max<uint32_t>(1, grid.tensor_parallel()), *std::move(profile));
      !s.ok()) {
    return Annotate(s, where);
  }
  return absl::OkStatus();
}

absl::Status SetCommunication(const v1::CommunicationCosts& c, const std::string& source,
                              CostModel& model) {
  for (const auto& [name, value] :
       {std::pair<const char*, double>{"p2p_latency_us", c.p2p_latency_us()},
        {"p2p_bandwidth_gbps", c.p2p_bandwidth_gbps()},
        {"all_reduce_latency_us", c.all_reduce_latency_us()},
        {"all_reduce_bandwidth_gbps", c.all_reduce_bandwidth_gbps()},
        {"all_gather_step_latency_us", c.all_gather_step_latency_us()},
        {"all_gather_step_bandwidth_gbps", c.all_gather_step_bandwidth_gbps()},
        {"reduce_scatter_step_latency_us", c.reduce_scatter_step_latency_us()},
        {"reduce_scatter_step_bandwidth_gbps", c.reduce_scatter_step_bandwidth_gbps()}}) {
    if (!(value >= 0) || !std::isfinite(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": communication.", name, " must be finite and >= 0"));
    }
  }
  if (!(c.p2p_bandwidth_gbps() > 0) || !(c.all_reduce_bandwidth_gbps() > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": communication bandwidths must be positive"));
  }
  CommunicationCosts costs;
  costs.transport = c.transport();
  // us -> ms; GB/s (1e9 B/s) -> bytes per ms.
  costs.p2p = {c.p2p_latency_us() / 1e3, c.p2p_bandwidth_gbps() * 1e6};
  costs.all_reduce = {c.all_reduce_latency_us() / 1e3, c.all_reduce_bandwidth_gbps() * 1e6};
  costs.all_reduce_ranks = std::max<uint32_t>(2, c.all_reduce_ranks());
  // The ring collectives' steps, when measured (a bandwidth of 0: not).
  if (c.all_gather_step_bandwidth_gbps() > 0) {
    costs.all_gather_step =
        Link{c.all_gather_step_latency_us() / 1e3, c.all_gather_step_bandwidth_gbps() * 1e6};
  }
  if (c.reduce_scatter_step_bandwidth_gbps() > 0) {
    costs.reduce_scatter_step = Link{c.reduce_scatter_step_latency_us() / 1e3,
                                     c.reduce_scatter_step_bandwidth_gbps() * 1e6};
  }
  if (costs.all_gather_step.has_value() || costs.reduce_scatter_step.has_value()) {
    if (c.collective_ranks() < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(source,
                       ": communication.collective_ranks must be at least 2 when a collective's "
                       "step is measured (got ",
                       c.collective_ranks(), ")"));
    }
    costs.collective_ranks = c.collective_ranks();
  }
  model.set_communication(costs);
  return absl::OkStatus();
}

absl::Status SetOptimizerAndParameters(const v1::CostModelFile& file, const std::string& source,
                                       CostModel& model) {
  if (file.has_optimizer()) {
    const v1::OptimizerCosts& o = file.optimizer();
    if (!(o.fixed_ms() >= 0) || !std::isfinite(o.fixed_ms()) ||
        !(o.ms_per_million_parameters() >= 0) || !std::isfinite(o.ms_per_million_parameters())) {
      return absl::InvalidArgumentError(absl::StrCat(
          source,
          ": optimizer.fixed_ms and optimizer.ms_per_million_parameters must be finite "
          "and >= 0"));
    }
    model.set_optimizer({o.optimizer(), o.fixed_ms(), o.ms_per_million_parameters() / 1e6});
  }
  for (const v1::ComponentParameters& p : file.parameters()) {
    absl::StatusOr<Component> component = ComponentFromProto(p.component());
    if (!component.ok()) return Annotate(component.status(), absl::StrCat(source, ": parameters"));
    if (!(p.parameters() >= 0) || !std::isfinite(p.parameters())) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": parameters of ", ComponentName(*component), " must be finite and >= 0"));
    }
    model.SetParameters(*component, p.parameters());
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CostModel> CostModelFromProto(const v1::CostModelFile& file,
                                             const std::string& source) {
  if (file.format_version() == 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        source, ": cost model of format_version 1, expected ", kCostModelFormatVersion,
        ": it was profiled before packed rows' attention ran as one variable-length kernel and "
        "the loss head only on labelled tokens, and its attention-core and head grids measure "
        "kernels the executor no longer runs; re-profile with varipipe-profile"));
  }
  if (file.format_version() != kCostModelFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": format_version must be ",
                                                   kCostModelFormatVersion, " (got ",
                                                   file.format_version(), ")"));
  }
  CostModel model;
  model.set_description(file.description());
  if (file.has_model()) SetProfiledModel(file.model(), model);
  std::vector<std::string> repairs;  // non-monotone values raised
  for (int g = 0; g < file.grids_size(); ++g) {
    if (absl::Status s = AddGrid(file.grids(g), g, source, model, repairs); !s.ok()) return s;
  }
  if (!repairs.empty()) {
    model.set_description(absl::StrCat(
        model.description(),
        " [values raised to keep the grids monotone: ", absl::StrJoin(repairs, "; "), "]"));
  }
  if (file.has_communication()) {
    if (absl::Status s = SetCommunication(file.communication(), source, model); !s.ok()) return s;
  }
  if (absl::Status s = SetOptimizerAndParameters(file, source, model); !s.ok()) return s;
  return model;
}

v1::CostModelFile CostModelToProto(const CostModel& model) {
  v1::CostModelFile file;
  file.set_format_version(kCostModelFormatVersion);
  file.set_description(model.description());
  if (model.profiled_dims().has_value()) {
    const ModelDims& d = *model.profiled_dims();
    v1::ModelConfig* m = file.mutable_model();
    m->set_kind(d.encoder_decoder() ? v1::T5 : v1::GPT);
    m->set_num_layers(d.encoder_layers);
    m->set_num_decoder_layers(d.decoder_layers);
    m->set_hidden_size(d.hidden);
    m->set_num_attention_heads(d.heads);
    m->set_kv_channels(d.kv_channels);
    m->set_ffn_hidden_size(d.ffn);
    m->set_vocab_size(d.vocab);
    // MEGATRON stays unset (the default), so today's files are unchanged.
    if (d.llama()) {
      m->set_architecture(v1::LLAMA);
      m->set_num_key_value_heads(d.key_value_heads());
      m->set_tie_word_embeddings(d.tied_embeddings);
    }
    if (d.t5v11()) {
      m->set_architecture(v1::T5V11);
      m->set_relative_attention_num_buckets(d.relative_attention_buckets);
    }
    if (model.attention_kernel_known()) {
      m->set_attention_kernel(AttentionKernelToProto(d.attention_kernel));
    }
  }
  for (const auto& [key, grid] : model.grids()) {
    v1::CostGrid* g = file.add_grids();
    g->set_component(ComponentToProto(key.component));
    g->set_recompute(RecomputeToProto(key.recompute));
    g->set_tensor_parallel(key.tensor_parallel);
    for (uint32_t b : grid.micro_batch_sizes()) g->add_micro_batch_sizes(b);
    for (uint32_t s : grid.seq_lens()) g->add_seq_lens(s);
    for (uint32_t e : grid.encoder_seq_lens()) g->add_encoder_seq_lens(e);
    for (const CostValues& v : grid.values()) {
      g->add_forward_ms(v.forward_ms);
      g->add_backward_ms(v.backward_ms);
      g->add_stored_activation_mib(v.stored_bytes / kMiB);
      g->add_peak_activation_mib(v.peak_bytes / kMiB);
    }
  }
  for (Component c : {Component::kEncoderLayer, Component::kDecoderLayer, Component::kEmbedding,
                      Component::kPostprocess}) {
    if (model.Parameters(c) == 0) continue;
    v1::ComponentParameters* p = file.add_parameters();
    p->set_component(ComponentToProto(c));
    p->set_parameters(model.Parameters(c));
  }
  if (model.communication().has_value()) {
    const CommunicationCosts& c = *model.communication();
    v1::CommunicationCosts* out = file.mutable_communication();
    out->set_transport(c.transport);
    out->set_p2p_latency_us(c.p2p.latency_ms * 1e3);
    out->set_p2p_bandwidth_gbps(c.p2p.bytes_per_ms / 1e6);
    out->set_all_reduce_latency_us(c.all_reduce.latency_ms * 1e3);
    out->set_all_reduce_bandwidth_gbps(c.all_reduce.bytes_per_ms / 1e6);
    out->set_all_reduce_ranks(c.all_reduce_ranks);
    if (c.all_gather_step.has_value()) {
      out->set_all_gather_step_latency_us(c.all_gather_step->latency_ms * 1e3);
      out->set_all_gather_step_bandwidth_gbps(c.all_gather_step->bytes_per_ms / 1e6);
    }
    if (c.reduce_scatter_step.has_value()) {
      out->set_reduce_scatter_step_latency_us(c.reduce_scatter_step->latency_ms * 1e3);
      out->set_reduce_scatter_step_bandwidth_gbps(c.reduce_scatter_step->bytes_per_ms / 1e6);
    }
    if (c.collective_ranks > 0) out->set_collective_ranks(c.collective_ranks);
  }
  if (model.optimizer().has_value()) {
    v1::OptimizerCosts* out = file.mutable_optimizer();
    out->set_optimizer(model.optimizer()->optimizer);
    out->set_fixed_ms(model.optimizer()->fixed_ms);
    out->set_ms_per_million_parameters(model.optimizer()->ms_per_parameter * 1e6);
  }
  return file;
}

absl::StatusOr<CostModel> LoadCostModelJson(const std::string& path) {
  VP_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  v1::CostModelFile file;
  google::protobuf::util::JsonParseOptions options;
  options.case_insensitive_enum_parsing = true;
  const auto status = google::protobuf::util::JsonStringToMessage(text, &file, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a valid cost model: ", status.message().as_string()));
  }
  return CostModelFromProto(file, path);
}

absl::Status SaveCostModelJson(const CostModel& model, const std::string& path) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(CostModelToProto(model), &json, options).ok()) {
    return absl::InternalError(absl::StrCat(path, ": cannot render the cost model as JSON"));
  }
  const std::string temporary = absl::StrCat(path, ".tmp");
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) return ErrnoToStatus(errno, absl::StrCat("open ", temporary));
    out << json;
    out.close();
    if (!out) return ErrnoToStatus(errno, absl::StrCat("write ", temporary));
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error) {
    std::filesystem::remove(temporary, error);
    return absl::UnavailableError(
        absl::StrCat("rename ", temporary, " to ", path, ": ", error.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<CostModel> LoadCostModel(const std::string& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) return ReadDynaPipeProfileDirectory(path);
  return LoadCostModelJson(path);
}

absl::StatusOr<CostModel> CostModelForJob(const v1::JobConfig& config) {
  const ModelDims dims = ModelDimsFromJob(config);
  if (!config.planner().cost_model_path().empty()) {
    absl::StatusOr<CostModel> model = LoadCostModel(config.planner().cost_model_path());
    if (!model.ok()) return Annotate(model.status(), "planner.cost_model_path");
    const std::string where =
        absl::StrCat("planner.cost_model_path: ", config.planner().cost_model_path());
    if (absl::Status s = model->CheckUsable(dims.kind, config.parallelism().tensor()); !s.ok()) {
      return Annotate(s, where);
    }
    if (absl::Status s = model->CheckMatches(dims); !s.ok()) return Annotate(s, where);
    return model;
  }
  VP_ASSIGN_OR_RETURN(const Hardware hardware, HardwarePreset(config.cluster().hardware()));
  AnalyticGridOptions options;
  options.max_seq_len =
      std::max(config.data().max_sequence_length(), config.data().max_target_length());
  // The largest micro-batch: the whole mini-batch of the shortest samples.
  const uint64_t most =
      std::min<uint64_t>(config.data().tokens_per_global_batch() /
                             std::max<uint32_t>(1, config.planner().length_multiple()),
                         uint64_t{1} << 20);
  options.max_micro_batch_size = static_cast<uint32_t>(std::max<uint64_t>(1, most));
  options.tensor_parallel_degrees = {config.parallelism().tensor()};
  // A tensor group sits on one node (common/config/rank_layout.h).
  options.tensor_link = {.gbps = config.cluster().intra_node_bandwidth_gbps(),
                         .sequence_parallel = config.parallelism().sequence_parallel()};
  return BuildAnalyticCostModel(dims, hardware, options);
}

}  // namespace varipipe::planner
