#include "tests/testing/split_backward.h"

namespace varipipe::testing {

int SplitBackwards(const std::vector<v1::ExecutionPlan>& plans) {
  int count = 0;
  for (const v1::ExecutionPlan& plan : plans) {
    for (const v1::Instruction& in : plan.instructions()) {
      if (in.has_backward() && in.backward().weight_grad_deferred()) ++count;
    }
  }
  return count;
}

v1::ExecutionPlan WithWholeBackwards(const v1::ExecutionPlan& plan) {
  v1::ExecutionPlan whole = plan;
  whole.clear_instructions();
  for (const v1::Instruction& in : plan.instructions()) {
    if (in.has_weight_grad()) continue;
    v1::Instruction* copy = whole.add_instructions();
    *copy = in;
    if (copy->has_backward()) copy->mutable_backward()->set_weight_grad_deferred(false);
  }
  return whole;
}

}  // namespace varipipe::testing
