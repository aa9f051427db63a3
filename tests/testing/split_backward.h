// Split backwards (zero-bubble schedules) in test plans: counting them, and
// the same plan with every backward whole, which runs the same forwards,
// transfers and input gradients with the combined backward.
#ifndef VARIPIPE_TESTS_TESTING_SPLIT_BACKWARD_H_
#define VARIPIPE_TESTS_TESTING_SPLIT_BACKWARD_H_

#include <vector>

#include "varipipe/v1/plan.pb.h"

namespace varipipe::testing {

// Backwards with weight_grad_deferred in `plans`.
int SplitBackwards(const std::vector<v1::ExecutionPlan>& plans);

// `plan` with weight_grad_deferred cleared and the weight_grad
// instructions removed.
v1::ExecutionPlan WithWholeBackwards(const v1::ExecutionPlan& plan);

}  // namespace varipipe::testing

#endif  // VARIPIPE_TESTS_TESTING_SPLIT_BACKWARD_H_
