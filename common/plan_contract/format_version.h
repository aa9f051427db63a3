#ifndef VARIPIPE_COMMON_PLAN_CONTRACT_FORMAT_VERSION_H_
#define VARIPIPE_COMMON_PLAN_CONTRACT_FORMAT_VERSION_H_

#include <optional>

#include "common/plan_contract/contract_violation.h"
#include "varipipe/v1/plan.pb.h"

namespace varipipe::plan_contract {

// The plan format the planner writes and the executor runs
// (docs/plan_format.md).
inline constexpr v1::PlanFormat kPlanFormatVersion = v1::PLAN_FORMAT_V1;

// A violation naming the plan's format_version when it is not
// kPlanFormatVersion.
std::optional<ContractViolation> CheckFormatVersion(const v1::ExecutionPlan& plan);

}  // namespace varipipe::plan_contract

#endif  // VARIPIPE_COMMON_PLAN_CONTRACT_FORMAT_VERSION_H_
