// The cost, on each lane of a context group of c devices, of a micro-batch
// split across the group (common/plan_contract/context_parallel_split.h:
// every sample cut into 2c chunks, lane i holding chunks i and 2c - 1 - i,
// its local tokens padded to the group's largest local count A). Per lane
// and stage (docs/cost-model.md, "Context parallelism"):
//   - the layers, embedding and head on A tokens as one packed row whose
//     attention does the lane's causal score pairs (ContextParallelSplit::
//     causal_pairs), not the whole samples': with an attention-core grid,
//     one pseudo-sample per query chunk [a, b) of side sqrt(2 * its pairs)
//     (the same score area) replaces the core over the A-token row
//     (MicroBatchCostModel's per-sample pricing); without one, the analytic
//     core of options.hardware makes the same replacement;
//   - per layer, the forward's ring all-gathers of the group's keys and of
//     its values (two collectives, as the executor runs them), each (c - 1)
//     steps passing one lane's A tokens x kv width / t x dtype bytes on (the
//     executor gathers 2-byte elements as they are); the backward's two
//     reduce-scatters of their gradients, the same steps of fp32 shards (the
//     executor sums gradients in fp32); under full recomputation the
//     backward gathers again (selective recomputation keeps the gathered
//     keys and values, so its recomputed core reads them);
//   - stored per layer: the A tokens' activations plus the key prefixes the
//     lane's attention reads (K and V of sum over its query chunks [a, b)
//     of b tokens, about c A (1 + 1 / 2c)), kept for the backward; none
//     under full recomputation. The backward's transient adds the prefixes'
//     and the gathered buffer's gradients (fp32, c A tokens) (and, under
//     full recomputation, the prefixes gathered again);
//   - activations sent to the next stage are A tokens wide.
// The micro-batch's time on the group is the slowest lane's (every lane
// runs every split pass together): the lane with the most causal pairs
// (all lanes compute on A tokens).
//
// One ring step of each collective: for a group inside one node, the cost
// model's measured step (CommunicationCosts::all_gather_step,
// reduce_scatter_step) when it has one, else its measured point-to-point
// link (the closest measured thing), else options.link (the job's
// intra-node link); for a group across nodes, options.link (the job's
// inter-node link).
//
// Thread safety: immutable; const methods may run concurrently.
#ifndef VARIPIPE_PLANNER_COST_CONTEXT_SPLIT_COST_H_
#define VARIPIPE_PLANNER_COST_CONTEXT_SPLIT_COST_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/cost/cost_model.h"
#include "planner/cost/hardware.h"
#include "planner/cost/link.h"
#include "planner/cost/micro_batch_cost.h"
#include "planner/cost/model_dims.h"
#include "planner/cost/stage_cost.h"

namespace varipipe::planner {

struct ContextSplitOptions {
  // One ring step when the cost model has no measured communication costs,
  // or when the group spans nodes: the group's link (ClusterConfig's
  // intra-node defaults: 10 us, 150 GB/s).
  Link link{.latency_ms = 0.01, .bytes_per_ms = 150e6};
  // The group's ranks sit on more than one node: `link` (the job's
  // inter-node link) prices a step even when the cost model measured
  // transfers, which a profile measures inside one node (as the simulator
  // uses measured point-to-point costs inside a node only).
  bool spans_nodes = false;
  // What-if, not a cost: each lane's times are exactly 1/c of the
  // micro-batch's on one device (its samples as packed rows, each priced on
  // its own) and nothing is transferred; memory is the lane's as above.
  // No split can cost less, so a plan priced this way bounds what any
  // split-or-whole choice gains over splitting everything.
  bool ideal = false;
  // Prices the lanes' attention when the cost model has no attention-core
  // grid; unset: the "a100-40gb" preset (ClusterConfig's default).
  std::optional<Hardware> hardware;
};

// What one lane holds of a split micro-batch.
struct ContextLane {
  uint32_t lane = 0;
  int64_t local_tokens = 0;          // its own tokens (<= padded_tokens)
  int64_t padded_tokens = 0;         // A: the group's most local tokens
  int64_t causal_pairs = 0;          // ContextParallelSplit::causal_pairs
  int64_t key_prefix_tokens = 0;     // sum over its query chunks [a, b) of b
  std::vector<int64_t> chunk_pairs;  // per non-empty query chunk, in local order
};

class ContextSplitCostModel {
 public:
  // `whole` prices micro-batches on one device (the same stage layout,
  // recompute mode and tensor degree); `context` >= 2 lanes. REQUIRES:
  // `whole` and `model` outlive the result. InvalidArgument for a context
  // degree < 2 or a model without self-attention keys to gather (T5).
  static absl::StatusOr<ContextSplitCostModel> Create(const MicroBatchCostModel& whole,
                                                      const CostModel& model, const ModelDims& dims,
                                                      uint32_t context,
                                                      const ContextSplitOptions& options);
  static absl::StatusOr<ContextSplitCostModel> Create(const MicroBatchCostModel& whole,
                                                      const CostModel& model, const ModelDims& dims,
                                                      uint32_t context) {
    return Create(whole, model, dims, context, ContextSplitOptions());
  }

  // The slowest lane (most causal pairs; the lowest index on a tie) of
  // samples of `lengths` (each >= 1) split over `context` lanes; the same
  // counts ContextParallelSplit::Of gives, without its per-token lists.
  // REQUIRES: context >= 1, every length >= 1.
  static ContextLane SlowestLane(const std::vector<uint32_t>& lengths, uint32_t context);

  // Per-stage costs on the slowest lane of samples of sequence `lengths`
  // (each >= 1; a GPT or Llama sample's input + target tokens) split across
  // the group, the head priced at `labelled_tokens` over the group
  // (MicroBatchCostModel::kEveryPosition: every token; kLeastHead: its
  // least) of which the lane takes its share of tokens (at most A), `chunks`
  // model chunks per device, activations of `hidden` elements of
  // `dtype_bytes` (MicroBatchCostModel::EvaluateStages's arguments). False
  // when outside the cost model (or `lengths` is empty or holds a 0).
  bool EvaluateStages(const std::vector<uint32_t>& lengths, double labelled_tokens, uint32_t chunks,
                      uint32_t hidden, uint32_t dtype_bytes, std::vector<StageOpCost>* out) const;

  // One layer's ring all-gathers of the keys and of the values of
  // `padded_tokens` (A) tokens per lane: 2 (c - 1) steps of A x
  // KeyValueBytesPerToken() / 2 bytes.
  double GatherMs(double padded_tokens) const;
  // One layer's ring reduce-scatters of their gradients: 2 (c - 1) steps of
  // A x KeyValueGradientBytesPerToken() / 2 bytes.
  double ReduceScatterMs(double padded_tokens) const;
  // Bytes of K and V per token on one tensor rank, as gathered (the
  // model's dtype) and as their gradients are reduced (fp32).
  double KeyValueBytesPerToken() const { return kv_bytes_per_token_; }
  double KeyValueGradientBytesPerToken() const { return kv_gradient_bytes_per_token_; }

  uint32_t context() const { return context_; }
  // One ring step of the all-gather and of the reduce-scatter.
  const Link& gather_step() const { return gather_step_; }
  const Link& reduce_scatter_step() const { return reduce_scatter_step_; }

 private:
  ContextSplitCostModel() = default;

  // ContextSplitOptions::ideal: replaces `out`'s times with 1/c of the
  // micro-batch's on one device. False when that is outside the cost model.
  bool IdealTimes(const std::vector<uint32_t>& lengths, double labelled_tokens, uint32_t chunks,
                  uint32_t hidden, uint32_t dtype_bytes, std::vector<StageOpCost>* out) const;

  const MicroBatchCostModel* whole_ = nullptr;
  ModelDims dims_;
  uint32_t context_ = 2;
  Link gather_step_;
  Link reduce_scatter_step_;
  Hardware hardware_;  // without an attention-core grid
  bool core_grid_ = false;
  bool ideal_ = false;
  double kv_bytes_per_token_ = 0;
  double kv_gradient_bytes_per_token_ = 0;
};

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_COST_CONTEXT_SPLIT_COST_H_
