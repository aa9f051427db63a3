#include "executor/runtime/plan_files.h"

#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/util/json_util.h"

namespace varipipe::executor {

std::string PlanFilePath(const std::string& dir, uint64_t iteration, int rank) {
  return absl::StrFormat("%s/iteration_%06d/rank_%05d.json", dir, iteration, rank);
}

absl::StatusOr<v1::ExecutionPlan> ParsePlanJson(absl::string_view text, absl::string_view source) {
  v1::ExecutionPlan plan;
  const auto status =
      google::protobuf::util::JsonStringToMessage({text.data(), text.size()}, &plan);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not a varipipe.v1.ExecutionPlan: ", status.message().as_string()));
  }
  return plan;
}

absl::StatusOr<v1::ExecutionPlan> ReadPlanFile(const std::string& dir, uint64_t iteration,
                                               int rank) {
  const std::string path = PlanFilePath(dir, iteration, rank);
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the plan file"));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<v1::ExecutionPlan> parsed = ParsePlanJson(text.str(), path);
  if (!parsed.ok()) return parsed.status();
  v1::ExecutionPlan& plan = *parsed;
  if (plan.rank() != rank || plan.iteration() != iteration) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": holds the plan of rank ", plan.rank(),
                                                   " iteration ", plan.iteration()));
  }
  return parsed;
}

}  // namespace varipipe::executor
