// The micro-batch ordering search for the adaptive schedule (DynaPipe
// section 5, "Micro-batch ordering").
#ifndef VARIPIPE_PLANNER_SIM_ORDER_SEARCH_H_
#define VARIPIPE_PLANNER_SIM_ORDER_SEARCH_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/schedule/adaptive.h"
#include "planner/sim/simulator.h"

namespace varipipe::planner {

struct AdaptiveSearchResult {
  std::vector<uint32_t> injection_order;
  DeviceOrder order;
  SimulationResult simulation;
  int orders_tried = 0;
  bool fits_memory = false;  // simulated peak within the limit
};

// The micro-batch ordering search: micro-batches are clustered by
// `times_ms` (their predicted times; 1-D k-means with quantile seeding, 3
// clusters above 20 micro-batches, else 4; deterministic), every
// permutation of the cluster order is tried (members keep their relative
// order) plus the given order, each is scheduled and simulated, and the
// smallest makespan whose peak memory fits wins (if none fits: the smallest
// peak).
// `memory_limit_bytes[d]`: device d's own room; a simulation fits when
// every device's peak is within its own limit (the scalar form: one limit
// for all). `zero_bubble`: the adaptive zero-bubble schedule, every
// order's schedule filled with deferred weight gradients
// (FillWeightGradients, weight_fill.h; costs need BackwardSplitRule::Split).
absl::StatusOr<AdaptiveSearchResult> SearchAdaptiveOrder(const PipelineShape& shape,
                                                         const StageCostTable& costs,
                                                         std::span<const double> times_ms,
                                                         std::span<const double> memory_limit_bytes,
                                                         const ClusterNetwork& network,
                                                         bool zero_bubble = false);

// The orders the search tries, each with its adaptive schedule before any
// weight-gradient fill: they depend on the costs, times and limits only,
// so the adaptive and adaptive zero-bubble searches over the same
// micro-batches can share them (the planner does).
struct AdaptiveOrders {
  std::vector<std::vector<uint32_t>> injections;
  std::vector<DeviceOrder> schedules;  // [k]: AdaptiveSchedule of injections[k]
};
absl::StatusOr<AdaptiveOrders> BuildAdaptiveOrders(const PipelineShape& shape,
                                                   const StageCostTable& costs,
                                                   std::span<const double> times_ms,
                                                   std::span<const double> memory_limit_bytes);
// SearchAdaptiveOrder over orders built by BuildAdaptiveOrders for the same
// shape, costs, times and limits: the same result.
absl::StatusOr<AdaptiveSearchResult> SearchAdaptiveOrder(
    const PipelineShape& shape, const StageCostTable& costs, const AdaptiveOrders& orders,
    std::span<const double> memory_limit_bytes, const ClusterNetwork& network, bool zero_bubble);
absl::StatusOr<AdaptiveSearchResult> SearchAdaptiveOrder(
    const PipelineShape& shape, const StageCostTable& costs, std::span<const double> times_ms,
    double memory_limit_bytes, const ClusterNetwork& network, bool zero_bubble = false);

// How far the worst device's simulated peak is over its limit: max over
// devices of peak / limit (<= 1 fits).
double PeakOverLimit(std::span<const double> peak_bytes, std::span<const double> limit_bytes);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_SIM_ORDER_SEARCH_H_
