// Zero-bubble filling: turns a device order of forwards and whole backwards
// into one of forwards, split backwards (B: input gradient) and their
// weight-gradient ops (W), deferring each W into its device's idle time
// under the device's memory limit (op.h, stage_costs.h).
//
// A timed greedy over the simulator's model (simulator.h): the F and B ops
// keep their order on every device; whenever a device is free and its next
// F or B is expected to wait for its input for at least half of the oldest
// pending W's time, it runs that W instead. Expected: the input's arrival
// when known; when its producer is the next op of its own device and can
// start, that op's end plus the transfer; otherwise unbounded. A deferred W holds the
// bytes B kept for it (weight_stored_bytes), so a W also runs first when
// the next op would not fit: before a forward, when the device's memory
// plus the forward's stored bytes plus the largest transient of the
// micro-batches it then holds exceeds the limit (the adaptive schedule's
// admission test, adaptive.h); before a B, when memory plus its transient
// (split: plus what it keeps beyond its stored bytes,
// split_backward_extra_bytes), or what the device holds after it (its
// W-kept bytes instead of its stored ones), does. A B whose W-kept bytes do not fit even with no W
// pending stays whole (no W; under full recomputation W keeps more than the
// forward stored). What remains pending runs after the device's last B.
// Deferring never pushes a device above its limit when the unsplit order
// fits (each W only frees memory, and a B splits only when its keep fits).
// What a device holds counts the buffers it sends (memory_ledger.h): an
// output sent on, until its backward, and each input gradient sent, until
// the end of the iteration.
//
// The adaptive zero-bubble schedule is AdaptiveSchedule (DynaPipe
// Algorithm 1) followed by this fill, inside the ordering search
// (order_search.h).
#ifndef VARIPIPE_PLANNER_SIM_WEIGHT_FILL_H_
#define VARIPIPE_PLANNER_SIM_WEIGHT_FILL_H_

#include <optional>
#include <span>

#include "absl/status/statusor.h"
#include "planner/schedule/op.h"
#include "planner/schedule/stage_costs.h"
#include "planner/sim/simulator.h"

namespace varipipe::planner {

// REQUIRES: `order` holds every F and B once and no W (CheckScheduleCoverage)
// and completes; costs carry weight_ms and weight_stored_bytes
// (BackwardSplitRule::Split); one limit per device.
absl::StatusOr<DeviceOrder> FillWeightGradients(const PipelineShape& shape,
                                                const DeviceOrder& order,
                                                const StageCostTable& costs,
                                                const ClusterNetwork& network,
                                                std::span<const double> memory_limit_bytes);

// The fill with a makespan limit: std::nullopt as soon as the filled
// order's simulated makespan is sure to exceed `makespan_limit_ms` (as
// Simulate's limit, with the same margin). The fill's own timeline is the
// simulator's timeline of the order it returns: every device runs its ops
// in order from the later of its input's arrival and its previous op's end,
// and each channel carries one device's outputs in that device's order, so
// every start time is a function of the order alone. A device's clock plus
// the durations of its F, B and pending W still to run is therefore a lower
// bound of the makespan. The order search (order_search.h) gives up on an
// order that cannot beat the best one found.
absl::StatusOr<std::optional<DeviceOrder>> FillWeightGradientsWithin(
    const PipelineShape& shape, const DeviceOrder& order, const StageCostTable& costs,
    const ClusterNetwork& network, std::span<const double> memory_limit_bytes,
    double makespan_limit_ms);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_SIM_WEIGHT_FILL_H_
