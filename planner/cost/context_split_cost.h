// The cost, on each lane of a context group of c devices, of a micro-batch
// split across the group (common/plan_contract/context_parallel_split.h:
// every sample cut into 2c chunks, lane i holding chunks i and 2c - 1 - i,
// its local tokens padded to the group's largest local count A). Per lane
// and stage:
//   - the layers, embedding and head on A tokens as one packed row whose
//     attention does the lane's causal score pairs (ContextParallelSplit::
//     causal_pairs), not the whole samples';
//   - per layer, the forward's all-gather of the group's keys and values
//     (c * A tokens of the K and V widths in the compute dtype) and the
//     backward's reduce-scatter of their gradients, on the group's link;
//   - stored bytes of A tokens plus the gathered keys and values each layer
//     keeps for its backward; activations sent to the next stage are A
//     tokens wide.
// The micro-batch's time on the group is the slowest lane's (every lane
// runs every split pass together).
//
// Thread safety: immutable; const methods may run concurrently.
#ifndef VARIPIPE_PLANNER_COST_CONTEXT_SPLIT_COST_H_
#define VARIPIPE_PLANNER_COST_CONTEXT_SPLIT_COST_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/cost/cost_model.h"
#include "planner/cost/micro_batch_cost.h"
#include "planner/cost/model_dims.h"
#include "planner/cost/stage_cost.h"

namespace varipipe::planner {

class ContextSplitCostModel {
 public:
  // `whole` prices micro-batches on one device (the same stage layout,
  // recompute mode and tensor degree); `context` >= 2 lanes. The group's
  // link comes from `model`'s measured communication costs when it has
  // them, else from the analytic hardware of `dims`' device. REQUIRES:
  // `whole` and `model` outlive the result. InvalidArgument for a context
  // degree < 2 or a model without self-attention keys to gather (T5).
  static absl::StatusOr<ContextSplitCostModel> Create(const MicroBatchCostModel& whole,
                                                      const CostModel& model,
                                                      const ModelDims& dims, uint32_t context);

  // Per-stage costs on the slowest lane of samples of sequence `lengths`
  // (each >= 1; a GPT or Llama sample's input + target tokens) split across
  // the group, the head priced at `labelled_tokens` over the group
  // (MicroBatchCostModel::kEveryPosition: every token), `chunks` model
  // chunks per device, activations of `hidden` elements of `dtype_bytes`
  // (MicroBatchCostModel::EvaluateStages's arguments). False when outside
  // the cost model.
  bool EvaluateStages(const std::vector<uint32_t>& lengths, double labelled_tokens,
                      uint32_t chunks, uint32_t hidden, uint32_t dtype_bytes,
                      std::vector<StageOpCost>* out) const;

  uint32_t context() const { return context_; }

 private:
  ContextSplitCostModel() = default;

  const MicroBatchCostModel* whole_ = nullptr;
  ModelDims dims_;
  uint32_t context_ = 2;
  Link group_link_;
};

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_COST_CONTEXT_SPLIT_COST_H_
