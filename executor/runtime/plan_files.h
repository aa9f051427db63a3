// Execution plans from files: the layout varipipe-plan --emit-plans writes,
// DIR/iteration_NNNNNN/rank_NNNNN.json (protobuf JSON of
// varipipe.v1.ExecutionPlan).
#ifndef VARIPIPE_EXECUTOR_RUNTIME_PLAN_FILES_H_
#define VARIPIPE_EXECUTOR_RUNTIME_PLAN_FILES_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "varipipe/v1/plan.pb.h"

namespace varipipe::executor {

std::string PlanFilePath(const std::string& dir, uint64_t iteration, int rank);

// Parses protobuf JSON text of a plan; InvalidArgument naming `source` when
// it does not parse. The plan is not checked (plan_check.h).
absl::StatusOr<v1::ExecutionPlan> ParsePlanJson(absl::string_view text, absl::string_view source);

// NotFound when the file is missing; InvalidArgument naming the file when it
// does not parse or belongs to another rank or iteration.
absl::StatusOr<v1::ExecutionPlan> ReadPlanFile(const std::string& dir, uint64_t iteration,
                                               int rank);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_PLAN_FILES_H_
