#ifndef VARIPIPE_COMMON_PLAN_CONTRACT_WEIGHT_GRAD_ORDER_H_
#define VARIPIPE_COMMON_PLAN_CONTRACT_WEIGHT_GRAD_ORDER_H_

#include <optional>

#include "common/plan_contract/contract_violation.h"
#include "varipipe/v1/plan.pb.h"

namespace varipipe::plan_contract {

// The order of split backwards (zero-bubble schedules, ZB-H1 section 2):
// every weight_grad follows a backward with weight_grad_deferred of the same
// stage and micro-batch, exactly one per such backward; none is outstanding
// at an all_reduce or optimizer_step (they read the gradients) or at the
// end of the plan. The first violation in instruction order, or nullopt.
// A plan that ends with one outstanding is reported at its backward.
std::optional<ContractViolation> CheckWeightGradOrder(const v1::ExecutionPlan& plan);

}  // namespace varipipe::plan_contract

#endif  // VARIPIPE_COMMON_PLAN_CONTRACT_WEIGHT_GRAD_ORDER_H_
