// The planner's entry point: one mini-batch and the job's config in,
// one ExecutionPlan per rank plus a report out.
//
//   absl::StatusOr<Planner> planner = Planner::Create(config);
//   absl::StatusOr<PlanningResult> r = planner->Plan(mini_batch);
//
// Search (DynaPipe sections 4-6), one function per phase in planner.cc:
//   1. micro-batching: per partition method and setting (a baseline's
//      setting is tuned per mini-batch over a ladder unless the config fixes
//      it: baseline_settings.h), one PlanMicroBatches over every (recompute
//      mode, memory budget) pair, sharing run tables and the cross-pair
//      bound; each device's budget is its own room (limit minus its own
//      model state);
//   2. scheduling and simulation: every (method setting, mode, schedule)
//      candidate whose pair has a partition gets a makespan lower bound
//      from its stage costs (pipeline fill, busiest device, drain) and is
//      scheduled and simulated per data-parallel replica in increasing
//      order of that bound, until the bound exceeds the best makespan that
//      fits; it fits when every device's simulated peak is within that
//      device's room;
//   3. choice: the smallest simulated makespan that fits, which is the
//      smallest predicted iteration (the update and overhead are the same
//      for every candidate). Pairs the DP proved slower (by its objective)
//      are scheduled only when nothing fits: they are then solved to their
//      optimum and tried in turn;
//   4. lowering: communication plans and one ExecutionPlan per rank;
//   5. validation (planner/plan/validator.h).
// The per-replica work of phases 2, 4 and 5 runs on `threads` threads
// (planner.threads); plans are byte-identical for any thread count.
//
// Thread safety: Plan() is const and may run concurrently.
#ifndef VARIPIPE_PLANNER_PLANNER_H_
#define VARIPIPE_PLANNER_PLANNER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/layer_layout.h"
#include "common/dataset/synthetic_mixture.h"
#include "planner/cost/calibration.h"
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
  // The baseline's setting ("rows=8", "tokens=8192"; empty for the DP).
  std::string setting;
  std::string schedule;
  std::string recompute;
  // The micro-batching's memory budget ("pipeline-depth": each micro-batch
  // within room / depth; "whole-device"): static schedules are tried on
  // both partitions, adaptive ones on the whole-device one.
  std::string budget;
  bool feasible = false;
  // Where it was rejected ("micro-batching", "scheduling", "memory", or
  // "bound": it cannot beat a plan that fits, so it was not simulated) and
  // why; empty when feasible.
  std::string rejected_at;
  std::string reason;
  double dp_objective_ms = 0;  // the micro-batching objective (a bound when pruned)
  double makespan_ms = 0;
  // No schedule of its micro-batches is shorter (fill, busiest device,
  // drain); candidates are simulated in increasing order of it.
  double makespan_bound_ms = 0;
  double bubble_fraction = 0;  // mean over devices and replicas
  // The most compute (busy time) of any device: no schedule over these
  // micro-batches, recompute mode and stage split has a shorter makespan.
  double busiest_device_ms = 0;
  double peak_bytes = 0;  // largest device peak
  int micro_batches = 0;
  double padding_efficiency = 0;
  // Context parallelism: micro-batches split across their context group
  // (all replicas; the rest run whole on one lane).
  int split_micro_batches = 0;
};

struct PlanReport {
  std::string partition_method;
  std::string setting;  // the baseline's setting, as CandidateReport::setting
  std::string schedule;
  std::string recompute;
  // The pipeline makespan plus the slowest device's all-reduce and
  // optimizer step (calibrated), plus the calibrated overhead.
  double predicted_iteration_ms = 0;
  double predicted_makespan_ms = 0;
  double predicted_update_ms = 0;
  double predicted_overhead_ms = 0;
  uint64_t calibration_version = 0;
  double bubble_fraction = 0;
  // The busiest device's compute: the makespan's lower bound for the chosen
  // micro-batches, recompute mode and stage split, whatever the schedule.
  double busiest_device_ms = 0;
  std::vector<double> peak_bytes;             // per rank
  double memory_limit_bytes = 0;              // the smallest device's activation room
  std::vector<double> memory_limit_per_rank;  // each rank's own room
  double padding_efficiency = 0;
  double input_padding_efficiency = 0;
  double target_padding_efficiency = 0;
  int micro_batches = 0;
  uint64_t real_tokens = 0;
  // Context parallelism (parallelism.context c; 1 without): how many
  // micro-batches are split across their context group, and per (replica,
  // lane), at index dp_rank x c + lane, the lane's predicted compute: the
  // forward and backward times, over its stages, of the split micro-batches
  // (the slowest lane's) and of its own whole ones.
  uint32_t context_parallel = 1;
  int split_micro_batches = 0;
  std::vector<double> lane_compute_ms;
  // Micro-batches that run under a more recomputing mode than `recompute`
  // because they fit only so (PlannerConfig.uniform_recompute false).
  int raised_recompute_micro_batches = 0;
  std::vector<CandidateReport> candidates;
  // Planning time per phase, milliseconds.
  double micro_batching_ms = 0;
  double scheduling_ms = 0;
  double plan_building_ms = 0;
  double validation_ms = 0;
  double total_ms = 0;
  int threads = 1;
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
    // Context parallelism: split across the group (input_len then is the
    // lanes' padded local count A, rows 1), or whole on `lane`.
    bool split = false;
    uint32_t lane = 0;
    // Its recompute mode ("none", "selective", "full"): the iteration's, or
    // a more recomputing one it alone needs (MicroBatch.recompute).
    std::string recompute;
  };
  std::vector<MicroBatchShape> micro_batch_shapes;
};

struct PlanningResult {
  std::vector<v1::ExecutionPlan> plans;  // by rank
  PlanReport report;
};

struct PlannerOptions {
  // Threads for the per-replica work of one iteration (1: the caller's).
  int threads = 1;
  // Off: every (mode, budget) pair is solved to its optimum and scheduled
  // (the per-pair path, for tests and benchmarks).
  bool share_micro_batching_bound = true;
  // Off: every device gets the smallest device's room (the common budget).
  bool per_device_memory = true;
  // Candidates whose makespan bound is above a makespan that fits are not
  // simulated (rejected at "bound"). Off: every candidate is simulated
  // (varipipe-plan --compare). The plan is the same either way.
  bool prune_by_bound = true;
  // What-if (varipipe-plan --ideal_context_split): a split micro-batch's
  // lanes each take 1/c of the micro-batch's time on one device, with no
  // transfers (ContextSplitOptions::ideal): the most that the split costs
  // leave for any split-or-whole choice to win. Never for plans that train.
  bool ideal_context_split = false;
};

// planner.threads of a config: 0 means one less than the cores, at least 1.
int PlannerThreads(const v1::JobConfig& config);

class Planner {
 public:
  // REQUIRES: a validated config (defaults applied). Builds or loads the
  // job's cost model; threads from planner.threads.
  static absl::StatusOr<Planner> Create(const v1::JobConfig& config);
  Planner(v1::JobConfig config, CostModel model, PlannerOptions options = {});

  // The same planner with `state` applied to the profiled cost model
  // (calibration.h): times scaled per layer kind, the all-reduce and the
  // optimizer step by theirs. Plans record state.version.
  Planner WithCalibration(const v1::CalibrationState& state) const;

  // The same job with its stages holding `layers` (an AUTO job's choice,
  // planner/layout/stage_layout_search.h): the config's
  // parallelism.stage_layout becomes that layout, mode LISTED, so plans,
  // costs and memory all read it. REQUIRES: `layers` fits the model
  // (Plan fails naming it otherwise).
  Planner WithStageLayout(const LayerLayout& layers) const;

  // On failure, *failure_report (when given) receives every candidate and
  // why it was rejected.
  absl::StatusOr<PlanningResult> Plan(const MiniBatch& mini_batch, bool with_trace = false,
                                      PlanReport* failure_report = nullptr) const;

  const v1::JobConfig& config() const { return config_; }
  // The model plans are made with (calibrated), and the profiled one.
  const CostModel& cost_model() const { return model_; }
  const CostModel& profiled_cost_model() const { return *profiled_; }
  const v1::CalibrationState& calibration() const { return calibration_; }
  const CalibrationScales& calibration_scales() const { return scales_; }
  const PlannerOptions& options() const { return options_; }
  void set_options(const PlannerOptions& options) { options_ = options; }

 private:
  v1::JobConfig config_;
  CostModel model_;
  std::shared_ptr<const CostModel> profiled_;
  PlannerOptions options_;
  v1::CalibrationState calibration_;
  CalibrationScales scales_;
};

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_PLANNER_H_
