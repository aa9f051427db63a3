// The planner's entry point: one mini-batch and the job's config in,
// one ExecutionPlan per rank plus a report out.
//
//   absl::StatusOr<Planner> planner = Planner::Create(config);
//   absl::StatusOr<PlanningResult> r = planner->Plan(mini_batch);
//
// Search (DynaPipe sections 4-6): for every allowed partition method,
// recompute mode and schedule, the mini-batch is split into micro-batches
// (under the memory budget the schedule implies), balanced over the
// data-parallel replicas, scheduled and simulated; the candidate with the
// smallest simulated makespan whose peak memory fits wins. Its timeline is
// lowered to communication and execution plans, which are validated
// (planner/plan/validator.h) before they are returned.
//
// Thread safety: Plan() is const and may run concurrently.
#ifndef VARIPIPE_PLANNER_PLANNER_H_
#define VARIPIPE_PLANNER_PLANNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dataset/synthetic_mixture.h"
#include "planner/cost/cost_model.h"
#include "varipipe/v1/config.pb.h"
#include "varipipe/v1/plan.pb.h"

namespace varipipe::planner {

struct MiniBatch {
  uint64_t iteration = 0;
  std::vector<uint64_t> sample_ids;    // dataset ids
  std::vector<SampleLengths> lengths;  // parallel to sample_ids
};

struct CandidateReport {
  std::string partition_method;
  std::string schedule;
  std::string recompute;
  bool feasible = false;
  std::string reason;  // why infeasible, or empty
  double makespan_ms = 0;
  double bubble_fraction = 0;  // mean over devices and replicas
  double peak_bytes = 0;       // largest device peak
  int micro_batches = 0;
  double padding_efficiency = 0;
};

struct PlanReport {
  std::string partition_method;
  std::string schedule;
  std::string recompute;
  double predicted_iteration_ms = 0;
  double bubble_fraction = 0;
  std::vector<double> peak_bytes;  // per rank
  double memory_limit_bytes = 0;   // activation memory per device
  double padding_efficiency = 0;
  double input_padding_efficiency = 0;
  double target_padding_efficiency = 0;
  int micro_batches = 0;
  uint64_t real_tokens = 0;
  std::vector<CandidateReport> candidates;
  // Planning time per phase, milliseconds.
  double micro_batching_ms = 0;
  double scheduling_ms = 0;
  double plan_building_ms = 0;
  double validation_ms = 0;
  double total_ms = 0;
  // Chrome trace of data-parallel replica 0 (when asked for).
  std::string chrome_trace;
  // Micro-batches per replica: sample ids and padded shapes.
  struct MicroBatchShape {
    uint32_t dp_rank = 0;
    std::vector<uint64_t> sample_ids;
    uint32_t rows = 0;
    uint32_t input_len = 0;
    uint32_t target_len = 0;
    double predicted_ms = 0;
  };
  std::vector<MicroBatchShape> micro_batch_shapes;
};

struct PlanningResult {
  std::vector<v1::ExecutionPlan> plans;  // by rank
  PlanReport report;
};

class Planner {
 public:
  // REQUIRES: a validated config (defaults applied). Builds or loads the
  // job's cost model.
  static absl::StatusOr<Planner> Create(const v1::JobConfig& config);
  Planner(v1::JobConfig config, CostModel model);

  absl::StatusOr<PlanningResult> Plan(const MiniBatch& mini_batch, bool with_trace = false) const;

  const v1::JobConfig& config() const { return config_; }
  const CostModel& cost_model() const { return model_; }

 private:
  v1::JobConfig config_;
  CostModel model_;
};

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_PLANNER_H_
