#include "planner/cost/cost_model.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace varipipe::planner {

const char* ComponentName(Component component) {
  switch (component) {
    case Component::kEncoderLayer:
      return "encoder layer";
    case Component::kDecoderLayer:
      return "decoder layer";
    case Component::kEmbedding:
      return "embedding";
    case Component::kPostprocess:
      return "postprocess";
    case Component::kAttentionCore:
      return "attention core";
  }
  return "unknown";
}

double CostModel::Parameters(Component component, uint32_t tensor_parallel) const {
  const int c = static_cast<int>(component);
  if (const auto it = parameters_.find({c, tensor_parallel}); it != parameters_.end()) {
    return it->second;
  }
  const auto whole = parameters_.find({c, 1u});
  if (whole == parameters_.end()) return 0;
  return whole->second / std::max<uint32_t>(1, tensor_parallel);
}

absl::Status CostModel::SetGrid(Component component, Recompute recompute, uint32_t tensor_parallel,
                                ProfileGrid grid) {
  const bool needs_3d = component == Component::kDecoderLayer;
  if (grid.three_d() != needs_3d) {
    return absl::InvalidArgumentError(absl::StrCat(
        ComponentName(component), " grid (recompute ", RecomputeName(recompute), ", tp ",
        tensor_parallel, ") must be ", needs_3d ? "3-D [b][encoder_s][s]" : "2-D [b][s]"));
  }
  if (tensor_parallel == 0) {
    return absl::InvalidArgumentError("tensor_parallel must be at least 1");
  }
  grids_.insert_or_assign(Key{component, recompute, tensor_parallel}, std::move(grid));
  return absl::OkStatus();
}

const ProfileGrid* CostModel::Grid(Component component, Recompute recompute,
                                   uint32_t tensor_parallel) const {
  const auto it = grids_.find(Key{component, recompute, tensor_parallel});
  return it == grids_.end() ? nullptr : &it->second;
}

absl::Status CostModel::CheckMatches(const ModelDims& dims) const {
  if (!profiled_dims_.has_value()) return absl::OkStatus();
  const ModelDims& p = *profiled_dims_;
  const auto differ = [](const char* what, uint64_t profiled, uint64_t job) {
    return absl::InvalidArgumentError(absl::StrCat("the cost model was measured with ", what, " ",
                                                   profiled, " but the job's model has ", job));
  };
  if (p.encoder_decoder() != dims.encoder_decoder()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the cost model was measured for a ", p.encoder_decoder() ? "T5" : "GPT",
                     " model but the job's model is ", dims.encoder_decoder() ? "T5" : "GPT"));
  }
  if (p.architecture != dims.architecture) {
    // Different layers: other parameters, FLOPs and activations per layer
    // even at equal widths (docs/models.md).
    return absl::InvalidArgumentError(absl::StrCat(
        "the cost model was measured for a ", ArchitectureName(p.architecture),
        " model but the job's model.architecture is ", ArchitectureName(dims.architecture)));
  }
  if (p.hidden != dims.hidden) return differ("hidden size", p.hidden, dims.hidden);
  if (p.heads != dims.heads) return differ("attention heads", p.heads, dims.heads);
  if (p.kv_channels != dims.kv_channels)
    return differ("kv channels", p.kv_channels, dims.kv_channels);
  if (p.ffn != dims.ffn) return differ("ffn hidden size", p.ffn, dims.ffn);
  if (p.key_value_heads() != dims.key_value_heads()) {
    return differ("key/value heads", p.key_value_heads(), dims.key_value_heads());
  }
  if (p.tied_embeddings != dims.tied_embeddings) {
    // The LM head's parameters (model-state memory) differ.
    return absl::InvalidArgumentError(absl::StrCat(
        "the cost model was measured with ", p.tied_embeddings ? "a tied" : "an untied",
        " LM head but the job's model.tie_word_embeddings is ",
        dims.tied_embeddings ? "true" : "false"));
  }
  if (attention_kernel_known_ && p.attention_kernel != dims.attention_kernel) {
    // The kernel decides whether activation memory grows with s or s^2.
    return absl::InvalidArgumentError(absl::StrCat(
        "the cost model was measured with the ", AttentionKernelName(p.attention_kernel),
        " attention kernel but the job's model.attention_kernel is ",
        AttentionKernelName(dims.attention_kernel)));
  }
  return absl::OkStatus();
}

namespace {

std::vector<Component> RequiredComponents(ModelKind kind) {
  // The embedding is optional: profiles often do not time it (its cost is
  // then taken as zero).
  if (kind == ModelKind::kT5) {
    return {Component::kEncoderLayer, Component::kDecoderLayer, Component::kPostprocess};
  }
  return {Component::kEncoderLayer, Component::kPostprocess};
}

}  // namespace

std::vector<Recompute> CostModel::CompleteRecomputeModes(ModelKind kind,
                                                         uint32_t tensor_parallel) const {
  std::vector<Recompute> modes;
  for (Recompute mode : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    bool complete = true;
    for (Component c : RequiredComponents(kind)) {
      complete = complete && Grid(c, mode, tensor_parallel) != nullptr;
    }
    if (complete) modes.push_back(mode);
  }
  return modes;
}

absl::Status CostModel::CheckUsable(ModelKind kind, uint32_t tensor_parallel) const {
  if (!CompleteRecomputeModes(kind, tensor_parallel).empty()) return absl::OkStatus();
  std::vector<std::string> missing;
  for (Recompute mode : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    for (Component c : RequiredComponents(kind)) {
      if (Grid(c, mode, tensor_parallel) == nullptr) {
        missing.push_back(absl::StrCat(ComponentName(c), "/", RecomputeName(mode)));
      }
    }
  }
  return absl::NotFoundError(absl::StrCat("the cost model has no complete set of grids for a ",
                                          kind == ModelKind::kT5 ? "T5" : "GPT",
                                          " model at tensor-parallel degree ", tensor_parallel,
                                          " (missing: ", absl::StrJoin(missing, ", "), ")"));
}

CostModel CostModel::ScaledTimes(const std::array<double, kNumComponents>& forward_scale,
                                 const std::array<double, kNumComponents>& backward_scale) const {
  CostModel out = *this;
  for (auto& [key, grid] : out.grids_) {
    std::vector<CostValues> values = grid.values();
    const int c = static_cast<int>(key.component);
    for (CostValues& v : values) {
      v.forward_ms *= forward_scale[c];
      v.backward_ms *= backward_scale[c];
    }
    // Positive finite scales keep every invariant Create checks.
    grid = *ProfileGrid::Create(grid.micro_batch_sizes(), grid.seq_lens(), grid.encoder_seq_lens(),
                                std::move(values), "calibrated grid");
  }
  return out;
}

}  // namespace varipipe::planner
