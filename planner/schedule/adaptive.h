// DynaPipe's memory-aware adaptive schedule (section 5, Algorithm 1). The
// micro-batch ordering search around it is planner/sim/order_search.h. The
// adaptive zero-bubble schedule (ADAPTIVE_ZERO_BUBBLE) is this order with
// split backwards, each device filling its idle time with deferred weight
// gradients under its memory limit: planner/sim/weight_fill.h (it needs the
// simulator's timing), searched over the same injection orders.
//
// Cyclic scheduling with injection control: time advances in cycles; in
// each cycle every device runs at most one backward (first) and one forward
// from its ready buffers. Micro-batches enter the pipeline through device
// 0's forward buffer in the injection order. A forward whose activation
// would push the device over its memory limit is skipped this cycle (it
// waits for backwards to free memory); a device holding nothing always
// accepts one, so the schedule finishes whenever one micro-batch alone fits.
// Ops unlocked in a cycle become ready in the next. The result is only an
// order per device: the simulator replays it wait-free (no cycle barriers).
//
// Memory check: a forward is admitted when the device's stored activation,
// including the new micro-batch's, plus the largest transient (peak -
// stored) of the micro-batches it then holds stays within the limit. Until
// its next admission the device runs only backwards of those, on no more
// than it holds now, so no op pushes it past the limit (the quantity the
// simulator reports as peak); a transient of a micro-batch not yet admitted
// is reserved only when it is. What a device holds counts the buffers it
// sends (memory_ledger.h): a forward's output sent on, until its backward,
// and every input gradient it sent, until the end of the iteration.
#ifndef VARIPIPE_PLANNER_SCHEDULE_ADAPTIVE_H_
#define VARIPIPE_PLANNER_SCHEDULE_ADAPTIVE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/schedule/op.h"
#include "planner/schedule/stage_costs.h"

namespace varipipe::planner {

// REQUIRES: shape.chunks == 1; injection_order a permutation of the
// micro-batches; costs[stage][micro_batch].
// `memory_limit_bytes[d]`: device d's own activation room (per-device
// memory); the scalar form gives every device the same.
absl::StatusOr<DeviceOrder> AdaptiveSchedule(const PipelineShape& shape,
                                             const StageCostTable& costs,
                                             std::span<const uint32_t> injection_order,
                                             std::span<const double> memory_limit_bytes);
absl::StatusOr<DeviceOrder> AdaptiveSchedule(const PipelineShape& shape,
                                             const StageCostTable& costs,
                                             std::span<const uint32_t> injection_order,
                                             double memory_limit_bytes);

// Cluster labels (0..k-1, ordered by centre) of `values`, 1-D k-means with
// centres seeded at evenly spaced quantiles. Exposed for tests.
std::vector<int> ClusterByValue(std::span<const double> values, int clusters);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_SCHEDULE_ADAPTIVE_H_
