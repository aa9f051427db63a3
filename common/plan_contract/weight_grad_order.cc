#include "common/plan_contract/weight_grad_order.h"

#include <cstdint>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"

namespace varipipe::plan_contract {

std::optional<ContractViolation> CheckWeightGradOrder(const v1::ExecutionPlan& plan) {
  // (stage, micro-batch) -> index of its deferred backward whose weight_grad
  // has not run yet; the keys whose weight_grad ran, with its index.
  std::map<std::pair<uint32_t, uint32_t>, int> outstanding;
  std::map<std::pair<uint32_t, uint32_t>, int> applied;
  for (int i = 0; i < plan.instructions_size(); ++i) {
    const v1::Instruction& in = plan.instructions(i);
    const std::pair<uint32_t, uint32_t> key{in.stage(), in.micro_batch()};
    switch (in.op_case()) {
      case v1::Instruction::kBackward:
        if (!in.backward().weight_grad_deferred()) break;
        if (outstanding.contains(key) || applied.contains(key)) {
          return ContractViolation{
              i, "", "a second backward with weight_grad_deferred of this micro-batch"};
        }
        outstanding[key] = i;
        break;
      case v1::Instruction::kWeightGrad: {
        if (const auto it = applied.find(key); it != applied.end()) {
          return ContractViolation{
              i, "",
              absl::StrCat("weight_grad runs twice (first at instruction #", it->second, ")")};
        }
        const auto it = outstanding.find(key);
        if (it == outstanding.end()) {
          return ContractViolation{i, "",
                                   "weight_grad without a backward with weight_grad_deferred of "
                                   "the same stage and micro-batch before it"};
        }
        outstanding.erase(it);
        applied[key] = i;
        break;
      }
      case v1::Instruction::kAllReduce:
      case v1::Instruction::kOptimizerStep:
        if (!outstanding.empty()) {
          const auto& [pending, backward] = *outstanding.begin();
          return ContractViolation{
              i, "",
              absl::StrCat("reads the gradients before the weight_grad of micro-batch ",
                           pending.second, " on stage ", pending.first,
                           " (its backward is instruction #", backward,
                           ", with weight_grad_deferred)")};
        }
        break;
      default:
        break;
    }
  }
  if (!outstanding.empty()) {
    return ContractViolation{
        outstanding.begin()->second, "",
        "defers its weight gradient (weight_grad_deferred) but no weight_grad follows"};
  }
  return std::nullopt;
}

}  // namespace varipipe::plan_contract
