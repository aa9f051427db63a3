// CostModel: every profile grid the planner needs for one model, keyed by
// component, recompute mode and tensor-parallel degree, plus the parameter
// count of each component (for model-state memory).
//
// Components (DynaPipe section 3): one transformer layer of each kind, the
// embedding and the LM head with its loss ("postprocess"). A GPT layer is
// stored as kEncoderLayer (decoder-only models have one layer kind). Grids:
//   kEncoderLayer   [b][s]                  s: the layer's sequence
//   kDecoderLayer   [b][encoder_s][s]       T5 only; s: decoder length
//   kEmbedding      [b][s]                  s: the embedded sequence
//   kPostprocess    [b][s]                  s: GPT sequence / T5 decoder length
//   kAttentionCore  [b][s]                  optional, RECOMPUTE_NONE only:
//                                           one self-attention core (part
//                                           of a layer's cost, not added);
//                                           prices packed rows per sample
//
// Sources: the project's JSON format and DynaPipe profile directories
// (cost_model_io.h), or the analytic model (analytic_model.h).
//
// Thread safety: immutable once built; const methods may run concurrently.
#ifndef VARIPIPE_PLANNER_COST_COST_MODEL_H_
#define VARIPIPE_PLANNER_COST_COST_MODEL_H_

#include <array>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "planner/cost/link.h"
#include "planner/cost/model_dims.h"
#include "planner/cost/profile_grid.h"

namespace varipipe::planner {

// What varipipe-profile measured besides the components: point-to-point
// messages, the data-parallel all-reduce and a context group's ring
// collectives over the executor's transport, and the optimizer step.
struct CommunicationCosts {
  std::string transport;  // "gloo ...", "nccl ..."
  Link p2p;
  Link all_reduce;  // fp32 gradients, over all_reduce_ranks ranks
  uint32_t all_reduce_ranks = 2;
  // One ring step (one rank's shard of n bytes passed on) of the all-gather
  // and of the reduce-scatter (sum), measured over collective_ranks ranks;
  // unset in profiles from before they were measured.
  std::optional<Link> all_gather_step;
  std::optional<Link> reduce_scatter_step;
  uint32_t collective_ranks = 0;
};
struct OptimizerCosts {
  std::string optimizer;
  double fixed_ms = 0;
  double ms_per_parameter = 0;
  double Ms(double parameters) const { return fixed_ms + ms_per_parameter * parameters; }
};

enum class Component {
  kEncoderLayer = 0,
  kDecoderLayer = 1,
  kEmbedding = 2,
  kPostprocess = 3,
  kAttentionCore = 4
};
inline constexpr int kNumComponents = 5;
const char* ComponentName(Component component);

class CostModel {
 public:
  CostModel() = default;

  // Adds (or replaces) a grid. Decoder-layer grids must be 3-D, the others
  // 2-D.
  absl::Status SetGrid(Component component, Recompute recompute, uint32_t tensor_parallel,
                       ProfileGrid grid);
  // nullptr when the model has no such grid.
  const ProfileGrid* Grid(Component component, Recompute recompute, uint32_t tensor_parallel) const;

  // Parameters of one instance of the component (one layer; the whole
  // embedding; the LM head) on one tensor rank at tensor-parallel degree
  // `tensor_parallel` (the busiest rank's part: a vocabulary the degree does
  // not divide leaves the first ranks one row more). A degree with no count
  // of its own is derived from the unsharded count divided by the degree
  // (which also divides the replicated norms, a small underestimate), 0
  // when there is none.
  void SetParameters(Component component, double parameters, uint32_t tensor_parallel = 1) {
    parameters_[{static_cast<int>(component), tensor_parallel}] = parameters;
  }
  double Parameters(Component component, uint32_t tensor_parallel = 1) const;

  // Recompute modes with every grid `kind` needs at `tensor_parallel`.
  std::vector<Recompute> CompleteRecomputeModes(ModelKind kind, uint32_t tensor_parallel) const;
  // OK when at least one recompute mode is complete for `kind`; otherwise
  // names what is missing.
  absl::Status CheckUsable(ModelKind kind, uint32_t tensor_parallel) const;

  struct Key {
    Component component;
    Recompute recompute;
    uint32_t tensor_parallel;
    friend bool operator<(const Key& a, const Key& b) {
      return std::tie(a.component, a.recompute, a.tensor_parallel) <
             std::tie(b.component, b.recompute, b.tensor_parallel);
    }
  };
  const std::map<Key, ProfileGrid>& grids() const { return grids_; }

  // Dimensions of the model the costs were measured for, when known (only
  // kind, architecture, hidden, heads, kv_channels, ffn, key/value heads,
  // tied embeddings and, when known, the attention kernel are compared with
  // a job).
  const std::optional<ModelDims>& profiled_dims() const { return profiled_dims_; }
  // `attention_kernel_known`: false when the source does not say which
  // attention kernel it measured (DynaPipe profiles); dims.attention_kernel
  // is then not compared.
  void set_profiled_dims(const ModelDims& dims, bool attention_kernel_known = true) {
    profiled_dims_ = dims;
    attention_kernel_known_ = attention_kernel_known;
  }
  bool attention_kernel_known() const { return profiled_dims_ && attention_kernel_known_; }
  // OK when no dimensions are recorded or they match `dims`; otherwise an
  // InvalidArgument naming the differing dimension.
  absl::Status CheckMatches(const ModelDims& dims) const;

  // Measured communication and optimizer costs, when the file has them.
  const std::optional<CommunicationCosts>& communication() const { return communication_; }
  void set_communication(const CommunicationCosts& c) { communication_ = c; }
  const std::optional<OptimizerCosts>& optimizer() const { return optimizer_; }
  void set_optimizer(const OptimizerCosts& o) { optimizer_ = o; }

  // A copy with every grid's forward times multiplied by
  // forward_scale[component] and backward times by backward_scale[component]
  // (memory unchanged): calibration (calibration.h).
  CostModel ScaledTimes(const std::array<double, kNumComponents>& forward_scale,
                        const std::array<double, kNumComponents>& backward_scale) const;

  // Free text recorded with the model (source, hardware, date).
  const std::string& description() const { return description_; }
  void set_description(std::string description) { description_ = std::move(description); }

 private:
  std::map<Key, ProfileGrid> grids_;
  std::map<std::pair<int, uint32_t>, double> parameters_;  // by (component, degree)
  std::string description_;
  std::optional<ModelDims> profiled_dims_;
  std::optional<CommunicationCosts> communication_;
  std::optional<OptimizerCosts> optimizer_;
  bool attention_kernel_known_ = false;
};

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_COST_COST_MODEL_H_
