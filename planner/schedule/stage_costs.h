// Per-stage costs of each micro-batch: what schedules that look at costs
// (the adaptive schedule) and the simulator need.
#ifndef VARIPIPE_PLANNER_SCHEDULE_STAGE_COSTS_H_
#define VARIPIPE_PLANNER_SCHEDULE_STAGE_COSTS_H_

#include <cstdint>
#include <vector>

#include "planner/schedule/op.h"

namespace varipipe::planner {

// Costs of one stage (model chunk) for one micro-batch.
struct StageOpCost {
  double forward_ms = 0;
  double backward_ms = 0;
  double stored_bytes = 0;
  double peak_bytes = 0;
  // Bytes of the forward output sent to the next stage, and of the input
  // gradient sent to the previous stage.
  double activation_bytes = 0;
  double gradient_bytes = 0;
  // Split backward (op.h): W's time (B then takes backward_ms - weight_ms)
  // and the bytes B keeps for W (the linear layers' inputs and output
  // gradients), held from B's end to W's end. Set by
  // BackwardSplitRule::Split (planner/schedule/backward_split.h).
  double weight_ms = 0;
  double weight_stored_bytes = 0;

  double input_grad_ms() const { return backward_ms - weight_ms; }
  // What a split B holds beyond its forward's stored bytes at its peak: the
  // kept pairs build up layer by layer while the transient of the layer
  // being differentiated is live, and only the part beyond what the forward
  // stored is new (full recomputation: almost all of it; otherwise the
  // stored activations freed as B proceeds cover it).
  double split_backward_extra_bytes() const {
    return weight_stored_bytes > stored_bytes ? weight_stored_bytes - stored_bytes : 0;
  }
};

// costs[stage][micro_batch].
using StageCostTable = std::vector<std::vector<StageOpCost>>;

// The transfer buffers an op of `stage` leaves on its device, which the
// communication plan keeps alive (planner/sim/memory_ledger.h): a forward's
// output sent to the next stage's device, until the backward of the same
// stage and micro-batch starts; a backward's input gradient sent to the
// previous stage's device, until the end of the iteration. 0 where the
// neighbouring stage shares the device or does not exist.
inline double SentOutputBytes(const PipelineShape& shape, const StageCostTable& costs,
                              uint32_t stage, uint32_t micro_batch) {
  return stage + 1 < shape.stages() && shape.DeviceOf(stage + 1) != shape.DeviceOf(stage)
             ? costs[stage][micro_batch].activation_bytes
             : 0.0;
}
inline double SentGradientBytes(const PipelineShape& shape, const StageCostTable& costs,
                                uint32_t stage, uint32_t micro_batch) {
  return stage > 0 && shape.DeviceOf(stage - 1) != shape.DeviceOf(stage)
             ? costs[stage][micro_batch].gradient_bytes
             : 0.0;
}

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_SCHEDULE_STAGE_COSTS_H_
