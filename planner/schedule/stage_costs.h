// Per-stage costs of each micro-batch: what schedules that look at costs
// (the adaptive schedule) and the simulator need.
#ifndef VARIPIPE_PLANNER_SCHEDULE_STAGE_COSTS_H_
#define VARIPIPE_PLANNER_SCHEDULE_STAGE_COSTS_H_

#include <cstdint>
#include <vector>

#include "planner/cost/stage_cost.h"
#include "planner/schedule/op.h"

namespace varipipe::planner {

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
