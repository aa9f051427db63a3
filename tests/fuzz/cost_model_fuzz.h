// Shared by the cost-model fuzz targets: what the planner does with a cost
// model it loaded. Lookups on every grid (at, between and beyond the grid
// points), the JSON round trip, and, when the model fits one of the plan
// configs (plan_configs/), planning a fixed mini-batch with it and checking
// the plans as an executor would.
#ifndef VARIPIPE_TESTS_FUZZ_COST_MODEL_FUZZ_H_
#define VARIPIPE_TESTS_FUZZ_COST_MODEL_FUZZ_H_

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "planner/cost/cost_model.h"
#include "planner/cost/cost_model_io.h"
#include "planner/cost/model_dims.h"
#include "planner/planner.h"
#include "tests/fuzz/plan_fuzz.h"

namespace varipipe::fuzz {

inline void Require(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "invariant violated: %s\n", what);
    std::abort();
  }
}

// Lookups at every axis point, the midpoints, below and beyond the axes.
inline void LookUpEverywhere(const planner::ProfileGrid& grid) {
  const auto probes = [](const std::vector<uint32_t>& axis) {
    std::vector<double> xs = {0, 0.5, double(axis.back()) + 1};
    for (size_t i = 0; i < axis.size(); ++i) {
      xs.push_back(axis[i]);
      if (i + 1 < axis.size()) xs.push_back((double(axis[i]) + axis[i + 1]) / 2);
    }
    return xs;
  };
  const std::vector<double> encoder =
      grid.three_d() ? probes(grid.encoder_seq_lens()) : std::vector<double>{0};
  planner::CostValues v;
  for (double e : encoder) {
    for (double s : probes(grid.seq_lens())) {
      planner::ProfileGrid::BatchRow row;
      const bool has_row = grid.Row(s, e, &row);
      for (double b : probes(grid.micro_batch_sizes())) {
        const bool found = grid.Lookup(b, s, e, &v);
        planner::CostValues from_row;
        Require(!has_row || row.Lookup(b, &from_row) == found, "Row and Lookup agree");
        planner::ProfileGrid::BatchPosition position;
        if (has_row && b == static_cast<uint32_t>(b) &&
            grid.LocateBatch(static_cast<uint32_t>(b), &position)) {
          row.Lookup(position, &from_row);
        }
      }
    }
  }
}

// A small mini-batch of GPT or T5 samples within the plan configs' limits.
inline planner::MiniBatch FuzzMiniBatch() {
  planner::MiniBatch mb;
  const SampleLengths lengths[] = {{200, 20}, {120, 8}, {60, 40}, {30, 2}, {90, 16}, {16, 16}};
  for (uint64_t i = 0; i < std::size(lengths); ++i) {
    mb.sample_ids.push_back(i);
    mb.lengths.push_back(lengths[i]);
  }
  return mb;
}

inline void ExerciseCostModel(const planner::CostModel& model) {
  for (const auto& [key, grid] : model.grids()) LookUpEverywhere(grid);
  absl::StatusOr<planner::CostModel> again =
      planner::CostModelFromProto(planner::CostModelToProto(model), "round trip");
  Require(again.ok(), "a loaded cost model converts to its JSON form and back");
  for (const v1::JobConfig& config : PlanConfigs()) {
    const planner::ModelDims dims = planner::ModelDimsFromConfig(config.model());
    if (!model.CheckUsable(dims.kind, 1).ok() || !model.CheckMatches(dims).ok()) continue;
    const planner::Planner planner(config, model, {.threads = 1});
    absl::StatusOr<planner::PlanningResult> result = planner.Plan(FuzzMiniBatch());
    if (!result.ok()) continue;
    for (const v1::ExecutionPlan& plan : result->plans) {
      const int pipeline = static_cast<int>(config.parallelism().pipeline());
      const absl::Status checked = executor::CheckPlan(plan, config,
                                                       {.iteration = 0,
                                                        .rank = plan.rank(),
                                                        .dp_rank = plan.rank() / pipeline,
                                                        .pp_rank = plan.rank() % pipeline});
      if (!checked.ok()) {
        std::fprintf(stderr, "%s\n", std::string(checked.message()).c_str());
        Require(false, "the planner's plans pass the executor's check");
      }
    }
  }
}

}  // namespace varipipe::fuzz

#endif  // VARIPIPE_TESTS_FUZZ_COST_MODEL_FUZZ_H_
