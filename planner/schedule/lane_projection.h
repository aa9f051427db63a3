// Context parallelism: one schedule over a context group's slots
// (planner/microbatch/context_placement.h) becomes every lane's order. The
// schedule treats slot i as micro-batch i of a pipeline of slots; lane k's
// order replaces each op of slot i by the same op of the micro-batch lane
// k runs in slot i (its whole one, or the slot's split one) and drops the
// ops of slots where lane k runs nothing. Every lane's order thus holds the
// split micro-batches' ops in the schedule's relative order on every device.
#ifndef VARIPIPE_PLANNER_SCHEDULE_LANE_PROJECTION_H_
#define VARIPIPE_PLANNER_SCHEDULE_LANE_PROJECTION_H_

#include <cstdint>
#include <span>

#include "planner/microbatch/context_placement.h"
#include "planner/schedule/op.h"
#include "planner/schedule/stage_costs.h"

namespace varipipe::planner {

// Lane `lane`'s order, over the group's micro-batch ids. REQUIRES: every op
// of `slot_order` names a slot index below slots.size().
DeviceOrder ProjectOntoLane(const DeviceOrder& slot_order, std::span<const ContextSlot> slots,
                            uint32_t lane);

// The slots' costs for the schedule ([stage][slot]): per stage, each field
// of StageOpCost the largest over the slot's micro-batches (what the
// slowest, fullest lane of the slot does). `costs` is [stage][micro-batch]
// with each micro-batch's costs as it runs (split or whole).
StageCostTable SlotCosts(const StageCostTable& costs, std::span<const ContextSlot> slots);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_SCHEDULE_LANE_PROJECTION_H_
