// Cost models in the project's JSON format (varipipe.v1.CostModelFile:
// planner.cost_model_path, varipipe-plan --cost-model), loaded from a file
// and used as the planner uses them.
#include <cstddef>
#include <cstdint>

#include "planner/cost/cost_model_io.h"
#include "tests/fuzz/cost_model_fuzz.h"
#include "tests/fuzz/fuzz_scratch.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = varipipe::fuzz::Scratch::Write("cost_model.json", data, size);
  absl::StatusOr<varipipe::planner::CostModel> model = varipipe::planner::LoadCostModelJson(path);
  if (!model.ok()) return 0;
  varipipe::fuzz::ExerciseCostModel(*model);
  return 0;
}
