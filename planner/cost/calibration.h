// Online calibration of a profiled cost model (docs/cost-model.md,
// "Calibration"). Executors report the measured forward and backward time
// of every micro-batch on every stage, next to the plan's profiled
// (uncalibrated) prediction of the same pass, and the measured all-reduce
// and optimizer step next to theirs. FoldReport folds them into decayed sums
// per stage; ScalesOf turns the sums into one forward and one backward scale
// per layer kind (the kind of the stages that hold it), which
// CostModel::ScaledTimes applies to the component grids.
//
// Invariants: a state fully determines its scales (plans stay deterministic
// given the state); scales are positive and finite, clamped to
// [kMinScale, kMaxScale]; a kind without observations keeps scale 1 (or
// the other kind's, when only one kind has any).
//
// Thread safety: pure functions.
#ifndef VARIPIPE_PLANNER_COST_CALIBRATION_H_
#define VARIPIPE_PLANNER_COST_CALIBRATION_H_

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "planner/cost/cost_model.h"
#include "planner/cost/memory_model.h"
#include "varipipe/v1/cost_model.pb.h"

namespace varipipe::planner {

// Weight of the sums so far when a stage's next report is folded in: the
// last few iterations count, older ones fade (1 / (1 - 0.7): about three
// reports per stage).
inline constexpr double kCalibrationDecay = 0.7;
inline constexpr double kMinScale = 1e-3;
inline constexpr double kMaxScale = 1e4;

// One pass pair of one micro-batch on one stage, as an executor reports it.
struct PassTiming {
  uint32_t stage = 0;
  double measured_forward_ms = 0;
  double measured_backward_ms = 0;
  double profiled_forward_ms = 0;  // 0: the plan had no prediction
  double profiled_backward_ms = 0;
};

// One rank's report of one iteration.
struct CalibrationReport {
  uint64_t iteration = 0;
  std::span<const PassTiming> passes;
  double measured_all_reduce_ms = 0;
  double measured_optimizer_ms = 0;
  double profiled_all_reduce_ms = 0;
  double profiled_optimizer_ms = 0;
  // Rank 0's whole iteration (0 on other ranks: not folded), and its plan's
  // predicted iteration, the overhead included in it and the calibration
  // version it was planned with. Only plans made with a calibrated model
  // (version > 0) teach the overhead: an uncalibrated plan's residual is
  // mostly the profile's error, which the pass scales correct.
  double measured_iteration_ms = 0;
  double predicted_iteration_ms = 0;
  double predicted_overhead_ms = 0;
  uint64_t plan_calibration_version = 0;
};

// Folds `report` into `state` and bumps its version. False (state
// unchanged) when there is nothing to learn: iteration 0 (warm-up:
// allocations, connections), or no profiled predictions and no whole
// iteration.
bool FoldReport(const CalibrationReport& report, v1::CalibrationState* state);

struct CalibrationScales {
  // Per Component (cost_model.h).
  std::array<double, kNumComponents> forward{1, 1, 1, 1, 1};
  std::array<double, kNumComponents> backward{1, 1, 1, 1, 1};
  double optimizer = 1;
  // Per-iteration time outside passes, transfers and update, added to the
  // predicted iteration (never to a pass: it does not change which plan
  // wins). May be negative when the simulation overestimates.
  double overhead_ms = 0;
  // "forward x1.93, backward x2.10, optimizer x0.90, overhead +12.5 ms"
  std::string Describe(bool encoder_decoder) const;
};

// Scales of `state` for a model split as `layout` into `layout.devices *
// chunks` stages (looped placement; T5: the first encoder_devices * chunks
// stage ids hold the encoder). GPT: one kind, every component scaled alike.
// T5: encoder layers (and the shared embedding) by the encoder stages'
// sums, decoder layers and the LM head by the decoder stages'. The
// optimizer by its own sums; the all-reduce is not scaled: an executor's
// all-reduce time includes waiting for the slower replicas, which the
// predicted makespan (the slowest replica's) already covers.
CalibrationScales ScalesOf(const v1::CalibrationState& state, const StageLayout& layout,
                           uint32_t chunks = 1);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_COST_CALIBRATION_H_
