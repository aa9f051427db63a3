// Placeholder until the pricing lands: every call fails clearly.
#include "planner/cost/context_split_cost.h"

#include "absl/status/status.h"

namespace varipipe::planner {

absl::StatusOr<ContextSplitCostModel> ContextSplitCostModel::Create(
    const MicroBatchCostModel& /*whole*/, const CostModel& /*model*/, const ModelDims& /*dims*/,
    uint32_t /*context*/) {
  return absl::UnimplementedError("context-parallel costs are not implemented yet");
}

bool ContextSplitCostModel::EvaluateStages(const std::vector<uint32_t>& /*lengths*/,
                                           double /*labelled_tokens*/, uint32_t /*chunks*/,
                                           uint32_t /*hidden*/, uint32_t /*dtype_bytes*/,
                                           std::vector<StageOpCost>* /*out*/) const {
  return false;
}

}  // namespace varipipe::planner
