// Reading and writing cost models: the project's JSON format
// (varipipe.v1.CostModelFile, proto/varipipe/v1/cost_model.proto), DynaPipe
// profile directories (dynapipe_profile_reader.h), and the model a job uses.
#ifndef VARIPIPE_PLANNER_COST_COST_MODEL_IO_H_
#define VARIPIPE_PLANNER_COST_COST_MODEL_IO_H_

#include <string>

#include "absl/status/statusor.h"
#include "planner/cost/cost_model.h"
#include "varipipe/v1/config.pb.h"
#include "varipipe/v1/cost_model.pb.h"

namespace varipipe::planner {

// Conversions. `source` names the data in errors.
absl::StatusOr<CostModel> CostModelFromProto(const v1::CostModelFile& file,
                                             const std::string& source);
v1::CostModelFile CostModelToProto(const CostModel& model);

// JSON files. Errors name the file (and, for grids, the grid).
absl::StatusOr<CostModel> LoadCostModelJson(const std::string& path);
// Writes atomically (temporary file, then rename).
absl::Status SaveCostModelJson(const CostModel& model, const std::string& path);

// A JSON file, or a directory of DynaPipe profiles.
absl::StatusOr<CostModel> LoadCostModel(const std::string& path);

// The cost model of a validated job: planner.cost_model_path when set,
// otherwise the analytic model for cluster.hardware, with a grid large enough
// for the job's maximum lengths and mini-batch size.
absl::StatusOr<CostModel> CostModelForJob(const v1::JobConfig& config);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_COST_COST_MODEL_IO_H_
