#include "common/plan_contract/format_version.h"

#include "absl/strings/str_cat.h"

namespace varipipe::plan_contract {

std::optional<ContractViolation> CheckFormatVersion(const v1::ExecutionPlan& plan) {
  if (plan.format_version() == kPlanFormatVersion) return std::nullopt;
  return ContractViolation{.instruction = -1,
                           .field = "format_version",
                           .problem = absl::StrCat("is ", plan.format_version(), " (expected ",
                                                   static_cast<int>(kPlanFormatVersion), ")")};
}

}  // namespace varipipe::plan_contract
